"""Resuming from a checkpoint: ``ckpt_path=last`` (the newest checkpoint this run's output directory holds,
whoever wrote it), and what a checkpoint may hold when it is loaded.

A checkpoint is loaded with ``torch.load(weights_only=True)``: tensors and plain containers only, which is all
feedline's checkpoints hold (the data config is saved as plain containers, ``datamodules/checkpoint/parts.py``). Any other
type in a pickle names code to run on load, so a checkpoint from elsewhere could run anything; such a type is
refused by name unless the run allows it, ``ckpt_safe_types=[module.Type]`` (a file you trust).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import logging
import os
import pickle
import re
import warnings

from lightning.fabric.utilities.rank_zero import rank_zero_only

log = logging.getLogger(__name__)


def resolve_ckpt_path(value: str | None, output_dir: str) -> str | None:
    """``last`` -> the newest of ``<output_dir>/checkpoints/last*.ckpt`` (every_n_train_steps, epoch ends)
    and ``<output_dir>/hpc_ckpt_*.ckpt`` (what Lightning saves on SLURM's SIGUSR1 before a requeue; Lightning
    itself reads those only when no ckpt_path is given). With neither, None: the first launch of a job that a
    requeue will resume starts afresh, with a warning naming where it looked (Lightning's own, which tells
    to set ``save_last=True``, does not apply: feedline's checkpoint callback sets it). Anything else is kept."""
    if value != "last":
        return value
    candidates = glob.glob(os.path.join(output_dir, "checkpoints", "last*.ckpt"))
    candidates += glob.glob(os.path.join(output_dir, "hpc_ckpt_*.ckpt"))
    if candidates:
        return max(candidates, key=os.path.getmtime)
    if rank_zero_only.rank == 0:
        log.warning(
            "ckpt_path=last: no checkpoint yet in %s (checkpoints/last*.ckpt, hpc_ckpt_*.ckpt): starting "
            "afresh; the same command resumes from the checkpoints this run writes there",
            os.path.abspath(output_dir),
        )
    return None


@contextlib.contextmanager
def resuming_into_own_dir(ckpt_path: str | None):
    """Around ``trainer.fit``: a resume (``ckpt_path`` set) goes on writing into the checkpoint folder it
    resumes from, so Lightning's "Checkpoint directory ... exists and is not empty" says nothing a user can act
    on; a fresh start over checkpoints is refused before (``run_dir.check_fresh_start``). Only that warning,
    and only while resuming."""
    with warnings.catch_warnings():
        if ckpt_path is not None:
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        yield


def _import(name: str, key: str = "ckpt_safe_types"):
    module, _, attr = str(name).rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(
            f"{key}: {name!r} is not an importable class or function (give its dotted name, module.Type)"
        ) from None


@contextlib.contextmanager
def loading_safely(ckpt_path: str | None, safe_types=()):
    """Around ``trainer.fit(..., weights_only=True)``: the types ``safe_types`` names (dotted) load besides
    tensors and plain containers; a checkpoint holding any other is refused with an error naming the type,
    the file, and the key that allows it."""
    import torch

    allowed = [_import(name) for name in safe_types or ()]
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    except pickle.UnpicklingError as err:
        if ckpt_path is None:
            raise
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        name = found.group(1) if found else "module.Type"
        raise ValueError(
            f"ckpt_path {ckpt_path} holds {found.group(1) if found else 'an object'}, which is not a tensor or "
            "a plain container: loading it would run code the file names, so feedline does not. If you trust "
            f"the file, allow it: ckpt_safe_types=[{name}]"
        ) from None

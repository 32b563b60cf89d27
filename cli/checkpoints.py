"""``ckpt_path=last``: the newest checkpoint this run's output directory holds, whoever wrote it."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
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

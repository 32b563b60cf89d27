"""``ckpt_path=last``: the newest checkpoint this run's output directory holds, whoever wrote it."""

from __future__ import annotations

import glob
import os


def resolve_ckpt_path(value: str | None, output_dir: str) -> str | None:
    """``last`` -> the newest of ``<output_dir>/checkpoints/last*.ckpt`` (every_n_train_steps, epoch ends)
    and ``<output_dir>/hpc_ckpt_*.ckpt`` (what Lightning saves on SLURM's SIGUSR1 before a requeue; Lightning
    itself reads those only when no ckpt_path is given). With neither, ``last`` stays for Lightning, which
    warns and starts afresh: the first launch of a job that a requeue will resume. Anything else is kept."""
    if value != "last":
        return value
    candidates = glob.glob(os.path.join(output_dir, "checkpoints", "last*.ckpt"))
    candidates += glob.glob(os.path.join(output_dir, "hpc_ckpt_*.ckpt"))
    return max(candidates, key=os.path.getmtime) if candidates else "last"

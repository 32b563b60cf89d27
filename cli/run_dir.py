"""What a training run owns in its output directory (``paths.output_dir``, = ``hydra.run.dir``).

- One run at a time: the run holds an exclusive lock on ``<dir>/.train.lock`` (which records its pid and
  host) while it trains, and a second run started into the same directory stops at once, naming the first.
  Two runs in one directory would write over each other's checkpoints and metrics, and ``ckpt_path=last``
  would resume from whichever wrote last. The lock is released when the run ends, however it ends: the
  kernel drops it with the process, so a killed run never leaves a stale one. It is a POSIX record lock
  (``lockf``), which belongs to the process alone: DataLoader workers forked from the run do not share it, so
  a run killed with ``kill -9`` is resumable at once, while its orphaned workers are still winding down
  (``flock`` is shared with every forked child, and held the directory until the last of them exited).
- No fresh start over an earlier run's checkpoints: ``ckpt_path`` unset in a directory whose
  ``checkpoints/`` holds some would write a new ``last.ckpt`` over the earlier run's at its first save.

Only the process of global rank 0 does either: DDP ranks share the directory of the run they belong to.
"""

from __future__ import annotations

import contextlib
import glob
import os
import socket
from collections.abc import Iterator

from lightning.fabric.utilities.rank_zero import rank_zero_only

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here; the fresh-start check still runs
    fcntl = None

LOCK = ".train.lock"
_HELD: set[str] = set()  # directories this process holds: a POSIX lock does not refuse its own process


@contextlib.contextmanager
def own_run_dir(output_dir: str, ckpt_path: str | None) -> Iterator[None]:
    """Hold ``output_dir`` for this run (see the module docstring), or raise naming what is in the way."""
    if rank_zero_only.rank != 0:
        yield
        return
    output_dir = os.path.abspath(output_dir)
    if output_dir in _HELD:  # before opening the file: closing a second descriptor would drop the lock
        raise _in_use(output_dir, f"pid {os.getpid()} on {socket.gethostname()}, this process")
    os.makedirs(output_dir, exist_ok=True)
    fd = os.open(os.path.join(output_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _lock(fd, output_dir)
        _HELD.add(output_dir)
        try:
            check_fresh_start(output_dir, ckpt_path)
            yield
        finally:
            _HELD.discard(output_dir)
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, output_dir: str) -> None:
    if fcntl is None:
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # this process's own: forked workers hold no share
    except OSError:
        holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "a process that left no pid"
        raise _in_use(output_dir, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)


def _in_use(output_dir: str, holder: str) -> BlockingIOError:
    return BlockingIOError(
        f"paths.output_dir '{output_dir}' is in use by another run ({holder}): two runs in one directory "
        "write over each other's checkpoints and metrics. Give this run a directory of its own "
        "(hydra.run.dir=...), or wait for that run to end"
    )


def check_fresh_start(output_dir: str, ckpt_path: str | None) -> None:
    """A run that resumes nothing may not start where an earlier run's checkpoints are."""
    if ckpt_path is not None:
        return  # it resumes: the checkpoints it writes continue that run
    if glob.glob(os.path.join(output_dir, "hpc_ckpt_*.ckpt")):
        return  # under SLURM, Lightning resumes from these by itself when no ckpt_path is given
    earlier = sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(output_dir, "checkpoints", "*.ckpt"))
    )
    if earlier:
        raise FileExistsError(
            f"paths.output_dir '{output_dir}' holds the checkpoints of an earlier run "
            f"(checkpoints/: {', '.join(earlier[:4])}{', ...' if len(earlier) > 4 else ''}), which a fresh "
            "start would write over. Resume that run with ckpt_path=last, or give this run a directory of its "
            "own (hydra.run.dir=...)"
        )

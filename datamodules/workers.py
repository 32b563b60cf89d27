"""What every DataLoader worker runs first: seeding by rank, and the run's log files.

Seeding: torch, ``random`` and numpy from the loader's seed, the worker id and the global rank (numpy's
``SeedSequence`` mixes the three, as Lightning's ``pl_worker_init_function`` does), so augmentations differ
between workers and ranks and repeat under one seed. The train loader seeds each sample besides
(``resume.py``); this covers what other loaders, and transforms with their own generators, draw.

Logging: a forked worker inherits the main process's handlers; a spawned one starts with none, so its
warnings (a bad sample's path) would reach the console but not the run's log file. The file handlers the
main process has when the loader is built are opened again, for appending, in each spawned worker.

The heap (``steady_heap``): a worker allocates and frees the same few sizes for every sample (an encoded
image's bytes, the decoded image, the batch). glibc's malloc, left to its defaults, serves the large ones
with fresh mappings and gives freed memory back whenever the heap's top grows past a threshold it keeps
moving, so every sample faults its pages in again: measured, 40-65 page faults a sample and 1.2x the CPU per
image for the shards cache's reads (``benchmarks/shards.py --s3``, the warm row). Fixed thresholds keep that
memory in the worker for the next sample; a worker's resident memory is then its peak, not its current use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import random
import sys

import numpy as np
import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
HEAP_KEEP = 256 << 20  # free memory a worker keeps at its heap's top before giving it back
HEAP_MMAP = 32 << 20  # allocations at least this large get their own mapping (glibc's largest threshold)


def steady_heap() -> bool:
    """Fix glibc malloc's thresholds in this process (see the module's note); False where it is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs: their own allocator, nothing to set
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, HEAP_KEEP)) and bool(mallopt(M_MMAP_THRESHOLD, HEAP_MMAP))


def seed_worker(worker_id: int, rank: int) -> None:
    """Seed torch, ``random`` and numpy in a worker from the loader's base seed, ``worker_id`` and ``rank``."""
    base_seed = torch.initial_seed() - worker_id  # torch gives each worker base_seed + worker_id
    torch_seed, python_seed = np.random.SeedSequence([base_seed, worker_id, rank]).generate_state(
        2, np.uint64
    )
    torch.manual_seed(int(torch_seed))
    random.seed(int(python_seed))
    np.random.seed(np.random.SeedSequence([base_seed, worker_id, rank, 1]).generate_state(4))


class WorkerInit:
    def __init__(self, rank: int):
        self.rank = int(rank)
        self.log_files = [
            (h.baseFilename, h.formatter._fmt if h.formatter else None, h.level)
            for h in logging.getLogger().handlers
            if isinstance(h, logging.FileHandler)
        ]

    def __call__(self, worker_id: int) -> None:
        steady_heap()
        seed_worker(worker_id, self.rank)
        root = logging.getLogger()
        open_files = {getattr(h, "baseFilename", None) for h in root.handlers}
        for filename, fmt, level in self.log_files:
            if filename not in open_files:  # a spawned worker: nothing inherited
                handler = logging.FileHandler(filename, mode="a", delay=True)
                handler.setFormatter(logging.Formatter(fmt))
                handler.setLevel(level)
                root.addHandler(handler)

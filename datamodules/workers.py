"""What every DataLoader worker runs first: seeding by rank, and the run's log files.

Seeding: torch, ``random`` and numpy from the loader's seed, the worker id and the global rank (Lightning's
``pl_worker_init_function``), so augmentations differ between workers and ranks and repeat under one seed.

Logging: a forked worker inherits the main process's handlers; a spawned one starts with none, so its
warnings (a bad sample's path) would reach the console but not the run's log file. The file handlers the
main process has when the loader is built are opened again, for appending, in each spawned worker.
"""

from __future__ import annotations

import logging

from lightning.fabric.utilities.seed import pl_worker_init_function


class WorkerInit:
    def __init__(self, rank: int):
        self.rank = int(rank)
        self.log_files = [
            (h.baseFilename, h.formatter._fmt if h.formatter else None, h.level)
            for h in logging.getLogger().handlers
            if isinstance(h, logging.FileHandler)
        ]

    def __call__(self, worker_id: int) -> None:
        pl_worker_init_function(worker_id, rank=self.rank)
        root = logging.getLogger()
        open_files = {getattr(h, "baseFilename", None) for h in root.handlers}
        for filename, fmt, level in self.log_files:
            if filename not in open_files:  # a spawned worker: nothing inherited
                handler = logging.FileHandler(filename, mode="a", delay=True)
                handler.setFormatter(logging.Formatter(fmt))
                handler.setLevel(level)
                root.addHandler(handler)

"""Test-only Lightning callback: records the label of every sample each rank sees, per epoch.

The DDP tests train on trees where every image is its own class, so a label is a sample ID. Each rank
writes ``<dir>/rank<r>.json`` at the end of the fit.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import lightning as L


class SampleRecorder(L.Callback):
    def __init__(self, dir: str):  # noqa: A002 - the config key
        self.dir = dir
        self.train: dict[int, list[int]] = defaultdict(list)
        self.val: dict[int, list[int]] = defaultdict(list)
        self.batch_sizes: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train[trainer.current_epoch].extend(batch.label.tolist())
        self.batch_sizes.append(len(batch.label))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.val[trainer.current_epoch].extend(batch.label.tolist())

    def on_fit_end(self, trainer, pl_module):
        os.makedirs(self.dir, exist_ok=True)
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "train": self.train,
            "val": self.val,
            "batch_sizes": self.batch_sizes,
            "root_dir": os.path.abspath(trainer.default_root_dir),
            "pid": os.getpid(),
        }
        with open(os.path.join(self.dir, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(record, f)

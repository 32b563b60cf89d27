"""ThroughputMonitor: training samples per second, as the run's summary reports it."""

from __future__ import annotations

import time

import lightning as L


class ThroughputMonitor(L.Callback):
    """Counts samples between training-batch ends (data wait included, validation excluded)."""

    def __init__(self):
        self.samples = 0
        self.seconds = 0.0
        self._last = None

    def on_train_epoch_start(self, trainer, pl_module):
        self._last = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self._last is not None:
            self.seconds += now - self._last
            self.samples += len(batch[0]) * trainer.world_size
        self._last = now

    def on_validation_start(self, trainer, pl_module):
        self._last = None

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

"""ThroughputMonitor: training samples per second, and how long after the process (or, in a sweep, the job)
started the first batch came, as the run's summary reports them."""

from __future__ import annotations

import time

import lightning as L

from feedline.diagnostics.startup import process_start


class ThroughputMonitor(L.Callback):
    """Counts samples between training-batch ends (data wait included, validation excluded)."""

    def __init__(self):
        self.samples = 0
        self.seconds = 0.0
        self._last = None
        self.first_batch_s: float | None = None  # seconds from ``started`` to the first batch
        # When the clock starts (time.time()): the process's start unless set; train.py sets a sweep job's
        # own start, as the jobs of a sweep run one after another in one process.
        self.started: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.first_batch_s is None:
            started = self.started if self.started is not None else process_start()
            self.first_batch_s = time.time() - started if started is not None else None

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
    def samples_per_second(self) -> float | None:
        """None where nothing was timed: an epoch of one batch (a resume with one left) has no interval."""
        return self.samples / self.seconds if self.seconds else None

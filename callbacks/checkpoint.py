"""ModelCheckpoint that can write ``last.ckpt`` inside the first epoch, whatever metric it monitors.

Lightning's defers a step-interval save until the monitored metric exists, so with ``monitor: val/acc`` a run
preempted in its first epoch has no checkpoint at all. This one still writes ``last.ckpt`` every
``every_n_train_steps`` optimizer steps (the top-k files keep waiting for the metric), so a resume loses at
most that many steps.

A model that reports no ``val/acc`` (segmentation, multi-label, regression) names the metric its best
checkpoints are kept by, as ``checkpoint_monitor = (name, "max" | "min")``; the default ``monitor: val/acc``
follows it, so ``model=segmenter`` needs no ``callbacks.model_checkpoint.monitor=`` of its own.
"""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningCheckpoint

DEFAULT_MONITOR = "val/acc"  # conf/callbacks/default.yaml's: what ImageClassifier reports


class ModelCheckpoint(_LightningCheckpoint):
    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        own = getattr(pl_module, "checkpoint_monitor", None)
        if own is not None and self.monitor == DEFAULT_MONITOR and own[0] != self.monitor:
            # before a resume restores this callback's state, which is keyed by the monitor
            self.monitor, self.mode = own
            self.kth_value = torch.tensor(torch.inf if self.mode == "min" else -torch.inf)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        every = self._every_n_train_steps
        if (
            not self.save_last
            or every < 1
            or trainer.global_step % every
            or self._should_skip_saving_checkpoint(trainer)
        ):
            return
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and self.monitor not in candidates:  # Lightning deferred: last.ckpt now
            deferred = self._last_global_step_saved
            self._save_last_checkpoint(trainer, candidates)
            self._last_global_step_saved = deferred  # the deferred top-k save after validation still happens

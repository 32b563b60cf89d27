"""ImageClassifier: a LightningModule around any ``net(num_classes=...)`` factory.

The number of classes comes from the datamodule (``train.py`` passes ``num_classes``), so swapping the
data never means editing the model config. Targets may be class indices or soft labels (mixup).
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F

from feedline.models.training import ChecksTarget, adamw_cosine, log_loss, scaled


class ImageClassifier(ChecksTarget, L.LightningModule):
    target_kinds = ("class",)  # the kinds of source.target it trains on (training.check_target)

    def __init__(
        self,
        net: Callable[..., torch.nn.Module],
        num_classes: int,
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net(num_classes=num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(scaled(x))

    def _step(self, batch, stage: str, right: list | None = None):
        image, target = batch[0], batch[1]
        logits = self(image)
        loss = F.cross_entropy(logits, target)  # accepts indices or per-class probabilities
        hard = target.argmax(dim=1) if target.dim() == 2 else target
        correct = logits.argmax(dim=1) == hard
        if right is not None:
            right.append(correct)
        acc = correct.float().mean()
        log_loss(self, stage, loss, len(image))
        self.log(
            f"{stage}/acc",
            acc,
            prog_bar=True,
            on_epoch=True,
            on_step=False,
            sync_dist=True,
            batch_size=len(image),
        )
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        right: list = []
        self._step(batch, "val", right)
        part = getattr(batch, "part", None)  # source=mix: each sample's part
        if part is not None:
            tally = self._part_tally(len(self._part_names()))
            part = part.to(tally.device)
            tally[:, 0].index_add_(0, part, right[0].to(tally.device, torch.float64))
            tally[:, 1].index_add_(0, part, torch.ones_like(part, dtype=torch.float64))

    def _part_names(self) -> list[str]:
        datamodule = getattr(self.trainer, "datamodule", None)
        names = datamodule.part_names("val") if hasattr(datamodule, "part_names") else None
        return names or []

    def _part_tally(self, parts: int) -> torch.Tensor:
        """(right, seen) per part of a mix, over this validation epoch."""
        if getattr(self, "_tally", None) is None or len(self._tally) != parts:
            self._tally = torch.zeros((parts, 2), dtype=torch.float64, device=self.device)
        return self._tally

    def on_validation_epoch_start(self) -> None:
        self._tally = None

    def on_validation_epoch_end(self) -> None:
        """``val/acc/<part>`` for each part of a mix: its samples' accuracy, summed over every rank."""
        names = self._part_names()
        if not names:
            return
        tally = self.trainer.strategy.reduce(self._part_tally(len(names)).clone(), reduce_op="sum")
        for k, name in enumerate(names):
            if tally[k, 1] > 0:
                # already summed over ranks: sync_dist only averages equal values, and keeps Lightning from
                # warning on every rank that an epoch-level value is not synced
                self.log(f"val/acc/{name}", float(tally[k, 0] / tally[k, 1]), sync_dist=True)

    def configure_optimizers(self):
        return adamw_cosine(self)

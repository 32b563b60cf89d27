"""MultiLabelClassifier: which of C classes an image holds, each a yes or no, with mAP and F1.

The batch is ``x, y = batch`` with ``y`` a float32 (N, C) multi-hot (``source.target`` a field of kind
``classes``; after mixup, soft). Each class is its own logistic output (binary cross-entropy with logits).
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MultilabelAveragePrecision, MultilabelF1Score

from feedline.models.nets import SmallCNN
from feedline.models.training import ChecksTarget, adamw_cosine, log_loss, scaled


class MultiLabelClassifier(ChecksTarget, L.LightningModule):
    target_kinds = ("classes",)  # the kinds of source.target it trains on (training.check_target)
    # the metric its best checkpoints are kept by (callbacks/checkpoint.py)
    checkpoint_monitor = ("val/map", "max")

    def __init__(
        self,
        num_classes: int,
        net: Callable[..., torch.nn.Module] | None = None,
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
        threshold: float = 0.5,
    ):
        super().__init__()
        if num_classes < 1:
            raise ValueError(
                "MultiLabelClassifier needs the target's class list: source.target must name a field of kind "
                "classes, with source.fields.<name>.classes"
            )
        self.save_hyperparameters(ignore=["net"])
        self.net = (net or SmallCNN)(num_classes=num_classes)
        self.val_map = MultilabelAveragePrecision(num_classes, average="macro")
        self.val_f1 = MultilabelF1Score(num_classes, threshold=threshold, average="macro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(scaled(x))

    def _step(self, batch, stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image, target = batch[0], batch[1]
        logits = self(image)
        loss = F.binary_cross_entropy_with_logits(logits, target.float())
        log_loss(self, stage, loss, len(image))
        return loss, logits, target

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")[0]

    def validation_step(self, batch, batch_idx):
        _, logits, target = self._step(batch, "val")
        present = (target >= 0.5).long()  # a soft (mixed) target counts where it is mostly there
        probs = torch.sigmoid(logits)
        self.val_map.update(probs, present)
        self.val_f1.update(probs, present)
        self.log("val/map", self.val_map, prog_bar=True, on_epoch=True, on_step=False)
        self.log("val/f1", self.val_f1, prog_bar=True, on_epoch=True, on_step=False)

    def configure_optimizers(self):
        return adamw_cosine(self)

"""ImageClassifier: a LightningModule around any ``net(num_classes=...)`` factory.

The number of classes comes from the datamodule (``train.py`` passes ``num_classes``), so swapping the
data never means editing the model config. Targets may be class indices or soft labels (mixup).
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F


class ImageClassifier(L.LightningModule):
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
        if x.dtype == torch.uint8:  # no batch stack configured (transforms=none): scale here
            x = x.float().div_(255)
        return self.net(x)

    def _step(self, batch, stage: str):
        image, target = batch[0], batch[1]
        logits = self(image)
        loss = F.cross_entropy(logits, target)  # accepts indices or per-class probabilities
        hard = target.argmax(dim=1) if target.dim() == 2 else target
        acc = (logits.argmax(dim=1) == hard).float().mean()
        on_epoch = stage != "train"
        self.log(
            f"{stage}/loss",
            loss,
            prog_bar=stage == "train",
            on_epoch=on_epoch,
            sync_dist=on_epoch,
            batch_size=len(image),
        )
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
        self._step(batch, "val")

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
        epochs = (
            self.trainer.max_epochs
            if self.trainer and self.trainer.max_epochs and self.trainer.max_epochs > 0
            else 1
        )
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

"""ImageRegressor: a number (or a vector) per image, with the mean absolute error.

The batch is ``x, y = batch`` with ``y`` float32 (N,) (``source.target`` a field of kind ``number``) or
(N, D) (kind ``vector``, ``outputs=D``). ``train.py`` passes ``num_classes``, 0 for a target without a class
list: it is accepted and unused.
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanAbsoluteError

from feedline.models.nets import SmallCNN
from feedline.models.training import ChecksTarget, adamw_cosine, log_loss, scaled

LOSSES = {"mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss}


class ImageRegressor(ChecksTarget, L.LightningModule):
    target_kinds = ("number", "vector")  # the kinds of source.target it trains on (training.check_target)
    # the metric its best checkpoints are kept by (callbacks/checkpoint.py)
    checkpoint_monitor = ("val/mae", "min")

    def __init__(
        self,
        net: Callable[..., torch.nn.Module] | None = None,
        outputs: int = 1,
        loss: str = "mse",
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
        num_classes: int = 0,  # train.py passes it to every model; a regression has none
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"model.loss={loss!r} is not one of: {', '.join(LOSSES)}")
        if outputs < 1:
            raise ValueError(f"model.outputs={outputs} must be 1 or more (the target's size)")
        self.save_hyperparameters(ignore=["net", "num_classes"])
        self.net = (net or SmallCNN)(num_classes=outputs)
        self.val_mae = MeanAbsoluteError()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N,) for one output, (N, D) for several."""
        out = self.net(scaled(x))
        return out.squeeze(-1) if self.hparams.outputs == 1 else out

    def _step(self, batch, stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image, target = batch[0], batch[1]
        target = target.float()
        pred = self(image)
        if pred.shape != target.shape:
            raise ValueError(
                f"ImageRegressor predicts {tuple(pred.shape[1:]) or 'one number'} per sample but the target is "
                f"{tuple(target.shape[1:]) or 'one number'}: set model.outputs to the target's size"
            )
        loss = LOSSES[self.hparams.loss](pred, target)
        log_loss(self, stage, loss, len(image))
        return loss, pred, target

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")[0]

    def validation_step(self, batch, batch_idx):
        _, pred, target = self._step(batch, "val")
        self.val_mae.update(pred, target)
        self.log("val/mae", self.val_mae, prog_bar=True, on_epoch=True, on_step=False)

    def configure_optimizers(self):
        return adamw_cosine(self)

"""Segmenter: per-pixel classes from a torchvision segmentation network, with mean IoU.

The batch is ``x, y = batch`` with ``y`` a uint8 (N, H, W) mask of class indices (``source.target`` a field of
kind mask); pixels at ``ignore_index`` (255: padding, VOC's void) count in neither the loss nor the IoU. The
number of classes is the mask's class list, from the datamodule (``train.py`` passes ``num_classes``).
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassJaccardIndex

from feedline.datasets.fields import IGNORE_INDEX
from feedline.models.training import ChecksTarget, adamw_cosine, log_loss, scaled


def lraspp(num_classes: int, weights=None, weights_backbone=None, **kwargs) -> torch.nn.Module:
    """torchvision's LR-ASPP MobileNetV3-Large, untrained unless ``weights`` are named (nothing is downloaded
    otherwise); other keywords go to torchvision's builder."""
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    return lraspp_mobilenet_v3_large(
        weights=weights, weights_backbone=weights_backbone, num_classes=num_classes, **kwargs
    )


def check_ignore_index(ignore_index: int, datamodule) -> None:
    """The model's ``ignore_index`` must be the one the data marks void and padded pixels with (the target
    mask field's): else those pixels would train as a class and count in the IoU."""
    fields = getattr(datamodule, "fields", None)
    if fields is None:
        return
    target = fields[fields.target]
    if target.kind == "mask" and target.ignore_index != ignore_index:
        raise ValueError(
            f"model.ignore_index={ignore_index}, but the data marks void and padded pixels of its mask "
            f"{target.name!r} with {target.ignore_index} (source.fields.{target.name}.ignore_index; seg_folder: "
            f"source.ignore_index): set model.ignore_index={target.ignore_index}"
        )


class Segmenter(ChecksTarget, L.LightningModule):
    target_kinds = ("mask",)  # the kinds of source.target it trains on (training.check_target)
    # the metric its best checkpoints are kept by (callbacks/checkpoint.py)
    checkpoint_monitor = ("val/miou", "max")

    def __init__(
        self,
        num_classes: int,
        net: Callable[..., torch.nn.Module] | None = None,
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
        ignore_index: int = IGNORE_INDEX,
    ):
        super().__init__()
        if num_classes < 2:
            raise ValueError(
                f"Segmenter needs the mask's class list (2 or more classes, got {num_classes}): name them in "
                "source.fields.<mask>.classes"
            )
        self.save_hyperparameters(ignore=["net"])
        self.net = (net or lraspp)(num_classes=num_classes)
        self.val_miou = MulticlassJaccardIndex(num_classes, ignore_index=ignore_index, average="macro")

    def setup(self, stage: str) -> None:
        super().setup(stage)  # the target's kind
        check_ignore_index(self.hparams.ignore_index, getattr(self.trainer, "datamodule", None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) logits at the input's size."""
        out = self.net(scaled(x))
        return out["out"] if isinstance(out, dict) else out  # torchvision's networks return {"out": ...}

    def _step(self, batch, stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image, mask = batch[0], batch[1]
        target = mask.long()
        logits = self(image)
        counted = target != self.hparams.ignore_index
        if counted.any():
            loss = F.cross_entropy(logits, target, ignore_index=self.hparams.ignore_index)
        else:  # every pixel void (padding, a crop of the void border): no loss, rather than NaN weights
            loss = logits.sum() * 0.0
        log_loss(self, stage, loss, len(image))
        return loss, logits, target

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")[0]

    def validation_step(self, batch, batch_idx):
        _, logits, target = self._step(batch, "val")
        self.val_miou.update(logits.argmax(dim=1), target)
        self.log("val/miou", self.val_miou, prog_bar=True, on_epoch=True, on_step=False)

    def configure_optimizers(self):
        return adamw_cosine(self)

"""Detector: boxes and their classes from torchvision's Faster R-CNN, with COCO's mAP.

The batch is ``images, targets = batch`` (``source.target`` a field of kind boxes, ``collate=detection``):
``images`` a float (N, 3, H, W) tensor or a list of (3, H, W) tensors in [0, 1] (uint8 is scaled; no Normalize:
torchvision's detection models normalise inside), ``targets`` a list of N dicts {"boxes": XYXY (M, 4),
"labels": int64 (M,), "image_id", ...}, M possibly 0.

Labels: feedline's are contiguous from 0 (the boxes field's class list); torchvision keeps class 0 for the
background. So the network has ``num_classes + 1`` outputs, targets go in with ``labels + 1`` and predictions
come out with ``labels - 1`` (``to_net`` / ``from_net``): what ``forward`` returns and the mAP counts are in
feedline's labels.
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
from torchmetrics.detection import MeanAveragePrecision

from feedline.models.training import ChecksTarget, adamw_cosine, log_loss, scaled


def fasterrcnn(num_classes: int, weights=None, weights_backbone=None, **kwargs) -> torch.nn.Module:
    """torchvision's Faster R-CNN MobileNetV3-Large 320 FPN, untrained unless ``weights`` are named (nothing is
    downloaded otherwise). ``num_classes`` counts the background; other keywords (``min_size``, ``max_size``,
    ...) go to torchvision's builder."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    return fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=weights, weights_backbone=weights_backbone, num_classes=num_classes, **kwargs
    )


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor)  # a BoundingBoxes as the plain tensor torchvision's models expect


def to_net(target: dict) -> dict:
    """A feedline target dict as the network trains on it: plain XYXY boxes, labels shifted past background."""
    return {"boxes": _plain(target["boxes"]).float(), "labels": _plain(target["labels"]).long() + 1}


def from_net(prediction: dict) -> dict:
    """A network's prediction in feedline's labels (background 0 is never predicted)."""
    return {**prediction, "labels": prediction["labels"] - 1}


def _images(images) -> list[torch.Tensor]:
    return [scaled(_plain(image)) for image in images]  # a (N, 3, H, W) tensor iterates as its images


class Detector(ChecksTarget, L.LightningModule):
    target_kinds = ("boxes",)  # the kinds of source.target it trains on (training.check_target)
    # the metric its best checkpoints are kept by (callbacks/checkpoint.py)
    checkpoint_monitor = ("val/map", "max")

    def __init__(
        self,
        num_classes: int,
        net: Callable[..., torch.nn.Module] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
    ):
        super().__init__()
        if num_classes < 1:
            raise ValueError(
                "Detector needs the boxes' class list: source.target must name a field of kind boxes, with "
                "source.fields.<name>.classes (source=coco: the JSON's categories)"
            )
        self.save_hyperparameters(ignore=["net"])
        self.net = (net or fasterrcnn)(num_classes=num_classes + 1)  # + the background
        self.val_map = MeanAveragePrecision(box_format="xyxy", iou_type="bbox")

    def forward(self, images) -> list[dict]:
        """Predictions (eval mode): a dict per image, {"boxes" XYXY, "scores", "labels" in feedline's}."""
        return [from_net(p) for p in self.net(_images(images))]

    def training_step(self, batch, batch_idx):
        images, targets = batch[0], batch[1]
        losses = self.net(_images(images), [to_net(t) for t in targets])
        loss = sum(losses.values())
        log_loss(self, "train", loss, len(targets))
        return loss

    def validation_step(self, batch, batch_idx):
        images, targets = batch[0], batch[1]
        truth = []
        for t in targets:
            kept = {"boxes": _plain(t["boxes"]).float(), "labels": _plain(t["labels"]).long()}
            if "iscrowd" in t:  # crowd boxes: neither a hit nor a miss, as COCO counts them
                kept["iscrowd"] = _plain(t["iscrowd"]).long()
            truth.append(kept)
        self.val_map.update(self(images), truth)

    def on_validation_epoch_end(self) -> None:
        result = self.val_map.compute()  # over every rank
        self.val_map.reset()
        self.log("val/map", result["map"], prog_bar=True, sync_dist=False)
        self.log("val/map_50", result["map_50"], prog_bar=True, sync_dist=False)

    def configure_optimizers(self):
        return adamw_cosine(self)

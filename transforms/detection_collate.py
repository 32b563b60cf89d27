"""``collate=detection``: samples with boxes -> ``images, targets = batch``, as torchvision's detection models
take them.

    images    one uint8 (N, C, H, W) tensor where every image has one size; else a list of (C, H, W) tensors
              (detection models resize each image themselves, so a stack need not end at one size)
    targets   a list of dicts ``{"boxes": BoundingBoxes XYXY, "labels": int64 (M,), "image_id", ...}``, one per
              image (``boxes: list``, the default), or one dict of tensors padded to the batch's most boxes
              (``boxes: padded``, for DETR-style models): ``boxes`` (N, M, 4), ``labels`` (N, M) padded with -1,
              ``valid`` (N, M) True on real boxes, ``image_id`` (N,), ``canvas_size`` (N, 2) each image's (H, W),
              and ``iscrowd``/``area`` (N, M) and ``masks`` (N, M, H, W) where present.

The other fields of a sample (a caption, a class) are collated as every collate does (``field_collate.py``).
"""

from __future__ import annotations

import torch

from feedline.transforms.batch import Batch
from feedline.transforms.collate import Collate
from feedline.transforms.field_collate import collate_fields, stack

_MODES = ("list", "padded")


class DetectionCollate(Collate):
    """Images stacked where they share a size (else listed) and the detection targets listed or padded."""

    def __init__(self, boxes: str = "list"):
        if boxes not in _MODES:
            raise ValueError(f"collate.boxes={boxes!r} is not one of: {', '.join(_MODES)}")
        self.boxes = boxes

    def check_fields(self, fields) -> None:
        """Refuse, before any batch, samples that hold no boxes field (``fields``: the source's)."""
        if not fields.of_kind("boxes"):
            raise TypeError(
                f"collate=detection stacks samples with a boxes field (source=coco, or a source whose source.fields "
                f"declares kind: boxes); these hold {fields.describe()}: use collate=default"
            )

    def __call__(self, samples) -> Batch:
        if not isinstance(samples[0], dict):
            raise TypeError(
                "collate=detection stacks samples with a boxes field (source=coco, or a source whose "
                "source.fields declares kind: boxes); these are (image, label) pairs: use collate=default"
            )
        layout = self._layout(samples)
        boxes = [name for name, kind in layout.kinds if kind == "boxes"]
        if not boxes:
            raise TypeError(
                f"collate=detection got samples without a boxes field ({', '.join(n for n, _ in layout.kinds)}): "
                "declare one (kind: boxes), or use collate=default"
            )
        x = layout.x
        images = [s[x] for s in samples]
        same = len({tuple(v.shape) for v in images}) == 1
        batch = collate_fields(samples, layout, image_into=_stacked if same else _listed)
        if self.boxes == "padded":
            batch = batch.replace(**{boxes[0]: padded_targets(batch[boxes[0]])})
        return batch


def _stacked(values) -> torch.Tensor:
    return stack("image", [v.as_subclass(torch.Tensor) for v in values])


def _listed(values) -> list:
    return [v.as_subclass(torch.Tensor).contiguous() for v in values]


def padded_targets(targets: list[dict]) -> dict:
    """A list of detection targets -> one dict of (N, M, ...) tensors padded to the most boxes, and ``valid``."""
    most = max((len(t["boxes"]) for t in targets), default=0)
    n = len(targets)
    out = {
        "boxes": torch.zeros((n, most, 4), dtype=torch.float32),
        "labels": torch.full((n, most), -1, dtype=torch.int64),
        "valid": torch.zeros((n, most), dtype=torch.bool),
    }
    extra = {k for t in targets for k in ("iscrowd", "area") if k in t}
    for k in extra:
        out[k] = torch.zeros((n, most), dtype=targets[0][k].dtype if k in targets[0] else torch.float32)
    for i, t in enumerate(targets):
        m = len(t["boxes"])
        out["boxes"][i, :m] = t["boxes"].as_subclass(torch.Tensor)
        out["labels"][i, :m] = t["labels"]
        out["valid"][i, :m] = True
        for k in extra:
            if k in t:
                out[k][i, :m] = t[k]
    if any("masks" in t for t in targets):  # instance masks: (N, M, H, W), padded at the bottom and right
        height = max(t["boxes"].canvas_size[0] for t in targets)
        width = max(t["boxes"].canvas_size[1] for t in targets)
        out["masks"] = torch.zeros((n, most, height, width), dtype=torch.uint8)
        for i, t in enumerate(targets):
            if "masks" in t:
                m, h, w = t["masks"].shape
                out["masks"][i, :m, :h, :w] = t["masks"]
    if all("image_id" in t for t in targets):
        out["image_id"] = torch.as_tensor([t["image_id"] for t in targets], dtype=torch.int64)
    if targets:
        out["canvas_size"] = torch.as_tensor([t["boxes"].canvas_size for t in targets], dtype=torch.int64)
    return out

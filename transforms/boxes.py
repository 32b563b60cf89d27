"""Boxes: a source's raw boxes -> torchvision's detection target, and the transform that drops degenerate boxes.

A ``boxes`` field (``datasets/fields.py``) reads as a dict of arrays, ``{"boxes": (M, 4) in the field's format,
"labels": (M,), ...}``. ``decode_boxes`` turns it into the target torchvision's detection models take:
``{"boxes": tv_tensors.BoundingBoxes`` (XYXY, float32, its image's canvas size), ``"labels": int64 (M,)``,
``"image_id"`` and, where the source has them, ``"iscrowd"``, ``"area"`` and ``"masks"`` (instance masks,
``tv_tensors.Mask`` uint8 (M, H, W))``}``. Because the boxes are ``BoundingBoxes`` and the masks ``Mask``, every v2
transform moves them with the image; ``SanitizeBoxes`` then drops the boxes a crop left degenerate together with
their labels, crowd flags, areas and masks. M may be 0: an image without boxes is a normal sample.
"""

from __future__ import annotations

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from feedline.transforms.decode import DecodeError

_FORMATS = {
    "XYXY": tv_tensors.BoundingBoxFormat.XYXY,
    "XYWH": tv_tensors.BoundingBoxFormat.XYWH,
    "CXCYWH": tv_tensors.BoundingBoxFormat.CXCYWH,
}


def decode_boxes(value, box_format: str, canvas: tuple[int, int], classes: int) -> dict:
    """``value`` (a source's boxes dict) -> the detection target on an image of ``canvas`` (H, W). Wrong
    shapes, labels beyond the ``classes`` count and coordinates that are not finite raise ``DecodeError``."""
    if not isinstance(value, dict) or "boxes" not in value or "labels" not in value:
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise DecodeError(
            f"a boxes value is a dict with 'boxes' and 'labels' (and optional per-box arrays); got {got}"
        )
    boxes = np.asarray(value["boxes"], dtype=np.float32)
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise DecodeError(f"boxes of shape {boxes.shape}: expected (M, 4) in {box_format}")
    if not np.isfinite(boxes).all():
        raise DecodeError("a box coordinate is not finite (NaN or infinity)")
    count = len(boxes)
    labels = _per_box(value["labels"], "labels", count, np.int64)
    if count and classes and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise DecodeError(f"box labels {sorted(set(labels.tolist()))[:8]} are not all in 0..{classes - 1}")
    xyxy = F.convert_bounding_box_format(
        torch.from_numpy(boxes), old_format=_FORMATS[box_format], new_format=tv_tensors.BoundingBoxFormat.XYXY
    )
    if count:
        _check_on_canvas(xyxy, box_format, boxes, canvas)
    target = {
        "boxes": tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=tuple(canvas)),
        "labels": torch.from_numpy(labels),
    }
    if "image_id" in value:
        target["image_id"] = int(value["image_id"])
    if value.get("iscrowd") is not None:
        target["iscrowd"] = torch.from_numpy(_per_box(value["iscrowd"], "iscrowd", count, np.int64))
    if value.get("area") is not None:
        target["area"] = torch.from_numpy(_per_box(value["area"], "area", count, np.float32))
    if value.get("masks") is not None:
        target["masks"] = tv_tensors.Mask(_instance_masks(value["masks"], count, canvas))
    return target


def _check_on_canvas(xyxy: torch.Tensor, box_format: str, given: np.ndarray, canvas: tuple[int, int]) -> None:
    """Every box has a width and a height that are not negative, and lies on its image, within 1 px: a box
    beyond it means the annotations were made on another size of the image (a resized copy, or a photo an EXIF
    tag turns), and training on it would teach the wrong place."""
    height, width = canvas
    negative = (xyxy[:, 2] < xyxy[:, 0]) | (xyxy[:, 3] < xyxy[:, 1])
    if bool(negative.any()):
        k = int(negative.nonzero()[0, 0])
        raise DecodeError(f"box {k} {given[k].tolist()} ({box_format}) has a negative width or height")
    beyond = (xyxy[:, :2] < -1).any(1) | (xyxy[:, 2] > width + 1) | (xyxy[:, 3] > height + 1)
    if bool(beyond.any()):
        k = int(beyond.nonzero()[0, 0])
        raise DecodeError(
            f"box {k} {given[k].tolist()} ({box_format}) lies beyond the {width}x{height} image: the boxes were "
            "drawn on another size of this image (a resized copy, or a photo turned by its EXIF orientation "
            "tag), or the box is wrong"
        )


def _per_box(values, name: str, count: int, dtype) -> np.ndarray:
    out = np.asarray(values, dtype=dtype).reshape(-1)
    if len(out) != count:
        raise DecodeError(f"{len(out)} {name} for {count} boxes: each box needs one")
    return out


def _instance_masks(masks, count: int, canvas: tuple[int, int]) -> torch.Tensor:
    """(M, H, W) uint8 from an array, or from M COCO segmentations (polygon lists or RLE) via pycocotools."""
    if isinstance(masks, np.ndarray) and masks.dtype != object:
        out = masks.astype(np.uint8, copy=False).reshape(-1, *masks.shape[-2:]) if masks.size else None
        out = np.zeros((0, *canvas), np.uint8) if out is None else out
    else:
        from pycocotools import mask as coco_mask  # only where instance masks are asked for

        height, width = canvas
        planes = []
        for k, seg in enumerate(masks):
            try:
                if isinstance(seg, list):  # polygons: [[x0, y0, x1, y1, ...], ...]
                    rle = coco_mask.merge(coco_mask.frPyObjects(seg, height, width))
                elif isinstance(seg, dict) and isinstance(seg.get("counts"), list):  # uncompressed RLE
                    rle = coco_mask.frPyObjects(seg, height, width)
                else:
                    rle = seg
                planes.append(coco_mask.decode(rle))
            except (TypeError, ValueError, KeyError, IndexError) as err:
                raise DecodeError(f"instance mask {k} is not a COCO polygon list or RLE: {err}") from err
        out = np.stack(planes) if planes else np.zeros((0, height, width), np.uint8)
    if len(out) != count:
        raise DecodeError(f"{len(out)} instance masks for {count} boxes: each box needs one")
    if tuple(out.shape[-2:]) != tuple(canvas):
        raise DecodeError(
            f"instance masks are {out.shape[-1]}x{out.shape[-2]} but the image is {canvas[1]}x{canvas[0]}"
        )
    return torch.from_numpy(np.ascontiguousarray(out))


def _per_box_values(inputs) -> tuple[torch.Tensor, ...] | None:
    """What ``SanitizeBoxes`` drops with each degenerate box: every per-box tensor of the detection target
    (labels, iscrowd, area; instance masks are ``Mask`` and torchvision drops those itself)."""
    sample = inputs[0] if len(inputs) == 1 else inputs
    for target in _targets(sample):
        found = tuple(
            target[k] for k in ("labels", "iscrowd", "area") if isinstance(target.get(k), torch.Tensor)
        )
        return found or None
    return None


def _targets(sample):
    """The detection targets (dicts holding ``BoundingBoxes``) in a sample, at any depth."""
    if isinstance(sample, dict):
        if isinstance(sample.get("boxes"), tv_tensors.BoundingBoxes):
            yield sample
            return
        for value in sample.values():
            yield from _targets(value)
    elif isinstance(sample, (list, tuple)):
        for value in sample:
            yield from _targets(value)


class SanitizeBoxes(v2.SanitizeBoundingBoxes):
    """torchvision's ``SanitizeBoundingBoxes`` on feedline's samples: boxes smaller than ``min_size`` pixels
    on a side, or with less than ``min_area``, or outside the image, are dropped with their labels, crowd
    flags, areas and instance masks, wherever the sample keeps its detection target (``{"image": ...,
    "objects": {"boxes": ..., "labels": ...}}``). The last transform of ``transforms=detection``'s train stack.
    A sample without boxes passes unchanged."""

    def __init__(self, min_size: float = 1.0, min_area: float = 1.0):
        super().__init__(min_size=min_size, min_area=min_area, labels_getter=_per_box_values)

    def forward(self, *inputs):
        sample = inputs[0] if len(inputs) == 1 else inputs
        if (
            next(_targets(sample), None) is None
        ):  # a sample without boxes (an image and a class): nothing to drop
            return sample
        return super().forward(*inputs)


# transforms that can leave a box a sliver or outside the image: a stack moving boxes needs a sanitize after them
_CUTTING = (
    v2.RandomResizedCrop,
    v2.RandomCrop,
    v2.CenterCrop,
    v2.RandomIoUCrop,
    v2.RandomAffine,
    v2.RandomRotation,
    v2.RandomPerspective,
    v2.ElasticTransform,
    v2.FiveCrop,
    v2.TenCrop,
)


def check_box_stack(transforms, where: str = "transforms.train") -> None:
    """A train stack that crops (or rotates, shears, warps) boxes must then drop the ones it left degenerate:
    else a box of zero width reaches the model, and torchvision's detection models stop the run far from the
    stack that made it. Refused by name, with the fix."""
    steps = list(_steps(transforms))
    cutting = [k for k, t in enumerate(steps) if isinstance(t, _CUTTING)]
    if not cutting:
        return
    after = steps[
        cutting[-1] + 1 :
    ]  # a sanitize must follow the last such transform, and drop the labels too
    if not any(isinstance(t, v2.SanitizeBoundingBoxes) and t.labels_getter is not None for t in after):
        raise ValueError(
            f"{where} moves boxes through {type(steps[cutting[-1]]).__name__}, which can leave a box a sliver or "
            "outside the image, and no sanitize after it drops those with their labels: end the stack with "
            "feedline.transforms.SanitizeBoxes, or use transforms=detection"
        )


def _steps(transform):
    if transform is None:
        return
    yield transform
    for inner in getattr(transform, "transforms", None) or ():
        yield from _steps(inner)

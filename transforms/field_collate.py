"""Samples of named fields -> one ``Batch``: each kind has one way to become a batch.

    image     stacked uint8 (N, C, H, W); collate=pad pads to the largest (``pad_value``)
    mask      stacked uint8 (N, H, W);    collate=pad pads with the field's ``ignore_index``
    class     int64 (N,)
    classes   float32 multi-hot (N, C)
    number    float32 (N,)
    vector    float32 (N, D)
    text      list[str]
    json      list of the parsed values
    boxes     a list of detection targets (dicts of ``boxes``, ``labels``, ...), one per sample: torchvision's
              detection models take it as it is (``images, targets = batch``)

In a worker every tensor is written straight into shared memory (``batch_pool.empty``), so it crosses to the
main process uncopied; ``Uint8Collate`` writes the input image into its reusable pool as it does for
classification. The collates (``collate.py``) call ``collate_fields`` once the datamodule has told them the
fields (``bind``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from feedline.transforms.batch import Batch
from feedline.transforms.batch_pool import empty
from feedline.transforms.deferred import PendingMask, pending


@dataclass(frozen=True)
class SampleLayout:
    """What a collate knows of the samples it stacks: each field's name and kind, which two unpack as
    ``x, y``, and the pad value of each mask."""

    x: str
    y: str
    kinds: tuple[tuple[str, str], ...]
    ignore: dict = field(default_factory=dict)


def _sizes_differ(name: str, values) -> RuntimeError:
    shapes = sorted({tuple(v.shape) for v in values})
    return RuntimeError(
        f"field {name!r} has samples of shapes {shapes[0]} and {shapes[1]} in one batch: end the transform stack "
        "with a resize or crop (it moves masks and boxes with their images), or use collate=pad (collate=detection "
        "for samples with boxes: it lists images of different sizes)"
    )


def stack(name: str, values, squeeze: bool = False) -> torch.Tensor:
    """Tensors of one shape -> one (N, ...) tensor, in shared memory inside a worker."""
    first = values[0]
    if any(v.shape != first.shape for v in values):
        raise _sizes_differ(name, values)
    shape = tuple(first.shape[1:]) if squeeze else tuple(first.shape)
    out = empty((len(values), *shape), first.dtype)
    for k, v in enumerate(values):
        if pending(v):  # a crop the collate finishes (``transforms/deferred.py``): resized into its slot
            v.write_into(out[k])
        else:
            out[k].copy_(v[0] if squeeze else v)
    return out


def pad(values, fill, multiple_of: int = 1, squeeze: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, H, W) tensors of one channel count -> (N, C, H', W') padded at the bottom and right with ``fill``
    (``squeeze``: (N, H', W')), and the (N, H', W') mask that is True on real data."""
    channels = {v.shape[0] for v in values}
    if len(channels) > 1:
        raise RuntimeError(f"collate=pad got images with {sorted(channels)} channels; they must share one")

    def rounded(n: int) -> int:
        return -(-n // multiple_of) * multiple_of

    height = rounded(max(v.shape[-2] for v in values))
    width = rounded(max(v.shape[-1] for v in values))
    lead = () if squeeze else (values[0].shape[0],)
    out = empty((len(values), *lead, height, width), values[0].dtype)
    out.fill_(fill)
    valid = torch.zeros((len(values), height, width), dtype=torch.bool)
    for k, v in enumerate(values):
        h, w = v.shape[-2:]
        out[k, ..., :h, :w].copy_(v[0] if squeeze else v)
        valid[k, :h, :w] = True
    return out, valid


def collate_fields(samples, layout: SampleLayout, padding=None, image_into=None) -> Batch:
    """``samples`` (dicts of named fields) -> ``Batch``. ``padding``: (pad_value, multiple_of) for
    collate=pad; ``image_into(values, layout) -> tensor``: how the input image is stacked (the uint8 pool)."""
    out, valid = {}, None
    for name, kind in layout.kinds:
        values = [s[name] for s in samples]
        if kind in ("image", "mask"):
            squeeze = kind == "mask"
            if padding is not None:
                fill = layout.ignore.get(name, 255) if squeeze else padding[0]
                out[name], here = pad(values, fill, padding[1], squeeze)
                valid = here if valid is None else valid
            elif name == layout.x and image_into is not None:
                out[name] = image_into(values)
            else:
                out[name] = stack(name, values, squeeze)
        elif kind == "class":
            out[name] = torch.as_tensor(values, dtype=torch.int64)
        elif kind == "number":
            out[name] = torch.as_tensor(values, dtype=torch.float32)
        elif kind in ("classes", "vector"):
            out[name] = stack(name, [torch.as_tensor(v, dtype=torch.float32) for v in values])
        elif kind == "boxes":
            out[name] = pack_targets([plain_target(v) for v in values])
        else:  # text, json
            out[name] = list(values)
    for extra in ("part",):  # what SampleDataset adds to a mix's val and test samples
        if extra in samples[0]:
            out[extra] = torch.as_tensor([s[extra] for s in samples], dtype=torch.int64)
    if valid is not None:
        out["valid"] = valid
    return Batch.of(out, layout.x, layout.y)


def plain_target(target: dict) -> dict:
    """A detection target as a batch holds it: the same dict, its ``BoundingBoxes`` kept (their format and
    canvas size travel with them), each tensor contiguous so it crosses from a worker once."""
    from torchvision import tv_tensors

    def plain(v):
        if isinstance(v, tv_tensors.TVTensor):
            return tv_tensors.wrap(v.as_subclass(torch.Tensor).contiguous(), like=v)
        return v.contiguous() if isinstance(v, torch.Tensor) else v

    boxes = len(target["boxes"])
    for key in ("labels", "iscrowd", "area", "masks"):
        if key in target and len(target[key]) != boxes:  # the model would pair each box with another's label
            raise RuntimeError(
                f"a detection target holds {boxes} boxes but {len(target[key])} {key}: a transform dropped boxes "
                f"and not their {key}; drop degenerate boxes with feedline.transforms.SanitizeBoxes, which drops both"
            )
    return {k: plain(v) for k, v in target.items()}


_PACKED = ("boxes", "labels", "iscrowd", "area")  # the per-box tensors a batch's targets share segments for


def pack_targets(targets: list[dict]) -> list[dict]:
    """A batch's detection targets with each per-box key's tensors in one segment (shared memory inside a
    worker), every target holding a view of its rows: the batch crosses to the main process as a few segments,
    not four per image. The targets are otherwise as they were (``BoundingBoxes`` keep their metadata)."""
    from torchvision import tv_tensors

    out = [dict(t) for t in targets]
    for key in _PACKED:
        values = [t.get(key) for t in targets]
        if any(v is None for v in values):
            continue
        first = values[0]
        if any(v.shape[1:] != first.shape[1:] or v.dtype != first.dtype for v in values):
            continue
        total = sum(len(v) for v in values)
        if not total:
            continue
        buffer = empty((total, *first.shape[1:]), first.dtype)
        start = 0
        for target, value in zip(out, values):
            rows = buffer[start : start + len(value)]
            rows.copy_(value.as_subclass(torch.Tensor))
            target[key] = (
                tv_tensors.wrap(rows, like=value) if isinstance(value, tv_tensors.TVTensor) else rows
            )
            start += len(value)
    return out


def infer_layout(sample: dict) -> SampleLayout:
    """A layout read from one sample's values, for a collate the datamodule has not bound: images and masks
    by their tv_tensors type, ints as classes, floats as numbers, strings as text, other tensors as vectors,
    anything else as json. ``x`` is the first image; ``y`` is ``label`` where there is one, else the first
    other field."""
    from torchvision import tv_tensors

    kinds = []
    for name, value in sample.items():
        if name == "part":
            continue
        if isinstance(value, (tv_tensors.Mask, PendingMask)):
            kind = "mask"
        elif isinstance(value, dict) and isinstance(value.get("boxes"), tv_tensors.BoundingBoxes):
            kind = "boxes"
        elif pending(value) or isinstance(value, torch.Tensor) and value.dim() == 3:
            kind = "image"
        elif isinstance(value, torch.Tensor):
            kind = "vector"
        elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
            kind = "json"
        else:
            kind = {int: "class", float: "number", str: "text"}[type(value)]
        kinds.append((name, kind))
    images = [name for name, kind in kinds if kind == "image"]
    if not images:
        raise TypeError(f"a sample of fields {', '.join(sample)} has no image (a uint8 (C, H, W) tensor)")
    others = [name for name, _ in kinds if name != images[0]]
    y = "label" if "label" in others else (others[0] if others else images[0])
    return SampleLayout(x=images[0], y=y, kinds=tuple(kinds))

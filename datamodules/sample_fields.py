"""A record of named fields -> a sample the transform stack moves together (``datasets/fields.py``).

Images become ``tv_tensors.Image`` and masks ``tv_tensors.Mask``: torchvision v2 dispatches on those types, so
one stack crops, resizes and flips a mask with its image (nearest-neighbour for the mask) and leaves the other
fields alone. Class lists become multi-hot vectors here, so the collate only stacks.

A boxes field becomes torchvision's detection target (``transforms/boxes.py``), on its image's canvas: its
``BoundingBoxes`` move with every crop, resize and flip. It is decoded once the image's size is known.

The reduced-size JPEG decode applies where the image is the only field a crop moves: beside a mask or boxes,
they would no longer line up, so the image decodes at full size.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from torchvision import tv_tensors

from feedline.datasets.fields import GEOMETRIC, SPATIAL, Fields
from feedline.transforms.boxes import decode_boxes
from feedline.transforms.decode import DecodeError, decode
from feedline.transforms.field_collate import SampleLayout
from feedline.transforms.masks import decode_mask


class FieldDecoder:
    """``record -> sample``: each field decoded by its kind, a mask checked against its image's size. Bad
    values raise ``DecodeError`` naming the field; ``SampleDataset`` names the sample and applies
    ``data.on_bad_sample``."""

    def __init__(self, fields: Fields):
        self.fields = fields
        self.kinds = [(f.name, f.kind, len(f.classes or ())) for f in fields.values()]
        self.ignore = {f.name: f.ignore_index for f in fields.of_kind("mask")}
        self.single_spatial = len(fields.of_kind(*GEOMETRIC)) == 1
        self.formats = {f.name: f.format for f in fields.of_kind("boxes")}
        # Beside a mask, an image is turned as its EXIF orientation says: masks are drawn on the photo as
        # viewers show it, and a PNG mask has no orientation of its own.
        self.exif = bool(fields.of_kind("mask"))

    def layout(self) -> SampleLayout:
        return layout_of(self.fields)

    def __call__(self, record, floor=None, max_pixels: int | None = None, timings=None) -> dict:
        """``timings`` (bench.py's stage breakdown): ``(clock, seconds)``; each field's decode time is added
        to ``seconds`` under its stage: ``decode`` for the input image, ``decode <name>`` for another image
        or a mask, ``fields`` for the rest together."""
        if not isinstance(record, dict):
            raise TypeError(
                f"a source with fields ({', '.join(self.fields)}) must read each sample as a dict of them, "
                f"got a {type(record).__name__}"
            )
        sample = {}
        size = None
        boxes = None
        for name, kind, count in self.kinds:
            if name not in record:  # a reader's bug, not bad data: never skipped
                raise KeyError(
                    f"the source's record has no field {name!r} (it holds {', '.join(record)}); a source with "
                    f"fields ({', '.join(self.fields)}) must read each of them for every sample"
                )
            value = record[name]
            if kind == "boxes":  # on its image's canvas: decoded once the image's size is known
                boxes = (name, count, value)
                sample[name] = None
                continue
            if timings is not None:
                t0 = timings[0]()
            try:
                if kind == "image":
                    image = decode(value, floor if self.single_spatial else None, max_pixels, self.exif)
                    value = tv_tensors.Image(image)
                elif kind == "mask":
                    value = tv_tensors.Mask(
                        _indices(decode_mask(value, max_pixels), count, self.ignore[name])
                    )
                elif kind == "class":
                    value = _class(value, count)
                elif kind == "classes":
                    value = _multi_hot(value, count)
                elif kind == "number":
                    value = _finite(float(value))
                elif kind == "vector":
                    value = _finite(torch.as_tensor(np.asarray(value, dtype=np.float32).reshape(-1)))
                elif kind == "text":
                    value = value.decode() if isinstance(value, bytes) else str(value)
                elif kind == "json":
                    value = json.loads(value) if isinstance(value, (str, bytes)) else value
            except DecodeError as err:
                raise DecodeError(f"field {name!r}: {err}") from err
            except (ValueError, TypeError) as err:
                raise DecodeError(f"field {name!r} ({kind}): {err}") from err
            if timings is not None:
                clock, seconds = timings
                stage = self.stage_of(name, kind)
                seconds[stage] = seconds.get(stage, 0.0) + clock() - t0
            if kind in SPATIAL:
                here = tuple(value.shape[-2:])
                if size is None:
                    size = (name, here)
                elif here != size[1]:
                    turned = " (its transpose: a photo turned by an EXIF tag the mask was not drawn on?)"
                    raise DecodeError(
                        f"field {name!r} is {here[1]}x{here[0]} but {size[0]!r} is {size[1][1]}x{size[1][0]}: "
                        f"a mask must have its image's size{turned if here == size[1][::-1] else ''}"
                    )
            sample[name] = value
        if boxes is not None:
            name, count, value = boxes
            t0 = timings[0]() if timings is not None else 0.0
            canvas = tuple(sample[self.fields.input].shape[-2:])
            try:
                sample[name] = decode_boxes(value, self.formats[name], canvas, count)
            except DecodeError as err:
                raise DecodeError(f"field {name!r}: {err}") from err
            except (ValueError, TypeError) as err:
                raise DecodeError(f"field {name!r} (boxes): {err}") from err
            if timings is not None:
                clock, seconds = timings
                stage = self.stage_of(name, "boxes")
                seconds[stage] = seconds.get(stage, 0.0) + clock() - t0
        return sample

    def stage_of(self, name: str, kind: str) -> str:
        if kind in GEOMETRIC:
            return "decode" if name == self.fields.input else f"decode {name}"
        return "fields"


def _indices(mask: torch.Tensor, count: int, ignore: int) -> torch.Tensor:
    """A mask whose every pixel is a class index or the ignore_index; a value beyond the class list would fail
    the loss far from its file (on a GPU, as a device-side assert)."""
    if count and int(mask.max()) >= count:
        beyond = mask[(mask >= count) & (mask != ignore)]
        if len(beyond):
            raise DecodeError(
                f"mask value {int(beyond.max())} is not a class index ({count} classes, 0..{count - 1}; "
                f"ignore_index {ignore}): check the mask, or the field's classes and ignore_index"
            )
    return mask


def _finite(value):
    finite = bool(torch.isfinite(value).all()) if isinstance(value, torch.Tensor) else np.isfinite(value)
    if not finite:
        raise DecodeError(f"{value!r} is not finite (NaN and infinities would turn the loss NaN)")
    return value


def _class(value, count: int) -> int:
    label = int(value)
    if count and not 0 <= label < count:
        raise DecodeError(f"class index {label} is not in 0..{count - 1}")
    return label


def _multi_hot(value, count: int) -> torch.Tensor:
    indices = torch.as_tensor(np.asarray(value, dtype=np.int64).reshape(-1))
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= count):
        raise DecodeError(f"class indices {indices.tolist()} are not all in 0..{count - 1}")
    hot = torch.zeros(count, dtype=torch.float32)
    hot[indices] = 1.0
    return hot


def layout_of(fields: Fields) -> SampleLayout:
    """What the collate needs to know of ``fields``: names and kinds, ``x``, ``y`` and each mask's pad value."""
    return SampleLayout(
        x=fields.input,
        y=fields.target,
        kinds=tuple((f.name, f.kind) for f in fields.values()),
        ignore={f.name: f.ignore_index for f in fields.of_kind("mask")},
    )

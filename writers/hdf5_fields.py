"""Writing a sample's named fields beside the images of an HDF5 file (the layout ``datasets/hdf5/columns.py``
reads back).

Worker side (``prepared``): each field's value checked against its kind (a class index out of range, a
number that is not one, a mask whose size is not its image's: the sample is skipped and listed, naming the
field), and a mask resized or cropped exactly as its image was, nearest-neighbour, and stored as PNG bytes.
Writer side (``FieldColumns``): one dataset per field, grown as chunks arrive, each with its ``kind`` and
``classes`` attributes; the file's ``fields`` and ``target`` attributes name them all, so ``source=hdf5``
reads the file back without ``source.fields``.
"""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.io import encode_png
from torchvision.transforms.v2 import functional as F

from feedline.datasets.fields import Fields
from feedline.datasets.hdf5.columns import FIELDS_ATTR, TARGET_ATTR
from feedline.datasets.records import BadInput
from feedline.transforms.masks import decode_mask

TAKEN = ("images", "offsets", "shapes", "labels")  # the file's own datasets: a field is stored beside them


def column_of(name: str) -> str:
    return f"field_{name}" if name in TAKEN else name


def prepared(fields: Fields, record: dict, size: tuple[int, int], geometry) -> dict:
    """The fields of ``record`` but the input image, as stored: ``geometry(tensor)`` resizes or crops a mask
    as its image was (``size``: the image's size before). A value its kind cannot hold is a BadInput naming
    the field: the sample is skipped and listed."""
    out = {}
    for field in fields.values():
        if field.name == fields.input:
            continue
        if field.name not in record:
            raise BadInput(f"field {field.name!r} is missing from the sample (it holds {', '.join(record)})")
        value, kind = record[field.name], field.kind
        try:
            out[field.name] = _stored(value, kind, len(field.classes or ()), size, geometry)
        except (TypeError, ValueError, RuntimeError) as err:
            raise BadInput(f"field {field.name!r} ({kind}): {err}") from None
    return out


SHARED = ("image", "mask", "number", "vector", "class", "classes")  # kinds every writer stores alike


def stored_value(value, kind: str, count: int, size, geometry):
    """A value of one of the ``SHARED`` kinds as a writer stores it (HDF5 and shards alike): an image or mask
    moved by ``geometry`` (its image's resize) and encoded as PNG, a finite number, a float32 vector, a class
    index or an int64 array of class indices checked against ``count`` classes. Raises ValueError naming what
    is wrong."""
    if kind in ("mask", "image"):
        tensor = decode_mask(value) if kind == "mask" else None
        if tensor is None:
            from feedline.transforms.decode import decode

            tensor = decode(value)
        if tuple(tensor.shape[-2:]) != tuple(size):
            h, w = tensor.shape[-2:]
            raise ValueError(f"its size {w}x{h} differs from the image's, {size[1]}x{size[0]}")
        wrapped = tv_tensors.Mask(tensor) if kind == "mask" else tv_tensors.Image(tensor)
        return encode_png(torch.as_tensor(geometry(wrapped)).contiguous()).numpy().reshape(-1)
    if kind == "number":
        number = float(value)
        if math.isnan(number):
            raise ValueError("NaN is not a number")
        return number
    if kind == "vector":
        return np.ascontiguousarray(value, dtype=np.float32).reshape(-1)
    if kind == "class":
        index = int(value)
        if not 0 <= index < count:
            raise ValueError(f"class index {index} is not in 0..{count - 1}")
        return index
    if kind == "classes":
        indices = np.ascontiguousarray(value, dtype=np.int64).reshape(-1)
        bad = indices[(indices < 0) | (indices >= count)]
        if len(bad):
            raise ValueError(f"class index {int(bad[0])} is not in 0..{count - 1}")
        return indices
    raise TypeError(f"stored_value stores {', '.join(SHARED)}, not {kind}")


def _stored(value, kind: str, count: int, size, geometry):
    if kind in SHARED:
        return stored_value(value, kind, count, size, geometry)
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError("it holds a NUL character, which HDF5's strings cannot store")
    return value


class FieldColumns:
    """One growing dataset per field (but the input image, which the writer stores as ``images``)."""

    def __init__(self, f: h5py.File, fields: Fields):
        self.f, self.fields = f, fields
        self.rows = 0
        self.data: dict[str, h5py.Dataset] = {}

    def append(self, records: list[dict]) -> None:
        for field in self.fields.values():
            if field.name == self.fields.input:
                continue
            values = [r[field.name] for r in records]
            data = self._dataset(field, values[0])
            data.resize(self.rows + len(values), axis=0)
            if field.kind == "vector":
                widths = {len(v) for v in values} - {data.shape[1]}
                if widths:
                    raise ValueError(
                        f"field {field.name!r} (vector): a sample holds {widths.pop()} values, the first "
                        f"{data.shape[1]}: every vector of a field has one length"
                    )
                data[self.rows :] = np.stack(values)
            elif data.dtype.kind == "O" and field.kind not in ("text", "json"):
                for k, v in enumerate(values):  # variable-length rows: h5py takes them one by one
                    data[self.rows + k] = v
            else:
                data[self.rows :] = values
        self.rows += len(records)

    def _dataset(self, field, first) -> h5py.Dataset:
        if field.name in self.data:
            return self.data[field.name]
        kind = field.kind
        dtype = {
            "mask": h5py.vlen_dtype(np.uint8),
            "image": h5py.vlen_dtype(np.uint8),
            "classes": h5py.vlen_dtype(np.int64),
            "number": np.float64,
            "class": np.int64,
            "vector": np.float32,
            "text": h5py.string_dtype(),
            "json": h5py.string_dtype(),
        }[kind]
        shape = (len(first) if first is not None else 0,) if kind == "vector" else ()
        data = self.f.create_dataset(
            column_of(field.name), shape=(0, *shape), maxshape=(None, *shape), dtype=dtype, chunks=True
        )
        data.attrs["kind"] = kind
        if field.classes is not None:
            data.attrs["classes"] = json.dumps(list(field.classes), ensure_ascii=False)
        self.data[field.name] = data
        return data

    def finish(self) -> dict:
        """Every field's dataset made (a file with no rows still names them), and the file's attributes
        naming the fields: returned, to be written with the file's others."""
        for field in self.fields.values():
            if field.name != self.fields.input:
                self._dataset(field, None)
        specs = {
            f.name: {
                "column": "images" if f.name == self.fields.input else column_of(f.name),
                "kind": f.kind,
                "classes": None if f.classes is None else list(f.classes),
                **({"ignore_index": f.ignore_index} if f.kind == "mask" else {}),
            }
            for f in self.fields.values()
        }
        return {FIELDS_ATTR: json.dumps(specs, ensure_ascii=False), TARGET_ATTR: self.fields.target}


def mask_geometry(options, image_size: tuple[int, int], shrink_to: tuple[int, int] | None):
    """What the writer does to an image's geometry, as a function of a mask or image tv_tensor: the raw
    centre-cropped squares of ``out.size``, or the resize to ``shrink_to`` (``out.max_side``), else nothing."""
    if options.mode == "raw" and options.size:
        side = int(options.size)
        return lambda t: F.center_crop(F.resize(t, side, antialias=True), [side, side])
    if shrink_to is not None and tuple(shrink_to) != tuple(image_size):
        return lambda t: F.resize(t, list(shrink_to), antialias=True)
    return lambda t: t

"""One sample of named fields as the shards writer stores it: a dict in LitData's format (the table in
``datasets/shards/fields.py``), its image resized as ``out.max_side`` says and every field moved with it.

    image     the file's bytes as they are, or JPEG once resized (PNG from raw pixels), as 1-D uint8
    mask      resized nearest-neighbour as its image was (``hdf5_fields.mask_geometry``), PNG bytes, 1-D uint8
    boxes     coordinates scaled by the image's own factors (x by its width's, y by its height's: right for XYXY,
              XYWH and CXCYWH alike), area by both; instance masks resized nearest-neighbour; M = 0 kept
    the rest  checked against its kind (a class index in range, a finite number), as the HDF5 writer checks

A value its kind cannot hold is a BadInput naming the field: the sample is skipped and listed. A boxes field
holds in every sample the optional arrays the first sample holds (``box_spec``): LitData fixes a sample's
structure from the first one it writes, so a sample without one of them gets its neutral value (iscrowd 0 per
box, area each box's own, image_id -1); one without instance masks (no neutral value) or with an array the
first sample lacks is skipped and listed, naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.io import encode_jpeg, encode_png

from feedline.datasets.fields import Fields
from feedline.datasets.records import BadInput
from feedline.datasets.shards.fields import BOX_KEYS
from feedline.transforms.decode import DecodeError, decode
from feedline.writers.hdf5_fields import SHARED, mask_geometry, stored_value
from feedline.writers.prepare import encoded_bytes, shrink, shrunk_size

PROBED = 16  # rows read to find what a boxes field's samples hold, before the first one that reads


def box_spec(records, fields: Fields, rows) -> dict:
    """Per boxes field, what every sample of it stores: ``{"keys": [optional keys], "masks": form}``, from
    the first of the first ``PROBED`` rows that reads (none: boxes and labels only)."""
    names = [f.name for f in fields.of_kind("boxes")]
    if not names:
        return {}
    for row in list(rows)[:PROBED]:
        try:
            record = records[int(row)]
        except (OSError, BadInput, DecodeError):
            continue
        out = {}
        for name in names:
            value = record.get(name) if isinstance(record, Mapping) else None
            value = value if isinstance(value, Mapping) else {}
            keys = [k for k in BOX_KEYS if value.get(k) is not None]
            spec = {"keys": keys}
            if "masks" in keys:
                spec["masks"] = "array" if isinstance(value["masks"], np.ndarray) else "segmentation"
            out[name] = spec
        return out
    return {name: {"keys": []} for name in names}


def prepared_sample(record, fields: Fields, options, boxes: dict) -> dict:
    """``record`` (a source's dict of named fields) as stored, or a BadInput / DecodeError / OSError."""
    if not isinstance(record, Mapping):
        raise BadInput(
            f"expected a sample of named fields ({', '.join(fields)}), got {type(record).__name__}"
        )
    missing = [name for name in fields if name not in record]
    if missing:
        raise BadInput(f"field {missing[0]!r} is missing from the sample (it holds {', '.join(record)})")
    payload = record[fields.input]
    # beside a mask, a photo is turned as its EXIF tag says, as the reader turns it (sample_fields.py)
    image = decode(payload, exif=bool(fields.of_kind("mask")))
    size = tuple(int(d) for d in image.shape[-2:])
    side = int(options.max_side or 0)
    target = shrunk_size(*size, side) if side else size
    geometry = mask_geometry(options, size, target if target != size else None)
    out = {}
    for name, field in fields.items():
        if name == fields.input:
            data = encoded_bytes(payload)
            if target != size:
                data = encode_jpeg(shrink(image, side), quality=int(options.quality)).numpy()
            elif data is None:  # raw pixels: a stored image is a file
                data = encode_png(image.contiguous()).numpy()
            out[name] = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
            continue
        try:
            out[name] = _stored(field, record[name], size, target, geometry, boxes.get(name) or {"keys": []})
        except (TypeError, ValueError, RuntimeError, KeyError, DecodeError) as err:
            raise BadInput(f"field {name!r} ({field.kind}): {err}") from None
    return out


def _stored(field, value, size, target, geometry, spec: dict):
    kind, count = field.kind, len(field.classes or ())
    if kind in SHARED:
        return stored_value(value, kind, count, size, geometry)
    if kind == "boxes":
        return _boxes(value, count, size, target, geometry, spec, str(field.format or "XYXY").upper())
    if not isinstance(value, str):  # text, json
        raise TypeError(f"expected text, got {type(value).__name__}")
    if os.path.isfile(value):  # LitData's writer would store that file's bytes in its place
        raise ValueError(
            f"{value!r} is the path of a file here, which LitData's writer embeds instead of the text"
        )
    return value


def _indices(value, count: int, what: str) -> np.ndarray:
    indices = np.ascontiguousarray(value, dtype=np.int64).reshape(-1)
    bad = indices[(indices < 0) | (indices >= count)]
    if len(bad):
        raise ValueError(f"{what} {int(bad[0])} is not in 0..{count - 1}")
    return indices


def _neutral(key: str, boxes: np.ndarray, fmt: str):
    """What a sample without ``key`` stores in its place where the first sample holds it: iscrowd 0 per box,
    area each box's own (from its coordinates, in the field's format, at the stored size), image_id -1."""
    if key == "iscrowd":
        return np.zeros(len(boxes), dtype=np.uint8)
    if key == "area":
        if fmt == "XYXY":
            w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        else:  # XYWH, CXCYWH: width and height are the last two columns
            w, h = boxes[:, 2], boxes[:, 3]
        return np.ascontiguousarray(w * h, dtype=np.float32)
    return -1  # image_id


def _boxes(value, count: int, size, target, geometry, spec: dict, fmt: str = "XYXY") -> dict:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a dict of boxes and labels, got {type(value).__name__}")
    boxes = np.array(value["boxes"], dtype=np.float32)
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes of shape {boxes.shape}, not (M, 4)")
    if not np.isfinite(boxes).all():
        raise ValueError("a box coordinate is not a finite number")
    labels = _indices(value["labels"], count, "box label")
    m = len(boxes)
    if len(labels) != m:
        raise ValueError(f"{m} boxes with {len(labels)} labels")
    keys = list(spec["keys"])
    absent = [k for k in keys if value.get(k) is None]
    extra = [k for k in BOX_KEYS if value.get(k) is not None and k not in keys]
    if "masks" in absent:
        raise ValueError(
            "it holds no 'masks', and the dataset's first sample does: instance masks have no neutral value to "
            "fill in, and every sample of a shards dataset holds the same arrays (LitData fixes them from the "
            "first sample)"
        )
    if extra:
        raise ValueError(
            f"it holds {extra[0]!r}, and the dataset's first sample does not: the first sample's keys "
            f"({', '.join(['boxes', 'labels', *keys])}) fix the structure of every sample of a shards dataset "
            "(LitData fixes it from the first sample); give every sample the key, or none"
        )
    sy, sx = target[0] / size[0], target[1] / size[1]
    boxes[:, 0::2] *= sx  # x (and width) columns in every format; y (and height) below
    boxes[:, 1::2] *= sy
    out = {"boxes": boxes, "labels": labels}
    for key in absent:  # an optional array the first sample holds: its neutral value, stored as it is
        out[key] = _neutral(key, boxes, fmt)
    for key in keys:
        if key in absent:
            continue
        item = value[key]
        if key == "image_id":
            out[key] = int(item)
            continue
        if key == "masks":
            out[key] = _masks(item, m, size, target, geometry, spec.get("masks"))
            continue
        array = np.ascontiguousarray(item, dtype=np.uint8 if key == "iscrowd" else np.float32).reshape(-1)
        if len(array) != m:
            raise ValueError(f"{len(array)} values of {key} for {m} boxes")
        out[key] = array * np.float32(sx * sy) if key == "area" else array
    return out


def _masks(item, m: int, size, target, geometry, form):
    """Instance masks: a uint8 (M, H, W) array resized nearest-neighbour, or COCO segmentations as JSON text
    (polygons scaled; an RLE cannot be, so it is refused where the image is resized)."""
    if form == "array":
        if not isinstance(item, np.ndarray):
            raise TypeError(f"masks are {type(item).__name__}, the first sample's an array")
        masks = np.asarray(item, dtype=np.uint8)
        if masks.size == 0:
            masks = masks.reshape(0, *size)
        if masks.ndim != 3 or len(masks) != m or tuple(masks.shape[1:]) != size:
            raise ValueError(f"masks of shape {masks.shape}, not ({m}, {size[0]}, {size[1]})")
        if target == size:
            return np.ascontiguousarray(masks)
        return np.ascontiguousarray(
            torch.as_tensor(geometry(tv_tensors.Mask(torch.from_numpy(masks)))).numpy()
        )
    if isinstance(item, np.ndarray) or len(item) != m:
        raise ValueError(f"masks are not a list of {m} COCO segmentations, as the first sample's")
    sy, sx = target[0] / size[0], target[1] / size[1]
    if target != size:
        scaled = []
        for seg in item:
            if not isinstance(seg, list):
                raise ValueError("an RLE segmentation cannot be resized: convert without out.max_side")
            scaled.append(
                [[float(v) * (sx if k % 2 == 0 else sy) for k, v in enumerate(poly)] for poly in seg]
            )
        item = scaled
    return json.dumps(item, default=_plain)


def _plain(value):
    if isinstance(value, bytes):
        return value.decode("ascii")
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")

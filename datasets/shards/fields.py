"""A shards dataset of named fields (``feedline-shards/2``): the schema its sidecar records, and each sample
read back as the record a source of fields reads (``datasets/fields.py``).

    feedline.json   "fields": {name: {"kind", "classes", "ignore_index" (mask), "format" (boxes),
                                      "keys" (boxes: the optional arrays every sample holds)}},
                    "target": name, "classes": the target's class list (empty for a target without one)
    a sample        a dict in LitData's format, one entry per field (``leaves.py``):

    kind      stored as (LitData's serializer)                   read back as
    image     the file's bytes, 1-D uint8 (no_header_numpy:4)   1-D uint8 array (a view of the chunk)
    mask      the PNG's bytes, 1-D uint8 (no_header_numpy:4)    1-D uint8 array
    class     int (int)                                          int
    classes   int64 indices (no_header_numpy:3)                  int64 array
    number    float (float)                                      float
    vector    float32 (no_header_numpy:9)                        float32 array
    text      str (str)                                          str
    json      JSON text (str)                                    str
    boxes     {"boxes": float32 (M, 4) (numpy), "labels": int64 (M,), and where the sidecar's "keys" list them
               "iscrowd": uint8 (M,), "area": float32 (M,), "image_id": int, "masks": uint8 (M, H, W) (numpy)
               or COCO segmentations as JSON text (str)}        the same, masks parsed back to a list

Images and masks are arrays, not ``bytes``: LitData stores a dict of only bytes, text and numbers as an
Arrow table with no per-sample bytes (its "footer" chunks), which only LitData reads; a 1-D array keeps its
layout the one ``leaves.py`` reads. ``labels.npy`` holds per sample the target's class index for a class
target (the splits stratify on it), else 0 (one stratum: the splits are a seeded share of every sample).
"""

from __future__ import annotations

import json
from dataclasses import fields as dataclass_fields

import numpy as np

from feedline.datasets.fields import Field, Fields
from feedline.datasets.records import BadInput

BOX_KEYS = ("iscrowd", "area", "image_id", "masks")  # what a boxes field may hold beside boxes and labels
BOX_FORMATS = ("XYXY", "XYWH", "CXCYWH")
SPEC_KEYS = {"kind", "classes", "ignore_index", "format", "keys", "masks"}


def schema(fields: Fields, boxes: dict | None = None) -> dict:
    """What the sidecar records of ``fields`` (``boxes``: per boxes field, its optional keys and masks form)."""
    out = {}
    for f in fields.values():
        spec = {"kind": f.kind, "classes": None if f.classes is None else list(f.classes)}
        if f.kind == "mask":
            spec["ignore_index"] = int(f.ignore_index)
        if f.kind == "boxes":
            spec["format"] = str(getattr(f, "format", None) or "XYXY").upper()
            spec.update((boxes or {}).get(f.name) or {"keys": []})
        out[f.name] = spec
    return out


def fields_of_schema(specs, target, shown: str) -> Fields:
    """The ``Fields`` a sidecar records, or a ValueError naming it (``shown``) and the entry."""

    def bad(why: str) -> ValueError:
        return ValueError(
            f"{shown}: {why}; the sidecar was edited or damaged: copy the dataset again, or convert it again"
        )

    if not isinstance(specs, dict) or not specs or not isinstance(target, str):
        raise bad("its fields are not an object of field specs beside a target name")
    built = []
    for name, spec in specs.items():
        if not isinstance(spec, dict) or set(spec) - SPEC_KEYS or "kind" not in spec:
            raise bad(f"fields.{name} is not a field spec ({', '.join(sorted(SPEC_KEYS))})")
        classes = spec.get("classes")
        if classes is not None and not (
            isinstance(classes, list) and all(isinstance(c, str) for c in classes)
        ):
            raise bad(f"fields.{name}.classes is not a list of class names")
        extra = {}
        if spec["kind"] == "boxes":
            if spec.get("format") not in BOX_FORMATS:
                raise bad(
                    f"fields.{name}.format={spec.get('format')!r} is not one of {', '.join(BOX_FORMATS)}"
                )
            keys = spec.get("keys")
            if not isinstance(keys, list) or set(keys) - set(BOX_KEYS):
                raise bad(f"fields.{name}.keys={keys!r} is not a list of {', '.join(BOX_KEYS)}")
            if "format" in {f.name for f in dataclass_fields(Field)}:
                extra["format"] = spec["format"]
        try:
            built.append(
                Field(
                    name=str(name),
                    kind=str(spec["kind"]),
                    classes=None if classes is None else tuple(classes),
                    ignore_index=int(spec.get("ignore_index", 255)),
                    **extra,
                )
            )
        except (TypeError, ValueError) as err:
            raise bad(f"fields.{name}: {err}") from None
    try:
        return Fields(built, target, f"{shown} fields")
    except ValueError as err:
        raise bad(str(err)) from None


def check_layout(layout, fields: Fields, specs: dict, shown: str) -> None:
    """The chunks' leaves (``leaves.layout_of``) are the fields the sidecar records, or a ValueError: the
    index and sidecar of two conversions."""
    want = set()
    for name, f in fields.items():
        if f.kind == "boxes":
            want |= {(name, key) for key in ("boxes", "labels", *specs[name].get("keys", []))}
        else:
            want.add((name,))
    have = {path for path, _ in layout}
    if have != want:
        show = lambda paths: ", ".join(sorted(".".join(p) for p in paths))  # noqa: E731
        raise ValueError(
            f"{shown}: index.json's samples hold {show(have)}, feedline.json's fields {show(want)}: its files are "
            f"not of one conversion (copied together from two, or edited); convert it again"
        )


def record_of(sample: dict, fields: Fields) -> dict:
    """A decoded sample (``leaves.decode_sample``) as the record of the contract, or a BadInput."""
    record = {}
    for name, f in fields.items():
        value = sample[name]
        if f.kind == "boxes":
            value = dict(value)
            boxes = value["boxes"]
            if boxes.ndim != 2 or boxes.shape[1] != 4 or len(value["labels"]) != len(boxes):
                raise BadInput(
                    f"field {name!r}: boxes of shape {boxes.shape} with {len(value['labels'])} labels"
                )
            if isinstance(value.get("masks"), str):
                try:
                    value["masks"] = json.loads(value["masks"])
                except ValueError as err:
                    raise BadInput(f"field {name!r}: its segmentations are not JSON ({err})") from None
        elif f.kind in ("image", "mask") and not (isinstance(value, np.ndarray) and value.dtype == np.uint8):
            raise BadInput(f"field {name!r} ({f.kind}) is not stored as bytes")
        record[name] = value
    return record

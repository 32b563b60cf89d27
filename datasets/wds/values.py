"""What one WebDataset member holds, read as the kind of the field it fills (``source.fields.<name>.column``
names the member by its extension: ``jpg``, ``seg.png``, ``cls``, ``json``, ``txt``).

    kind      the member                                           the record's value
    image     an encoded image                                     its bytes (uint8, 1-D)
    mask      an encoded PNG of class indices                      its bytes
    class     a class name or number as text (``.cls``), or JSON:  its index in the field's classes
              a name, a number, or an object whose ``label_key``
              holds one
    classes   names split by the field's separator, or JSON: a     int64 indices of the classes present
              list, or an object whose ``label_key`` holds one
    number    a number as text                                     float
    vector    a JSON list, or numbers split by spaces              float32 (D,)
    text      UTF-8 text                                           str
    json      JSON text                                            the text, checked to parse
    boxes     JSON {"boxes": [[4 numbers], ...] in the field's     {"boxes": float32 (M, 4), "labels": int64 (M,),
              format, "labels": [name or number, ...], optional    optional "iscrowd" uint8, "area" float32,
              "iscrowd": [0/1, ...], "area": [...], "image_id"}    "image_id" int (else the sample's row)}

A member that does not read as its kind is ``BadInput``; the caller names the tar, the sample and the member.
"""

from __future__ import annotations

import json
import math

import numpy as np

from feedline.datasets.records import BadInput

LABELLED = ("class", "classes", "boxes")  # kinds whose members name classes (a mask's are pixel values)


def _text(data: bytes) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInput(f"not UTF-8 text ({err})") from None


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError as err:
        raise BadInput(f"{text[:60]!r} is not JSON ({err})") from None


def _name(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or str(value).strip() == "":
        raise BadInput(f"{value!r} is not a class name or number")
    return str(value).strip()


def boxes_document(data: bytes) -> dict:
    document = _json(_text(data))
    if not isinstance(document, dict) or not isinstance(document.get("boxes"), list):
        raise BadInput('boxes are a JSON object {"boxes": [[x, y, w, h], ...], "labels": [...]}')
    if not isinstance(document.get("labels"), list) or len(document["labels"]) != len(document["boxes"]):
        raise BadInput(
            f"{len(document['boxes'])} boxes need as many labels (a list beside them), not "
            f"{document.get('labels')!r:.60}"
        )
    return document


def class_names(data: bytes, kind: str, label_key: str, separator: str = " ") -> list[str]:
    """The class names a member of a ``class``, ``classes`` or ``boxes`` field holds."""
    if kind == "boxes":
        return [_name(v) for v in boxes_document(data)["labels"]]
    text = _text(data).strip()
    value = _json(text) if text[:1] in ("[", "{", '"') else text
    if isinstance(value, dict):
        if label_key not in value:
            raise BadInput(f"the JSON object has no {label_key!r} (source.label_key)")
        value = value[label_key]
    if kind == "class":
        return [_name(value)]
    if isinstance(value, str):
        sep = separator.strip() or None  # a space: any run of whitespace
        return [n.strip() for n in value.split(sep) if n.strip()]
    if isinstance(value, list):
        return [_name(v) for v in value]
    raise BadInput(f"{value!r:.60} is not a list of class names")


def _is_index(name: str) -> bool:
    return name.isdigit() and (name == "0" or not name.startswith("0"))


class Lookup:
    """Class name -> index in a field's list; a number stands for its index where no class name is one."""

    def __init__(self, classes):
        self.index = {c: i for i, c in enumerate(classes)}
        self.by_number = not any(_is_index(c) for c in classes)

    def __call__(self, name: str, field: str) -> int:
        found = self.index.get(name)
        if found is None and self.by_number and _is_index(name) and int(name) < len(self.index):
            found = int(name)
        if found is None:
            shown = ", ".join(list(self.index)[:10]) + (" ..." if len(self.index) > 10 else "")
            raise BadInput(f"class {name!r} is not in the class list of field {field!r} ({shown})")
        return found


def _number(value) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise BadInput(f"{str(value)[:60]!r} is not a number") from None
    if not math.isfinite(number):
        raise BadInput(f"{str(value)[:60]!r} is not a finite number")
    return number


def read_value(data, kind: str, field, lookup: Lookup | None, label_key: str, row: int):
    """A member's bytes (uint8 array) -> the record's value of a field of ``kind``."""
    if kind in ("image", "mask"):
        return data
    if kind in ("class", "classes"):
        names = class_names(data, kind, label_key, field.separator)
        indices = [lookup(n, field.name) for n in names]
        return indices[0] if kind == "class" else np.asarray(indices, dtype=np.int64)
    if kind == "number":
        return _number(_text(data).strip())
    if kind == "vector":
        text = _text(data).strip()
        value = _json(text) if text.startswith("[") else text.split()
        if not isinstance(value, list):
            raise BadInput(f"{text[:60]!r} is not a vector (a JSON list, or numbers)")
        return np.asarray([_number(v) for v in value], dtype=np.float32)
    if kind == "text":
        return _text(data)
    if kind == "json":
        text = _text(data)
        _json(text)
        return text
    return _boxes(boxes_document(data), field, lookup, row)


def _boxes(document: dict, field, lookup: Lookup, row: int) -> dict:
    try:
        boxes = np.asarray(document["boxes"], dtype=np.float32).reshape(-1, 4)
    except (TypeError, ValueError):
        raise BadInput(f"boxes {str(document['boxes'])[:60]} are not lists of 4 numbers") from None
    if boxes.shape[0] != len(document["boxes"]):
        raise BadInput(f"boxes {str(document['boxes'])[:60]} are not lists of 4 numbers ({field.format})")
    if not np.isfinite(boxes).all():
        raise BadInput("a box holds a number that is not finite")
    out = {
        "boxes": boxes,
        "labels": np.asarray([lookup(_name(v), field.name) for v in document["labels"]], dtype=np.int64),
        "image_id": _image_id(document["image_id"]) if document.get("image_id") is not None else int(row),
    }
    for key, read, dtype in (("iscrowd", _crowd, np.uint8), ("area", _area, np.float32)):
        if key in document:
            given = document[key] if isinstance(document[key], list) else [document[key]]
            value = np.asarray([read(v) for v in given], dtype=dtype).reshape(-1)
            if len(value) != len(boxes):
                raise BadInput(f"{key} lists {len(value)} values for {len(boxes)} boxes")
            out[key] = value
    return out


def _image_id(value) -> int:
    """A boxes document's image_id: an integer, an integral float (7.0) or a digit string ("77"), within int64;
    anything else is refused, never replaced by the row."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value.strip())
    if number is None or not -(2**63) <= number < 2**63:
        raise BadInput(f"image_id {value!r:.40} is not an integer (an int64, or a string of digits)")
    return number


def _crowd(value) -> int:
    if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
        return int(value)
    raise BadInput(f"iscrowd lists {value!r:.40}: 0 or 1 (or true/false) per box")


def _area(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadInput(f"area lists {value!r:.40}: a finite number per box")
    return float(value)

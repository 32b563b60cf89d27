"""Named fields in an HDF5 file: which dataset holds each field, how it is stored, and reading a row of it.

A field's column is one dataset beside ``images`` (``source.fields``, or the ``fields`` attribute the writer
stores). How each kind may be stored (``STORES``), and what a record holds for it (``datasets/fields.py``):

    image    the images dataset (any layout ``layout.py`` reads)      encoded bytes or uint8 (C, H, W)
    mask     variable-length uint8 rows: encoded PNG bytes ("bytes")  bytes as uint8 (n,)
             or uint8 (N, H, W) pixels of class indices ("array")      uint8 (H, W)
    number   numbers (N,)                                             float
    vector   numbers (N, D)                                           float32 (D,)
    class    integers (N,), each in 0..C-1, checked when opened       int
    classes  variable-length integer rows ("ragged"), or (N, C) 0/1   int64 array of the indices present
             ("onehot")
    text     variable-length strings (UTF-8)                          str
    json     variable-length strings (JSON text)                      str

The writer stores on each column its ``kind`` (and ``classes``, JSON, where the kind has a class list); the
file's ``fields`` attribute (JSON: name -> column, kind, classes, ignore_index) and ``target`` name them all,
so a converted file reads back without ``source.fields``.
"""

from __future__ import annotations

import json

import h5py
import numpy as np

from feedline.datasets.fields import Fields, fields_from_config
from feedline.datasets.hdf5.attrs import _text, read_classes
from feedline.datasets.records import BadInput

FIELDS_ATTR, TARGET_ATTR = "fields", "target"  # the file's attributes naming its fields


def file_fields(attrs, where: str) -> tuple[dict, str | None] | None:
    """The file's own ``fields`` attribute (name -> spec) and ``target``, or None where it has none."""
    if FIELDS_ATTR not in attrs:
        return None
    text = _text(attrs[FIELDS_ATTR])
    try:
        specs = json.loads(text) if text is not None else None
    except ValueError:
        specs = None
    if not isinstance(specs, dict) or not all(isinstance(s, dict) for s in specs.values()):
        raise ValueError(
            f"{where}: its 'fields' attribute is not a JSON mapping of field name -> {{column, kind, ...}}: "
            "convert the file again, or name the fields with source.fields"
        )
    target = _text(attrs[TARGET_ATTR]) if TARGET_ATTR in attrs else None
    return specs, target


def resolve_fields(f: h5py.File, fields, target, where: str, images_key: str = "images") -> Fields | None:
    """The file's fields: ``source.fields`` (each labelled field's class list from its config, else from its
    column's ``classes`` attribute, else from the file's ``fields`` attribute; an image field without a
    column reads ``images_key``), else the file's ``fields`` attribute; None for a file of images and labels
    (classification)."""
    stored = file_fields(f.attrs, where)
    if fields is None:
        if stored is None:
            return None
        fields, target = stored[0], target or stored[1]
        key = f"{where}: its 'fields' attribute"
    else:
        key = "source.fields"
    by_column = {
        s.get("column") or n: s for n, s in (stored[0] if stored else {}).items() if isinstance(s, dict)
    }
    specs = {}
    for name, spec in dict(fields).items():
        spec = {"kind": spec} if isinstance(spec, str) else dict(spec)
        if spec.get("kind") == "image" and not spec.get("column"):
            spec["column"] = images_key
        column = spec.get("column") or name
        if spec.get("classes") is None and spec.get("kind") in ("class", "classes", "mask"):
            names = read_classes(f[column].attrs, f"{where}: dataset '{column}'") if column in f else None
            if names is None and by_column.get(column, {}).get("classes"):
                names = list(by_column[column]["classes"])
            if names is None and spec.get("kind") != "class":
                raise ValueError(
                    f"{where}: field {name!r} (dataset '{column}', kind {spec['kind']}) has no class list: "
                    f"set source.fields.{name}.classes=[...] (index -> name), or store a 'classes' attribute "
                    f"(a JSON list) on the dataset"
                )
            spec["classes"] = names
        specs[name] = spec
    out = fields_from_config(specs, target, key)
    for field in out.of_kind("class"):
        if field.classes is None:
            raise ValueError(
                f"{where}: field {field.name!r} (dataset '{field.source_column}', kind class) has no class "
                f"list: set source.fields.{field.name}.classes=[...], or store a 'classes' attribute on it"
            )
    return out


def inspect_columns(f: h5py.File, fields: Fields, n: int, where: str) -> dict:
    """name -> (column, kind, store) of every field but the input image, each checked: there, N rows,
    a type its kind can be read from, class indices in range (read once, here, in the main process)."""
    columns = {}
    for field in fields.values():
        if field.name == fields.input:
            continue
        column, kind = field.source_column, field.kind
        shown = f"{where}: dataset '{column}' (field {field.name!r}, kind {kind})"
        if column not in f or not isinstance(f[column], h5py.Dataset):
            what = "is a group" if column in f else "is not there"
            raise KeyError(
                f"{shown} {what}: set source.fields.{field.name}.column to one of: {', '.join(f.keys())}"
            )
        data = f[column]
        if data.ndim == 0 or len(data) != n:
            raise ValueError(f"{shown} has {data.shape[0] if data.ndim else 0} rows, the images {n}")
        store = _store(data, kind, len(field.classes or ()), shown)
        if kind == "class":
            _check_classes(data[:], len(field.classes), shown)
        columns[field.name] = (column, kind, store)
    return columns


def _store(data, kind: str, num_classes: int, shown: str) -> str:
    vlen = h5py.check_vlen_dtype(data.dtype)
    string = h5py.check_string_dtype(data.dtype) is not None or (vlen is not None and vlen in (str, bytes))
    found = f"{data.dtype} {data.shape}"
    if kind in ("text", "json") and (string or data.dtype.kind in "OS"):
        return "text"
    if kind in ("mask", "image") and vlen is not None and np.dtype(vlen) == np.uint8:
        return "bytes"
    if kind == "mask" and data.ndim == 3 and data.dtype == np.uint8:
        return "array"
    if kind == "image" and data.ndim == 4 and data.dtype == np.uint8 and data.shape[-1] in (1, 3):
        return "array"
    if kind == "number" and data.ndim == 1 and data.dtype.kind in "uif":
        return "scalar"
    if kind == "vector" and data.ndim == 2 and data.dtype.kind in "uif":
        return "vector"
    if kind == "class" and data.ndim == 1 and data.dtype.kind in "ui":
        return "scalar"
    if kind == "classes" and vlen is not None and np.dtype(vlen).kind in "ui":
        return "ragged"
    if kind == "classes" and data.ndim == 2 and data.dtype.kind in "uib":
        if data.shape[1] != num_classes:
            raise ValueError(f"{shown}: {data.shape[1]} columns for {num_classes} classes")
        return "onehot"
    expected = {
        "image": "variable-length uint8 (encoded files) or uint8 (N, H, W, 3)",
        "mask": "variable-length uint8 (encoded PNG) or uint8 (N, H, W)",
        "number": "numbers (N,)",
        "vector": "numbers (N, D)",
        "class": "integers (N,)",
        "classes": "variable-length integer rows, or a (N, C) 0/1 array",
        "text": "variable-length strings",
        "json": "variable-length strings (JSON text)",
    }[kind]
    raise ValueError(f"{shown} holds {found}, not {expected}: fix the file or the field's kind")


def _check_classes(values, num_classes: int, shown: str) -> None:
    bad = np.flatnonzero((values < 0) | (values >= num_classes))
    if len(bad):
        raise ValueError(
            f"{shown} holds {values[bad[0]]} at row {bad[0]}, not a class index in 0..{num_classes - 1} "
            f"({len(bad)} such rows): fix the file, or the field's classes"
        )


def read_value(value, kind: str, store: str, num_classes: int, where: tuple) -> object:
    """One stored row as a record holds it (see the table above); ``where`` (file, dataset, row, field)
    names it in a BadInput."""
    if store == "bytes":
        return np.require(value, np.uint8, ["W"])  # writable: torch takes it without a copy or a warning
    if store == "array":
        return np.asarray(value).transpose(2, 0, 1) if kind == "image" else np.asarray(value)
    if store == "text":
        if isinstance(value, (bytes, np.bytes_)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as err:
                raise BadInput(f"{_where(where)}: not UTF-8 text ({err})") from None
        return str(value)
    if store == "scalar":
        return int(value) if kind == "class" else float(value)
    if store == "vector":
        return np.asarray(value, dtype=np.float32)
    indices = np.flatnonzero(np.asarray(value)) if store == "onehot" else np.asarray(value, dtype=np.int64)
    if store == "onehot" and np.any((np.asarray(value) != 0) & (np.asarray(value) != 1)):
        raise BadInput(f"{_where(where)}: a multi-label row holds values other than 0 and 1")
    if len(indices) and (indices.min() < 0 or indices.max() >= num_classes):
        raise BadInput(f"{_where(where)}: class index {int(indices.max())} is not in 0..{num_classes - 1}")
    return indices.astype(np.int64)


def read_rows(data, rows: np.ndarray) -> list:
    """The stored rows ``rows`` (sorted, distinct) of a dataset, in one read."""
    if len(rows) == 1:
        return [data[int(rows[0])]]
    return list(data[rows])


def _where(where: tuple) -> str:
    path, column, row, name = where
    return f"{path}: dataset '{column}' row {row} (field {name!r})"

"""A table's column -> the arrays of one field, each cell checked, by the field's kind.

    kind            arrays (``<field>.<name>.npy``)                      a cell
    image, mask     ``text`` uint8 blob + ``offsets`` int64 (N+1)         a path, absolute or under source.root
                    (Parquet: or ``bytes`` + ``offsets``)                 (or the encoded file: binary, {bytes, path})
    text, json      ``text`` + ``offsets`` (UTF-8)                        any text; json: JSON text
    class           ``labels`` int16/int32 (N,)                           a class name (or its index)
    classes         ``indices`` int32 + ``offsets`` int64 (N+1)           names split by the field's separator,
                                                                          or a JSON list (Parquet: a list)
    number          ``numbers`` float64 (N,)                              a number
    vector          ``vectors`` float32 (N, D)                            a JSON list, or numbers split by spaces

Every bad cell is an error naming the table, the row (counted from 1, the header not counted) and the column,
raised while the index is built, before training.
"""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np

from feedline.datasets.fields import Field
from feedline.datasets.manifest.tables import ROWS, TableError

log = logging.getLogger(__name__)

SHOWN = 10  # class names listed per error


def cell(table: str, row: int, column: str) -> str:
    return f"{table} row {row + 1} ({ROWS}), column {column!r}"


def pack(texts) -> tuple[np.ndarray, np.ndarray]:
    """Strings -> (one uint8 blob, int64 offsets (N+1)): no Python object per row once written."""
    encoded = [t.encode("utf-8", "surrogateescape") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def unpack(blob: np.ndarray, offsets: np.ndarray, row: int) -> str:
    return blob[offsets[row] : offsets[row + 1]].tobytes().decode("utf-8", "surrogateescape")


def _text(value) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def paths(cells: list, root: str, where, bar=None) -> dict:
    """Each cell a file: relative paths start at ``root`` (absolute ones and ``..`` are the user's choice)."""
    texts = []
    for row, value in enumerate(cells):
        text = _text(value.get("path") if isinstance(value, dict) else value)
        if not text:
            raise TableError(f"{where(row)}: the path is empty")
        if not os.path.isfile(os.path.join(root, text)):
            full = os.path.join(root, text)
            what = "is not a file" if os.path.exists(full) else "does not exist"
            raise TableError(
                f"{where(row)}: {full} {what} (relative paths start at source.root={root}; fix the row or "
                "source.root)"
            )
        texts.append(text)
        if bar is not None and row % 1024 == 1023:
            bar.update(1024)
    if bar is not None:
        bar.update(len(cells) % 1024)
    blob, offsets = pack(texts)
    return {"text": blob, "offsets": offsets}


def _image_bytes(value):
    """A cell's encoded image, where the table holds it (Parquet: binary, or Hugging Face's {bytes, path})."""
    if isinstance(value, dict):
        value = value.get("bytes")
    return value if isinstance(value, (bytes, bytearray)) else None


def is_embedded(cells: list) -> bool:
    """Whether an image or mask column holds the encoded files themselves rather than their paths."""
    return any(_image_bytes(value) is not None for value in cells)


def embedded(cells: list, where) -> dict:
    """Encoded images kept in the table: every cell must hold one (``bytes``: one blob + ``offsets``)."""
    out = []
    for row, value in enumerate(cells):
        data = _image_bytes(value)
        if data is None:
            raise TableError(
                f"{where(row)}: {_text(value)[:80]!r} holds no encoded image, where other rows of the column do "
                "(a column holds the files themselves, or their paths: not both)"
            )
        out.append(bytes(data))
    offsets = np.zeros(len(out) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, out), dtype=np.int64, count=len(out)), out=offsets[1:])
    return {"bytes": np.frombuffer(b"".join(out), dtype=np.uint8), "offsets": offsets}


def texts(cells: list, kind: str, where) -> dict:
    out = []
    for row, value in enumerate(cells):
        if kind == "json" and not isinstance(value, str) and value is not None:
            value = json.dumps(value)  # Parquet: a struct or list cell
        text = _text(value)
        if kind == "json":
            try:
                json.loads(text)
            except ValueError as err:
                raise TableError(f"{where(row)}: {text[:80]!r} is not JSON ({err})") from None
        out.append(text)
    blob, offsets = pack(out)
    return {"text": blob, "offsets": offsets}


def _is_index(name: str) -> bool:
    return name.isdigit() and (name == "0" or not name.startswith("0"))


def class_list(names) -> list[str]:
    """The class list a field without one gets: "0".."max" when every name is a class number, else the sorted
    names (as ImageFolder sorts its folders)."""
    names = set(names)
    if names and all(_is_index(n) for n in names):
        return [str(c) for c in range(max(int(n) for n in names) + 1)]
    return sorted(names)


class Lookup:
    """Class name -> index for one field: by name, or by index where no class name is a number."""

    def __init__(self, field: Field, classes: list[str], where):
        self.field, self.where = field, where
        self.index = {c: i for i, c in enumerate(classes)}
        self.by_number = not any(_is_index(c) for c in classes)

    def __call__(self, name: str, row: int) -> int:
        found = self.index.get(name)
        if found is None and self.by_number and _is_index(name) and int(name) < len(self.index):
            found = int(name)
        if found is None:
            shown = ", ".join(list(self.index)[:SHOWN]) + (" ..." if len(self.index) > SHOWN else "")
            raise TableError(
                f"{self.where(row)}: class {name!r} is not in the class list of field {self.field.name!r} "
                f"({shown}); add it to source.fields.{self.field.name}.classes, or fix the row"
            )
        return found


def labels(cells: list, field: Field, where) -> tuple[dict, list[str]]:
    names = []
    for row, value in enumerate(cells):
        name = _text(value).strip()
        if not name:
            raise TableError(f"{where(row)}: the class is empty")
        names.append(name)
    classes = list(field.classes) if field.classes is not None else class_list(names)
    if field.classes is None and len(names) >= 20 and len(set(names)) > len(names) // 2:
        log.warning(
            "source.fields.%s (kind class) found %d classes in %d rows: nearly one per row. If the column holds "
            "numbers to regress, declare it kind: number; if it names classes, list them in "
            "source.fields.%s.classes",
            field.name,
            len(set(names)),
            len(names),
            field.name,
        )
    lookup = Lookup(field, classes, where)
    dtype = np.int16 if len(classes) < 2**15 else np.int32
    return {"labels": np.fromiter((lookup(n, r) for r, n in enumerate(names)), dtype, len(names))}, classes


def _names(value, field: Field, where, row: int) -> list[str]:
    """A multi-label cell's class names: a list (Parquet), a JSON list, or names split by the separator."""
    if value is None:
        return []
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise TableError(f"{where(row)}: {value[:80]!r} does not parse as a JSON list ({err})") from None
    if isinstance(value, str):
        sep = field.separator.strip() or None  # a space: any run of whitespace
        return [n.strip() for n in value.split(sep) if n.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(n, (str, int)) for n in value):
        return [str(n) for n in value]
    raise TableError(
        f"{where(row)}: {str(value)[:80]!r} does not parse as class names (names separated by "
        f"{field.separator!r}, or a JSON list of names)"
    )


def multi_labels(cells: list, field: Field, where) -> tuple[dict, list[str]]:
    rows = [_names(value, field, where, row) for row, value in enumerate(cells)]
    classes = list(field.classes) if field.classes is not None else class_list(n for r in rows for n in r)
    lookup = Lookup(field, classes, where)
    flat = np.fromiter((lookup(n, r) for r, names in enumerate(rows) for n in names), np.int32)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=offsets[1:])
    return {"indices": flat, "offsets": offsets}, classes


def _number(value, where, row: int) -> float:
    try:
        if isinstance(value, bool) or value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise TableError(f"{where(row)}: {_text(value)[:80]!r} is not a number") from None
    if not math.isfinite(number):  # a NaN target turns the loss NaN with no row named
        raise TableError(
            f"{where(row)}: {_text(value)[:80]!r} is not a finite number (NaN and infinities are refused)"
        )
    return number


def numbers(cells: list, where) -> dict:
    return {
        "numbers": np.fromiter((_number(v, where, r) for r, v in enumerate(cells)), np.float64, len(cells))
    }


def vectors(cells: list, where) -> dict:
    out, width = [], None
    for row, value in enumerate(cells):
        if isinstance(value, str):
            text = value.strip()
            try:
                value = json.loads(text) if text.startswith("[") else text.split()
            except ValueError as err:
                raise TableError(
                    f"{where(row)}: {text[:80]!r} does not parse as a JSON list ({err})"
                ) from None
        if not isinstance(value, (list, tuple)):
            raise TableError(f"{where(row)}: {_text(value)[:80]!r} is not a vector (a JSON list, or numbers)")
        vector = [_number(v, where, row) for v in value]
        if width is None:
            width = len(vector)
        elif len(vector) != width:
            raise TableError(
                f"{where(row)}: a vector of {len(vector)} numbers, where the rows before it hold {width}"
            )
        out.append(vector)
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, named just below
        packed = np.asarray(out, dtype=np.float32).reshape(len(cells), width or 0)
    overflow = np.flatnonzero(~np.isfinite(packed).all(axis=1)) if packed.size else ()
    if len(overflow):  # finite as written, beyond float32's range once stored
        raise TableError(f"{where(int(overflow[0]))}: a number beyond float32's range (about 3.4e38)")
    return {"vectors": packed}

"""One split of a table: its fields' mapped arrays, the root and the table's name; never a list of samples.

It pickles as those paths and numbers (each ``LazyArray`` as its file's path), so a spawned DataLoader worker
gets a few hundred bytes whatever the table's length, and forked ones share the mapped pages.
"""

from __future__ import annotations

import os

import numpy as np

from feedline.datasets.manifest.columns import unpack
from feedline.datasets.records import Records, read_bytes


class ManifestRecords(Records):
    """``records[i] -> {field: value}`` (``datasets/fields.py``): an image or mask as the file's bytes, a class
    as its index, classes as an int array, a number as a float, a vector as a float32 array, text and JSON
    as text."""

    def __init__(self, index: dict, kinds, image: str, root: str, subset=None):
        super().__init__(subset)
        self.arrays = dict(index["arrays"])
        self.kinds = tuple(kinds)  # (name, kind) per field, in order
        self.image = image  # the field that names a sample in messages
        self.root = root
        self.table = index["meta"]["table"]
        self.rows = int(index["meta"]["rows"])
        self._content = index["meta"]["digest"]
        self.embedded = frozenset(index["meta"]["embedded"])  # image fields whose bytes the table holds

    @property
    def total(self) -> int:
        return self.rows

    def _array(self, name: str) -> np.ndarray:
        return self.arrays[name].array

    def _text(self, field: str, row: int) -> str:
        return unpack(self._array(f"{field}.text"), self._array(f"{field}.offsets"), row)

    def path(self, field: str, row: int) -> str:
        return os.path.join(self.root, self._text(field, row))

    def read(self, row: int) -> dict:
        out = {}
        for name, kind in self.kinds:
            if name in self.embedded:
                offsets = self._array(f"{name}.offsets")
                out[name] = np.array(self._array(f"{name}.bytes")[offsets[row] : offsets[row + 1]])
            elif kind in ("image", "mask"):
                out[name] = read_bytes(self.path(name, row))
            elif kind in ("text", "json"):
                out[name] = self._text(name, row)
            elif kind == "class":
                out[name] = int(self._array(f"{name}.labels")[row])
            elif kind == "classes":
                offsets = self._array(f"{name}.offsets")
                out[name] = np.array(self._array(f"{name}.indices")[offsets[row] : offsets[row + 1]])
            elif kind == "number":
                out[name] = float(self._array(f"{name}.numbers")[row])
            else:
                out[name] = np.array(self._array(f"{name}.vectors")[row])
        return out

    def where(self, row: int) -> str:
        held = "its image held in the table" if self.image in self.embedded else self.path(self.image, row)
        return f"{self.table} row {row + 1} ({held})"

    def content_digest(self) -> str:
        """The table's content, as 16 hex digits: a resume refuses a table that changed."""
        return self._content

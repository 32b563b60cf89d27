"""Unlabeled images for ``trainer.predict``: every image below one folder, in sorted path order.

The paths are packed into two arrays (UTF-8 bytes and offsets), so the record set pickles to workers as
two buffers rather than a list of strings. Labels are -1: there are none.
"""

from __future__ import annotations

import os

import numpy as np

from feedline.datasets.folder.scan import list_images
from feedline.datasets.paths import IMG_EXTENSIONS, require_dir
from feedline.datasets.records import Records, read_bytes

UNLABELED = -1


class UnlabeledRecords(Records):
    def __init__(self, root: str, relpaths: list[str]):
        super().__init__()
        self.root = root
        encoded = [p.encode("utf-8", "surrogateescape") for p in relpaths]
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self.offsets[1:])
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    @property
    def total(self) -> int:
        return len(self.offsets) - 1

    def where(self, row: int) -> str:
        raw = self.blob[self.offsets[row] : self.offsets[row + 1]].tobytes()
        return os.path.join(self.root, raw.decode("utf-8", "surrogateescape"))

    def read(self, row: int):
        return read_bytes(self.where(row)), UNLABELED


def unlabeled_folder(
    root: str, extensions=IMG_EXTENSIONS, key: str = "data.predict_root"
) -> UnlabeledRecords:
    """The images below ``root``, or an error naming ``key`` when there is no folder or no image."""
    root = require_dir(root, key)
    relpaths = list_images(root, extensions)
    if not relpaths:
        raise FileNotFoundError(f"{key} '{root}' holds no image ({', '.join(IMG_EXTENSIONS)}) at any depth")
    return UnlabeledRecords(root, relpaths)

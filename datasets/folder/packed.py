"""The arrays of one folder index directory (``datasets/folder/index.py`` builds it), mapped where they are read.

``PackedIndex`` is what crosses into DataLoader workers: the directory's name and the identity of the
files it mapped, never the arrays; ``FolderIndex`` adds the metadata the source reads in the main process.
"""

from __future__ import annotations

import json
import os

import numpy as np

from feedline.datasets.arrays import check_identity, file_identity

_ARRAYS = ("paths", "offsets", "labels")


class PackedIndex:
    """The mapped arrays of one index directory.

    It pickles as its directory name and maps the arrays lazily in the process that reads, so sending it
    to a spawned worker costs a few bytes, and forked workers share pages instead of copying a list.
    """

    __slots__ = ("directory", "_arrays", "_identity")

    def __init__(self, directory: str | os.PathLike, identity=None):
        self.directory = str(directory)
        self._arrays = None
        self._identity = identity  # of paths.npy as first mapped: a worker refuses a rebuilt index

    def __getstate__(self):
        return self.directory, self._identity

    def __setstate__(self, state):
        self.__init__(*((state, None) if isinstance(state, str) else state))

    def view(self) -> PackedIndex:
        """The arrays alone, mapped now and shared: forked workers inherit these very maps, and spawned ones
        refuse an index another process rebuilt in this directory since."""
        arrays = self.arrays
        index = PackedIndex(self.directory, self._identity)
        index._arrays = arrays
        return index

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            first = os.path.join(self.directory, f"{_ARRAYS[0]}.npy")
            check_identity(first, self._identity, "the folder index")
            identity = file_identity(first, self._recorded_crc())
            self._arrays = tuple(
                np.load(os.path.join(self.directory, f"{name}.npy"), mmap_mode="r") for name in _ARRAYS
            )
            self._identity = self._identity or identity
        return self._arrays

    def _recorded_crc(self) -> int | None:
        return None  # FolderIndex knows it from meta.json

    def __len__(self) -> int:
        return len(self.arrays[1]) - 1

    def relpath(self, i: int) -> str:
        paths, offsets, _ = self.arrays
        return paths[offsets[i] : offsets[i + 1] - 1].tobytes().decode("utf-8", "surrogateescape")

    def label(self, i: int) -> int:
        return int(self.arrays[2][i])


class FolderIndex(PackedIndex):
    """An index with its metadata, as the source sees it in the main process."""

    __slots__ = ("meta", "_dirs")

    def __init__(self, directory, meta: dict | None = None):
        super().__init__(directory)
        if meta is None:
            with open(os.path.join(self.directory, "meta.json"), encoding="utf-8") as f:
                meta = json.load(f)
        self.meta = meta
        self._dirs = None

    def _recorded_crc(self) -> int | None:
        return self.meta.get("files", {}).get(f"{_ARRAYS[0]}.npy", {}).get("crc32")

    @property
    def root(self) -> str:
        return self.meta["root"]

    @property
    def classes(self) -> list[str]:
        return self.meta["classes"]

    @property
    def counts(self) -> list[int]:
        return self.meta["counts"]

    def __len__(self) -> int:
        return self.meta["num_samples"]

    def dirs(self) -> list[tuple[str, int]]:
        if self._dirs is None:
            with open(os.path.join(self.directory, "dirs.json"), encoding="utf-8") as f:
                self._dirs = json.load(f)
        return self._dirs

"""A split's row arrays, mapped where they are read: ``.npy`` files in the cache, each checked to be the file
its run mapped (another process may rebuild a shared cache), or an array held in memory."""

from __future__ import annotations

import json
import os

import numpy as np


class InMemoryArray:
    """A split's rows held in memory (a source read without a cache); the same interface as LazyArray."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


class CacheReplacedError(ValueError):
    """A cache file a run had mapped was replaced by another process (a rebuild after the data changed)."""


def file_identity(path: str, crc: int | None = None) -> tuple | None:
    """(inode, size, mtime_ns, crc) of ``path``, or None when it is gone. ``crc``: the CRC32 recorded when
    the file was written (None: unknown), so an identical rewrite (two runs drawing the same split at
    once) is told apart from a file with other content."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, crc


def check_identity(path: str, identity, what: str) -> None:
    """Refuse to map ``path`` in a worker when it is no longer the file its run mapped: another process
    sharing the cache rebuilt it, and its rows would be other samples under the same numbers. A file
    rewritten with the same bytes (its recorded CRC32 still matches) is the same file."""
    if identity is None:
        return
    now = file_identity(path)
    if now is not None and now[:3] == tuple(identity[:3]):
        return
    if now is not None and identity[3] is not None and now[1] == identity[1]:
        from feedline.datasets.cache import crc32  # reads the whole file: only when it was replaced

        if crc32(path) == identity[3]:
            return
    raise CacheReplacedError(
        f"{what} {path} was rebuilt by another process after this run read it (the data changed, or "
        "another run shares the cache): this run's workers would read other samples. Restart the run "
        "(it reads the new cache), or give concurrent runs their own paths.cache_dir"
    )


def _recorded_crc(path: str) -> int | None:
    """The CRC32 ``cache.save_array`` recorded beside ``path`` (``<path>.sum``), if any."""
    try:
        with open(path + ".sum", encoding="utf-8") as f:
            return int(json.load(f)["crc32"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class LazyArray:
    """A ``.npy`` file mapped on first use; pickles as its path and, once mapped, the file's identity, so a
    worker never maps a file that replaced it (``check_identity``)."""

    __slots__ = ("path", "_array", "_identity")

    def __init__(self, path: str | os.PathLike, identity=None):
        self.path = str(path)
        self._array = None
        self._identity = identity

    def __getstate__(self):
        return self.path, self._identity

    def __setstate__(self, state):
        self.__init__(*((state, None) if isinstance(state, str) else state))

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            check_identity(self.path, self._identity, "the cached array")
            identity = file_identity(self.path, _recorded_crc(self.path))
            self._array = np.load(self.path, mmap_mode="r")
            self._identity = self._identity or identity
        return self._array

"""RecordSet: the per-split view a dataset reads samples through.

The contract (see DESIGN.md): ``len``, ``records[i] -> (payload, label)`` and ``describe(i) -> str``
(the sample's path, for error messages). A RecordSet pickles as paths and numbers, never the sample
list, and opens memory maps lazily in the process that reads.
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import stat
from typing import Any, Protocol, runtime_checkable

import numpy as np

from feedline.conf.rebuild import Rebuildable
from feedline.datasets.listing import list_classes
from feedline.datasets.stores import is_url


@runtime_checkable
class RecordSet(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[Any, int]: ...

    def describe(self, i: int) -> str: ...


class Source(Rebuildable, abc.ABC):
    """What the datamodule needs of a data backend, and nothing else: ``classes``, ``prepare()`` and
    ``split(name) -> RecordSet``. A class with these three is a Source whether or not it inherits from
    this one; feedline's sources inherit, so LightningCLI can offer them as ``--data.source`` choices."""

    @property
    @abc.abstractmethod
    def classes(self) -> list[str]: ...

    @abc.abstractmethod
    def prepare(self) -> None: ...

    @abc.abstractmethod
    def split(self, name: str) -> RecordSet: ...

    @classmethod
    def __subclasshook__(cls, other):
        if cls is Source:
            names = ("classes", "prepare", "split")
            return all(any(n in vars(base) for base in other.__mro__) for n in names) or NotImplemented
        return NotImplemented


def check_class_names(names, where: str) -> list[str]:
    """Class names as a list of strings, each once: a name given twice would label two classes alike."""
    names = [str(n) for n in names]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{where} names class(es) {', '.join(map(repr, twice[:10]))} more than once")
    return names


def read_bytes(path: str) -> np.ndarray:
    """The file's bytes as a writable uint8 array (torchvision decoders take it without a copy). Opened
    non-blocking, so a FIFO where an image should be is an error, not a reader blocked forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # half the cost of np.fromfile for small files
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        buffer = bytearray(st.st_size)
        if os.readv(fd, [buffer]) != len(buffer):
            raise OSError(f"{path}: file changed size while it was read")
    finally:
        os.close(fd)
    return np.frombuffer(buffer, dtype=np.uint8)


class Records:
    """What every split of every source shares: an optional ``subset`` of the source's rows (a split's
    index array), bounds checks, and naming a sample for error messages.

    A format implements ``total`` (the rows it holds), ``read(row) -> (payload, label)`` and
    ``where(row) -> str``; ``records[i]`` and ``describe(i)`` go through the subset.
    """

    def __init__(self, subset=None):
        self.subset = subset  # LazyArray or InMemoryArray of rows; None: every row, in order

    @property
    def total(self) -> int:
        raise NotImplementedError

    def read(self, row: int) -> tuple[Any, int]:
        raise NotImplementedError

    def where(self, row: int) -> str:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.subset.array) if self.subset is not None else self.total

    def row(self, i: int) -> int:
        """The source row of sample ``i`` of this split."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        return int(self.subset.array[i]) if self.subset is not None else i % self.total

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.read(self.row(i))

    def describe(self, i: int) -> str:
        return self.where(self.row(i))

    def digest(self) -> str:
        """Which rows of how many this split holds, as 16 hex digits: the same for the same split of the same
        samples in any backend (a tree, its lazy layout, its HDF5 conversion), different when another seed
        or fraction draws it. One pass over the mapped row array; no sample is read."""
        h = hashlib.blake2b(str(self.total).encode(), digest_size=8)
        if self.subset is not None:
            h.update(np.ascontiguousarray(self.subset.array, dtype=np.int64).data)
        return h.hexdigest()


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


def local_path(path, key: str) -> str:
    """``path`` made absolute (``~`` expanded); a URL is an error naming ``key``: only ``source=shards`` reads
    object storage (taken as a local path, ``s3://b/x`` would be reported as a missing ``./s3:/b/x``)."""
    if is_url(path):
        raise ValueError(
            f"{key}={path} is a URL, and this source reads local paths only; data in object storage is read by "
            f"source=shards. Set {key} to a local copy, or convert a local copy once (python convert.py "
            f"source=... out.format=shards out.path=<an s3:// prefix>) and read that with source=shards "
            f"source.path=<the prefix>"
        )
    return os.path.abspath(os.path.expanduser(str(path)))


def require_dir(path: str, key: str) -> str:
    """``path`` made absolute, or an error naming it and the config key to fix."""
    path = local_path(path, key)
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise FileNotFoundError(f"{key} '{path}' {what} (set {key}=... or check the path)")
    return path


def class_folders(root: str, sample: str = "<image>", key: str = "source.root") -> list[str]:
    """The sorted class folders of ``root``, or an error naming the key and the layout expected."""
    classes = list_classes(root)
    if not classes:
        raise FileNotFoundError(f"{key} '{root}' has no class folders: expected {root}/<class>/{sample}")
    return classes

"""RecordSet: the per-split view a dataset reads samples through.

The contract (see DESIGN.md): ``len``, ``records[i] -> (payload, label)`` and ``describe(i) -> str``
(the sample's path, for error messages). A source that declares named fields (``fields``, see
``fields.py``) reads ``records[i] -> {field: value}`` instead. A RecordSet pickles as paths and numbers, never the sample
list, and opens memory maps lazily in the process that reads.
"""

from __future__ import annotations

import abc
import hashlib
import os
import stat
from typing import Any, Protocol, runtime_checkable

import numpy as np

from feedline.conf.rebuild import Rebuildable
from feedline.moved import old_names


class BadInput(ValueError):
    """A sample's data is wrong (a value that does not parse, a file that does not fit its table): raise it,
    or a subclass, from a source's ``read``, and ``data.on_bad_sample`` decides (skip it and name it, or stop
    naming it). Any other exception from a source stops the run: it is a bug, not bad data. ``OSError``
    (a file that cannot be read) counts as bad input too."""


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
        or fraction draws it. A cached split's digest was recorded beside its file when it was written (O(1)
        here); any other subset is one pass over its row array. No sample is read."""
        from feedline.datasets.splits import recorded_digest

        recorded = recorded_digest(self.subset, self.total) if self.subset is not None else None
        if recorded is not None:
            return recorded
        h = hashlib.blake2b(str(self.total).encode(), digest_size=8)
        if self.subset is not None:
            h.update(np.ascontiguousarray(self.subset.array, dtype=np.int64).data)
        return h.hexdigest()


__getattr__ = old_names(__name__)  # names that moved to another module keep working for one release

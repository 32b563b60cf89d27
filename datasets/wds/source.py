"""The ``wds`` source: WebDataset tar shards as they are published (``<key>.jpg`` with ``<key>.cls`` or
``<key>.json``), read in place.

The tars are indexed once (``datasets/wds/index.py``: each member's name, offset and size, by ``tarfile``) and the
index is cached; a sample's image is then one ``pread`` at its offset in its tar (O(1), no tar is scanned
again). The RecordSet pickles as the tars' paths and sizes and the index's file names; each process opens
the tars it reads on first use. Splits: other tars (``val_path``, ``test_path``) or a seeded, stratified
share (``splits.py``). ``convert.py source=wds ...`` writes them as shards or HDF5 like any other source.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from feedline.datasets.options import WdsOptions as _O  # the defaults, written once
from feedline.datasets.overlap.same_data import check_own
from feedline.datasets.paths import local_path
from feedline.datasets.records import Records, Source
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for
from feedline.datasets.wds.index import open_index
from feedline.datasets.wds.tars import TarError, find_tars

OPEN_TARS = 64  # tars a process keeps open at once (the least recently opened closed first)
KEYS = ("source.path", "source.val_path", "source.test_path")


class WdsRecords(Records):
    """One split of a set of tars. Payload: the image member's bytes (uint8, 1-D)."""

    def __init__(self, index: dict, subset=None, label_map=None):
        super().__init__(subset)
        self.tars = tuple(t for t, _ in index["tars"])
        self.sizes = tuple(int(s) for _, s in index["tars"])  # as indexed: a tar of another size changed
        self.rows, self.labels, self.names = index["rows"], index["labels"], index["names"]
        self.label_map = tuple(label_map) if label_map is not None else None  # held-out tars -> labels
        self._fds: dict[int, int] = {}

    def __getstate__(self):
        return {**self.__dict__, "_fds": {}}  # descriptors stay in their process

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter exit, os may already be torn down
            for fd in self._fds.values():
                os.close(fd)

    @property
    def total(self) -> int:
        return len(self.labels.array)

    def _fd(self, t: int) -> int:
        fd = self._fds.get(t)
        if fd is None:
            if len(self._fds) >= OPEN_TARS:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = os.open(self.tars[t], os.O_RDONLY)
            size = os.fstat(fd).st_size
            if size != self.sizes[t]:
                os.close(fd)
                raise TarError(
                    f"{self.tars[t]} is {size} bytes, {self.sizes[t]} when it was indexed: it changed under "
                    "this run, whose offsets would read other bytes. Restart the run (it indexes it again)"
                )
            self._fds[t] = fd
        return fd

    def read(self, row: int):
        t, offset, size = (int(v) for v in self.rows.array[row])
        buffer = bytearray(size)  # writable: torchvision's decoders take it without a copy
        if os.preadv(self._fd(t), [buffer], offset) != size:
            raise OSError(f"{self.where(row)}: the tar ends before this image does")
        label = int(self.labels.array[row])
        return np.frombuffer(buffer, dtype=np.uint8), self.label_map[
            label
        ] if self.label_map is not None else label

    def where(self, row: int) -> str:
        name = bytes(self.names.array[row]).decode("utf-8", "surrogateescape")
        return f"{self.tars[int(self.rows.array[row, 0])]}:{name}"


class WdsSource(Source):
    """Samples from WebDataset tars; val from ``val_path`` or a seeded, stratified ``val_fraction``; test
    likewise from ``test_path`` or ``test_fraction``."""

    def __init__(
        self,
        path: str,
        val_path: str | None = _O.val_path,
        val_fraction: float = _O.val_fraction,
        test_path: str | None = _O.test_path,
        test_fraction: float = _O.test_fraction,
        seed: int = _O.seed,
        label_key: str = _O.label_key,
        cache_dir: str | None = _O.cache_dir,
    ):
        self.paths = dict(zip(KEYS, (path, val_path, test_path)))
        for key, value in self.paths.items():
            if value:
                local_path(value, key)  # a URL: read by source=shards
                find_tars(value, key)  # a bad path or a missing shard fails before any work starts
        self.path = local_path(path, "source.path")  # absolute: a conversion records it as its origin
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        if val_path:
            self.val_fraction = 0.0
        if test_path:
            self.test_fraction = 0.0
        self.seed = check_seed(seed)
        if not isinstance(label_key, str) or not label_key:
            raise ValueError(
                f"source.label_key={label_key!r} must name the field of <key>.json holding the label"
            )
        self.label_key = label_key
        self.cache_dir = cache_dir
        self._indexes: dict[str, dict] = {}
        check_own(self)  # val_path, test_path: no tar of path (however named) nor of each other

    def _index(self, key: str) -> dict:
        if key not in self._indexes:
            self._indexes[key] = open_index(self.paths[key], self.label_key, self.cache_dir, key)
        return self._indexes[key]

    @property
    def classes(self) -> list[str]:
        return self._index("source.path")["classes"]

    def prepare(self) -> None:
        """Index every tar once (per node; later runs read the cached index), and check the held-out tars'
        classes against the training ones."""
        for key, value in self.paths.items():
            if value:
                self._label_map(key)

    def _label_map(self, key: str) -> list[int] | None:
        """Held-out tars' labels -> training labels, by class name; None when they agree."""
        own = self._index(key)["classes"]
        if own == self.classes[: len(own)]:
            return None
        unknown = sorted(set(own) - set(self.classes))
        if unknown:
            raise ValueError(
                f"{key} '{self.paths[key]}' has classes that source.path lacks: {', '.join(unknown[:10])}"
            )
        return [self.classes.index(name) for name in own]

    def split(self, name: str) -> WdsRecords:
        key = {"val": "source.val_path", "test": "source.test_path"}.get(check_split(name))
        own = key if key and self.paths[key] else None
        if name == "test" and not own and not self.test_fraction:
            raise no_test_split(repr(self), "source.test_path=<tars> or source.test_fraction=0.1")
        if own:
            return WdsRecords(self._index(own), label_map=self._label_map(own))
        index = self._index("source.path")
        labels = index["labels"].array
        counts = np.bincount(labels, minlength=len(self.classes))
        order = np.argsort(labels, kind="stable")
        subset = subset_for(
            name,
            counts,
            self.val_fraction,
            self.seed,
            index["directory"],
            order,
            self.test_fraction,
            self.classes,
        )
        return WdsRecords(index, subset)

    def __repr__(self) -> str:
        return f"WdsSource(path={self.path!r}, val_fraction={self.val_fraction})"

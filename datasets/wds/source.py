"""The ``wds`` source: WebDataset tar shards as they are published (``<key>.jpg`` with ``<key>.cls`` or
``<key>.json``), read in place; with ``source.fields``, each field read from the member of its extension
(``column: seg.png``; ``values.py`` says what each kind reads, ``field_index.py`` what is indexed).

The tars are indexed once (``datasets/wds/index.py``: each member's name, offset and size, by ``tarfile``) and the
index is cached; a sample's image is then one ``pread`` at its offset in its tar (O(1), no tar is scanned
again). The RecordSet pickles as the tars' paths and sizes and the index's file names; each process opens
the tars it reads on first use. Splits: other tars (``val_path``, ``test_path``) or a seeded, stratified
share (``splits.py``). ``convert.py source=wds ...`` writes them as shards or HDF5 like any other source.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from feedline.datasets.fields import Field, Fields, fields_from_config
from feedline.datasets.options import WdsOptions as _O  # the defaults, written once
from feedline.datasets.overlap.same_data import check_own
from feedline.datasets.paths import local_path
from feedline.datasets.records import BadInput, Records, Source
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for
from feedline.datasets.wds.field_index import extensions, open_field_index
from feedline.datasets.wds.index import open_index
from feedline.datasets.wds.tars import TarError, find_tars
from feedline.datasets.wds.values import Lookup, read_value

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

    def _pread(self, t: int, offset: int, size: int, row: int) -> np.ndarray:
        buffer = bytearray(size)  # writable: torchvision's decoders take it without a copy
        if os.preadv(self._fd(t), [buffer], offset) != size:
            raise OSError(f"{self.where(row)}: the tar ends before this member does")
        return np.frombuffer(buffer, dtype=np.uint8)

    def read(self, row: int):
        t, offset, size = (int(v) for v in self.rows.array[row])
        image = self._pread(t, offset, size, row)
        label = int(self.labels.array[row])
        return image, self.label_map[label] if self.label_map is not None else label

    def where(self, row: int) -> str:
        name = bytes(self.names.array[row]).decode("utf-8", "surrogateescape")
        return f"{self.tars[int(self.rows.array[row, 0])]}:{name}"


class WdsFieldRecords(WdsRecords):
    """One split of a set of tars read as named fields: ``records[i] -> {field: value}``, each field's member
    read at its offset and parsed by its kind (``values.py``); a missing member is bad input, named."""

    def __init__(self, index: dict, fields: Fields, label_key: str, subset=None):
        super().__init__(index, subset)
        self.fields, self.label_key = fields, label_key
        self.columns = [tuple(c) for c in index["columns"]]
        self._lookups: dict[str, Lookup] = {}

    def __getstate__(self):
        return {**super().__getstate__(), "_lookups": {}}

    def _lookup(self, field: Field) -> Lookup | None:
        if field.classes is None:
            return None
        if field.name not in self._lookups:
            self._lookups[field.name] = Lookup(field.classes)
        return self._lookups[field.name]

    def read(self, row: int) -> dict:
        r = [int(v) for v in self.rows.array[row]]
        out = {}
        for k, field in enumerate(self.fields.values()):
            offset, size = r[1 + 2 * k], r[2 + 2 * k]
            if offset < 0:
                raise BadInput(
                    f"{self.where(row)} has no .{' or .'.join(self.columns[k])} member "
                    f"(source.fields.{field.name}.column)"
                )
            data = self._pread(r[0], offset, size, row)
            try:
                out[field.name] = read_value(
                    data, field.kind, field, self._lookup(field), self.label_key, row
                )
            except BadInput as err:
                raise BadInput(
                    f"{self.where(row)}, its .{'/'.join(self.columns[k])} ({field.name}): {err}"
                ) from None
        return out

    def where(self, row: int) -> str:
        name = bytes(self.names.array[row]).decode("utf-8", "surrogateescape")
        return f"{self.tars[int(self.rows.array[row, 0])]}: sample {name!r}"


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
        fields: Mapping | None = None,
        target: str | None = _O.target,
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
        self._specs, self.target = _configured(fields, target) if fields else (None, None)
        self._indexes: dict[str, dict] = {}
        check_own(self)  # val_path, test_path: no tar of path (however named) nor of each other

    def _index(self, key: str) -> dict:
        if key not in self._indexes:
            if self._specs is None:
                self._indexes[key] = open_index(self.paths[key], self.label_key, self.cache_dir, key)
            else:  # held-out tars are read with the train tars' class lists
                specs = self._specs if key == "source.path" else list(self.fields.values())
                path = self.paths[key]
                self._indexes[key] = open_field_index(
                    path, specs, self.target, self.label_key, self.cache_dir, key
                )
        return self._indexes[key]

    @property
    def fields(self) -> Fields | None:
        """The fields (``source.fields``), each class list as declared or as the train tars hold it; None:
        image and class, read as before."""
        if self._specs is None:
            return None
        found = self._index("source.path")["classes"]
        specs = [replace(f, classes=tuple(found[f.name])) if f.name in found else f for f in self._specs]
        return Fields(specs, self.target)

    @property
    def classes(self) -> list[str]:
        if self._specs is not None:
            return self.fields.classes
        return self._index("source.path")["classes"]

    def prepare(self) -> None:
        """Index every tar once (per node; later runs read the cached index), and check the held-out tars'
        classes against the training ones."""
        for key, value in self.paths.items():
            if value:
                self._index(key) if self._specs is not None else self._label_map(key)

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
        fields = self.fields
        if own:
            if fields is not None:
                return WdsFieldRecords(self._index(own), fields, self.label_key)
            return WdsRecords(self._index(own), label_map=self._label_map(own))
        index = self._index("source.path")
        labels = index["labels"].array
        counts, order, classes = [len(labels)], None, None  # fields without a class target: at random
        if fields is None or (fields[fields.target].kind == "class" and (labels >= 0).all()):
            classes = self.classes  # stratified: each class gives its share
            counts = np.bincount(labels, minlength=len(classes))
            order = np.argsort(labels, kind="stable")
        subset = subset_for(
            name,
            counts,
            self.val_fraction,
            self.seed,
            index["directory"],
            order,
            self.test_fraction,
            classes,
        )
        if fields is not None:
            return WdsFieldRecords(index, fields, self.label_key, subset)
        return WdsRecords(index, subset)

    def __repr__(self) -> str:
        return f"WdsSource(path={self.path!r}, val_fraction={self.val_fraction})"


def _configured(fields: Mapping, target) -> tuple[list[Field], str]:
    """``source.fields`` checked before any work; a class list left out is found in the tars."""
    plain = {}
    for name, spec in fields.items():
        spec = dict(spec) if isinstance(spec, Mapping) else {"kind": spec} if isinstance(spec, str) else spec
        if isinstance(spec, dict) and spec.get("classes") is not None:
            spec["classes"] = list(spec["classes"])
        plain[str(name)] = spec
    unlisted = {  # kind classes needs a list to be checked: a stand-in until the tars give one
        n: {**s, "classes": ["?"]}
        if isinstance(s, dict) and s.get("kind") == "classes" and not s.get("classes")
        else s
        for n, s in plain.items()
    }
    parsed = fields_from_config(unlisted, target)
    specs = [
        replace(f, classes=None) if f.classes == ("?",) and plain[f.name].get("classes") is None else f
        for f in parsed.values()
    ]
    for f in specs:
        if not extensions(f):
            raise ValueError(
                f"source.fields.{f.name}.column={f.column!r} names no member extension (jpg, seg.png)"
            )
    chosen = parsed[parsed.target]
    if chosen.kind == "mask" and chosen.classes is None:
        raise ValueError(
            f"source.fields.{chosen.name}: a mask target needs its class list, index = pixel value "
            f"(source.fields.{chosen.name}.classes=[background, ...])"
        )
    return specs, parsed.target

"""The shards format on disk (LitData's optimised chunks), read without LitData: one sample in O(1).

    DIR/index.json          {"chunks": [{"filename", "chunk_size": samples, "chunk_bytes": file size}, ...],
                             "config": {"data_format": ["bytes", "int"], "item_loader": "PyTreeLoader",
                                        "compression": null, "encryption": null, ...}}
    DIR/chunk-<w>-<n>.bin   uint32 N | uint32 offsets[N + 1] (absolute) | N samples, each:
                            uint32 len(image) | uint32 8 | the image file's bytes | int64 label
    DIR/feedline.json       feedline's sidecar: the class names, the sample count, how it was written
    DIR/labels.npy          every sample's label, in order (int64): a split never reads a chunk
    DIR/part-0000K-of-0000N/    the same, per part, when a conversion is split over N jobs

``index.json`` is written last (LitData's writer), and feedline renames a dataset into place only once it
and the sidecar exist, so a directory without them is not a dataset. Samples are numbered across the chunks
in ``index.json``'s order, and across parts in part order. A chunk is mapped on first use in the process
that reads it and checked against ``index.json`` (size, sample count, layout): a missing or truncated chunk
stops the run naming its path; a malformed sample inside one is a bad sample (``OSError``).
"""

from __future__ import annotations

import bisect
import collections
import json
import mmap
import os
import re
import struct

import numpy as np

from feedline.datasets.stores import LocalStore

SIDECAR = "feedline.json"
LABELS = "labels.npy"
FORMAT = "feedline-shards/1"
PART = re.compile(r"part-(\d{5})-of-(\d{5})")
ARROW_TAIL = b"LDARW01\0"  # LitData's Arrow-footer chunks end so: their rows are not in the offsets table
OPEN_MAPS = 64  # chunks mapped at once per process (each holds a file descriptor)


class ChunkError(RuntimeError):
    """A chunk is missing, truncated, or not in the layout feedline reads: the dataset, not a sample, is bad."""


def part_name(part: int, parts: int) -> str:
    return f"part-{int(part):05d}-of-{int(parts):05d}"


def as_store(where):
    """A store (``stores.py``) as it is, a local directory's path as a ``LocalStore``."""
    return where if hasattr(where, "read") else LocalStore(str(where))


def is_complete(where, rel: str = "") -> bool:
    store = as_store(where)
    return store.exists(_join(rel, "index.json")) and store.exists(_join(rel, SIDECAR))


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def dataset_parts(where, key: str = "source.path") -> list[str]:
    """The directories of the dataset in ``where`` (a path or a store), relative to it: itself (``""``), or its
    parts in part order once all are complete."""
    store = as_store(where)
    if is_complete(store):
        return [""]
    path = store.where()
    found: dict[int, dict[int, str]] = collections.defaultdict(dict)
    for name in store.children():
        match = PART.fullmatch(name)
        if match:
            found[int(match[2])][int(match[1])] = name
    if not found:
        why = (
            "its conversion is unfinished or was killed, or LitData wrote it without feedline's sidecar"
            if store.exists("index.json")
            else ""
        )
        raise FileNotFoundError(
            f"{key} '{path}' is not a shards dataset: no index.json and {SIDECAR} (nor part-*-of-* folders)"
            f"{' (' + why + ')' if why else ''}; write one with python convert.py source=... out.format=shards "
            f"out.path={path}"
        )
    if len(found) > 1:
        counts = ", ".join(f"of {n}" for n in sorted(found))
        raise ValueError(
            f"{key} '{path}' holds parts of conversions split differently ({counts}): keep the folders of one "
            f"out.parts and remove the others"
        )
    parts, dirs = next(iter(found.items()))
    missing = [k for k in range(parts) if k not in dirs or not is_complete(store, dirs[k])]
    if missing:
        names = ", ".join(part_name(k, parts) for k in missing[:10]) + (" ..." if len(missing) > 10 else "")
        verb = "is" if len(missing) == 1 else "are"
        raise FileNotFoundError(
            f"{key} '{path}' is a dataset in {parts} parts, and {len(missing)} {verb} missing or unfinished: {names}. "
            f"Run python convert.py ... out.path={path} out.part=K out.parts={parts} for each"
        )
    return [dirs[k] for k in range(parts)]


def dataset_dirs(path: str, key: str = "source.path") -> list[str]:
    """The local directories of the dataset at ``path``: itself, or its parts in part order."""
    store = LocalStore(str(path))
    return [store.where(rel) for rel in dataset_parts(store, key)]


def load_index(where, rel: str = "") -> list[dict]:
    """The chunks of the dataset directory ``rel`` of ``where`` (a path or a store), from its index.json, once
    the layout is one feedline reads."""
    store = as_store(where)
    where = store.where(_join(rel, "index.json"))
    index = _json(store, _join(rel, "index.json"), ChunkError)
    if not isinstance(index.get("chunks"), list):
        raise ChunkError(f"{where}: no list of chunks; copy the dataset again, or convert it again")
    config = index.get("config") or {}
    for name in ("compression", "encryption"):
        if config.get(name):
            raise ChunkError(
                f"{where}: {name}={config[name]!r}; feedline reads uncompressed, unencrypted chunks (the images are "
                f"compressed files already). Write the dataset again with python convert.py out.format=shards"
            )
    if config.get("item_loader") != "PyTreeLoader" or list(config.get("data_format") or []) != [
        "bytes",
        "int",
    ]:
        raise ChunkError(
            f"{where}: samples of {config.get('data_format')} read by {config.get('item_loader')}; feedline reads "
            f"(image bytes, int label) samples as python convert.py out.format=shards writes them"
        )
    return list(index["chunks"])


def _json(store, rel: str, error: type[Exception]) -> dict:
    """The JSON object in ``rel`` of ``store``, or ``error`` naming the file (a garbled or truncated copy)."""
    where = store.where(rel)
    try:
        value = json.loads(store.read(rel))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise error(
            f"{where} is not readable JSON ({err}): copy the dataset again, or convert it again"
        ) from None
    if not isinstance(value, dict):
        raise error(
            f"{where} holds {type(value).__name__}, not a JSON object: copy or convert the dataset again"
        )
    return value


def index_identity(directory: str) -> tuple[int, int]:
    """(inode, mtime_ns) of ``directory``'s index.json: a new conversion writes a new one."""
    st = os.stat(os.path.join(directory, "index.json"))
    return st.st_ino, st.st_mtime_ns


def read_sidecar(where, rel: str = "") -> dict:
    store = as_store(where)
    sidecar = _json(store, _join(rel, SIDECAR), ValueError)
    if sidecar.get("format") != FORMAT:
        raise ValueError(
            f"{store.where(_join(rel, SIDECAR))}: format {sidecar.get('format')!r}, not {FORMAT!r}"
        )
    classes = sidecar.get("classes")
    if not isinstance(classes, list) or not isinstance(sidecar.get("samples"), int):
        raise ValueError(
            f"{store.where(_join(rel, SIDECAR))}: no list of classes and count of samples; convert the dataset "
            f"again"
        )
    return sidecar


class Chunks:
    """The chunks of one dataset (its parts concatenated): sample ``row`` -> (image bytes, label).

    Pickles as paths and numbers, O(chunks); maps are opened lazily, in the process that reads, at most
    ``OPEN_MAPS`` at a time (least recently used closed first)."""

    def __init__(self, files: list[str], sizes, nbytes, identity: dict | None = None, labels=None):
        self.files = list(files)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.nbytes = np.asarray(nbytes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        # directory -> (inode, mtime_ns) of its index.json when the dataset was read: a chunk is mapped only
        # while its dataset is still that one (not converted again to the same out.path meanwhile)
        self.identity = dict(identity or {})
        # (labels.npy path, first row) per directory, and each chunk's directory: every sample read is checked
        # against the label the dataset recorded for its row (a chunk in the place of another is refused)
        self.label_files = list(labels) if labels else []
        self._labels: dict[int, np.ndarray] = {}
        self._first_chunks = [int(first_chunk) for _, _, first_chunk in self.label_files]
        self._maps: collections.OrderedDict | None = None
        self._pid = None

    @classmethod
    def of(cls, directories: list[str]) -> Chunks:
        files, sizes, nbytes, identity, labels = [], [], [], {}, []
        for directory in directories:
            identity[directory] = index_identity(directory)
            labels.append((os.path.join(directory, LABELS), sum(sizes), len(files)))
            for chunk in load_index(directory):
                files.append(os.path.join(directory, chunk["filename"]))
                sizes.append(int(chunk["chunk_size"]))
                nbytes.append(int(chunk["chunk_bytes"]))
        if not all(os.path.isfile(path) for path, _, _ in labels):
            labels = None  # being written (the writer reads the labels back from the chunks)
        return cls(files, sizes, nbytes, identity, labels)

    def __getstate__(self):
        return self.files, self.sizes, self.nbytes, self.identity, self.label_files

    def __setstate__(self, state):
        self.__init__(*state)

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def chunk_of(self, rows) -> np.ndarray:
        """The chunk of each row (vectorised)."""
        return np.searchsorted(self.starts, np.asarray(rows, dtype=np.int64), side="right") - 1

    def locate(self, row: int) -> tuple[int, int]:
        c = int(np.searchsorted(self.starts, row, side="right")) - 1
        return c, int(row - self.starts[c])

    def check_files(self) -> None:
        """Every chunk present with the size index.json gives it (one stat each), or a ChunkError naming it."""
        for c in range(len(self.files)):
            self._checked_size(c)

    def _checked_size(self, c: int) -> None:
        path = self.files[c]
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise ChunkError(
                f"chunk {path} is missing (index.json lists it): copy the dataset again, or convert it again"
            ) from None
        if size != int(self.nbytes[c]):
            raise ChunkError(
                f"chunk {path} holds {size} bytes, index.json says {int(self.nbytes[c])}: it is truncated or was "
                f"replaced; copy the dataset again, or convert it again"
            )

    def _checked_dataset(self, c: int) -> None:
        """The chunk's dataset is the one this run read (one stat of its index.json), or a ChunkError: a
        conversion to the same out.path replaced it, and its chunks, of the same names and maybe sizes, hold
        other samples than the rows and splits this run drew from the old one."""
        directory = os.path.dirname(self.files[c])
        then = self.identity.get(directory)
        if then is None:
            return
        try:
            now = index_identity(directory)
        except FileNotFoundError:
            now = None
        if now != tuple(then):
            raise ChunkError(
                f"the shards dataset {directory} was replaced (converted again?) since this run read it: its chunks "
                f"hold other samples than the run's splits; restart the run, and convert to another out.path while "
                f"a run reads the old one"
            )

    def _map(self, c: int):
        if self._pid != os.getpid():  # first use in this process: never a map inherited through fork
            self._maps, self._pid = collections.OrderedDict(), os.getpid()
        if c in self._maps:
            self._maps.move_to_end(c)
            return self._maps[c]
        self._checked_dataset(c)
        self._checked_size(c)
        path, n = self.files[c], int(self.sizes[c])
        with open(path, "rb") as f:
            # copy-on-write: views are writable (torch takes them without a copy or a warning); nothing writes
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        offsets = np.frombuffer(m, dtype="<u4", count=n + 1, offset=4).astype(np.int64)
        if struct.unpack_from("<I", m, 0)[0] != n or offsets[0] != 4 * (n + 2) or offsets[-1] > len(m):
            raise ChunkError(f"chunk {path} does not hold the {n} samples index.json lists: convert it again")
        if n and (offsets[0] == offsets[-1] or m[-len(ARROW_TAIL) :] == ARROW_TAIL):
            raise ChunkError(
                f"chunk {path} keeps its samples in an Arrow footer (LitData writes dicts so when pyarrow is "
                f"installed); feedline reads (image bytes, label) tuples: write it with python convert.py "
                f"out.format=shards"
            )
        self._maps[c] = (m, offsets)
        while len(self._maps) > OPEN_MAPS:
            self._maps.popitem(last=False)  # closed once the last view of it is gone
        return self._maps[c]

    def read(self, row: int) -> tuple[np.ndarray, int]:
        c, j = self.locate(row)
        m, offsets = self._map(c)
        start, stop = int(offsets[j]), int(offsets[j + 1])
        size, label_size = struct.unpack_from("<II", m, start)
        if label_size != 8 or start + 16 + size != stop:
            raise OSError(
                f"{self.where(row)}: malformed sample (sizes {size}, {label_size} in {stop - start} bytes)"
            )
        image = np.frombuffer(m, dtype=np.uint8, count=size, offset=start + 8)
        label = struct.unpack_from("<q", m, start + 8 + size)[0]
        if self.label_files:
            self._check_label(row, c, j, label)
        return image, label

    def _check_label(self, row: int, c: int, j: int, label: int) -> None:
        """The sample's label is the one labels.npy records for its row (mapped once per process), or a
        ChunkError: the chunk is not the one written there (another of the same size copied over it, index.json
        entries reordered), and its samples are not the rows the splits were drawn over."""
        d = bisect.bisect_right(self._first_chunks, c) - 1  # the directory (part) of chunk c
        path, first, _ = self.label_files[d]
        if d not in self._labels:
            self._labels[d] = np.load(path, mmap_mode="r")
        expected = int(self._labels[d][row - first])
        if label != expected:
            raise ChunkError(
                f"chunk {self.files[c]}: sample {j} holds label {label}, but {path} records {expected} for it: the "
                f"chunk is not the one written there (another chunk copied over it, or index.json edited); copy "
                f"the dataset again, or convert it again"
            )

    def labels(self) -> np.ndarray:
        """Every sample's label, read from the chunks (what the writer records in labels.npy)."""
        out = np.empty(self.total, dtype=np.int64)
        for c in range(len(self.files)):
            m, offsets = self._map(c)
            data = np.frombuffer(m, dtype=np.uint8)
            starts = offsets[:-1]
            sizes = np.zeros(len(starts), dtype=np.int64)
            for k in range(4):
                sizes |= data[starts + k].astype(np.int64) << (8 * k)
            at = starts + 8 + sizes
            out[self.starts[c] : self.starts[c + 1]] = [struct.unpack_from("<q", m, int(a))[0] for a in at]
        return out

    def where(self, row: int) -> str:
        c, j = self.locate(row)
        return f"{self.files[c]}[{j}]"

"""The shards format on disk (LitData's optimised chunks), read without LitData: one sample in O(1).

    DIR/index.json          {"chunks": [{"filename", "chunk_size": samples, "chunk_bytes": file size}, ...],
                             "config": {"data_format": ["bytes", "int"], "item_loader": "PyTreeLoader",
                                        "compression": null, "encryption": null, ...}}
    DIR/chunk-<w>-<n>.bin   uint32 N | uint32 offsets[N + 1] (absolute) | N samples, each:
                            uint32 len(image) | uint32 8 | the image file's bytes | int64 label
                            (samples of named fields: dicts, each leaf sized in the sample's head, ``leaves.py``)
    DIR/feedline.json       feedline's sidecar: the class names, the sample count, how it was written
    DIR/labels.npy          every sample's label, in order (int64): a split never reads a chunk
    DIR/part-0000K-of-0000N/    the same, per part, when a conversion is split over N jobs

``index.json`` is written last (LitData's writer), and feedline renames a dataset into place only once it
and the sidecar exist, so a directory without them is not a dataset. Samples are numbered across the chunks
in ``index.json``'s order, and across parts in part order (``datasets/shards/parts.py``). What the three small files
say is checked where they are read (``datasets/shards/meta.py``); a chunk is checked against them when first opened in
the process that reads it (size, sample count, offsets table) and each sample against labels.npy, so a
missing, truncated or swapped chunk stops the run naming its path or URL; a malformed sample inside one is a
bad sample (``OSError``).
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import contextlib
import json
import mmap
import os
import stat
import struct

import numpy as np

from feedline.datasets.shards.labels import load_labels
from feedline.datasets.shards.leaves import decode_sample, split_leaves
from feedline.datasets.shards.meta import (
    AGAIN,
    FORMAT,
    LABELS,
    SIDECAR,
    ChunkError,
    ChunkIndex,
    as_store,
    chunk_index,
    index_identity,
    load_chunk_index,
    load_index,
    read_sidecar,
)
from feedline.datasets.shards.parts import PART, dataset_dirs, dataset_parts, is_complete, part_name

__all__ = [  # what readers, writers and tests import from here; each lives in its own module
    "ARROW_TAIL",
    "FORMAT",
    "LABELS",
    "PART",
    "SIDECAR",
    "ChunkError",
    "Chunks",
    "as_store",
    "dataset_dirs",
    "dataset_parts",
    "index_identity",
    "is_complete",
    "load_index",
    "part_name",
    "read_sidecar",
]

ARROW_TAIL = b"LDARW01\0"  # LitData's Arrow-footer chunks end so: their rows are not in the offsets table
OPEN_MAPS = 64  # chunks open at once per process (a local one holds a file descriptor)
STAT_BLOCK = 4096  # chunks stat'ed per task when every chunk is checked (``check_files``)
STAT_THREADS = 8
SAMPLE_HEAD = 16  # a sample's two uint32 sizes and its int64 label: no sample is shorter


class ChunkFiles:
    """The path of each chunk of a dataset's parts, from its index's arrays: ``names`` (fixed-width bytes,
    mapped from the node's cache) in the folder of the part that holds it (``directories``, ``firsts``). A
    sequence of str built on demand: a million chunks are not a million Python strings in every process."""

    def __init__(self, directories: list[str], firsts: list[int], names: np.ndarray):
        self.directories, self.firsts, self.names = [str(d) for d in directories], list(firsts), names

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, c):
        if isinstance(c, slice):
            return [self[k] for k in range(*c.indices(len(self)))]
        c = int(c)
        if c < 0:
            c += len(self)
        if not 0 <= c < len(self):
            raise IndexError(f"chunk {c} of {len(self)}")
        d = bisect.bisect_right(self.firsts, c) - 1
        return os.path.join(self.directories[d], self.names[c].decode())

    def __iter__(self):
        return (self[c] for c in range(len(self)))

    def __eq__(self, other) -> bool:
        return list(self) == list(other)


class Chunks:
    """The chunks of one dataset (its parts concatenated): sample ``row`` -> (image bytes, label).

    The one read path of every shards dataset, local or not: each check is made here, once. A chunk is opened
    on first use in the process that reads (at most ``OPEN_MAPS`` at a time, least recently used closed
    first) and checked: its dataset is still the one the run read (``_check_current``), its size is the one
    index.json gives, its head holds the sample count index.json lists and an offsets table that tiles the
    chunk exactly. Every sample read is checked for its sizes, and its label against the one labels.npy
    records for its row, so a chunk in the place of another (copied over it, index.json's entries reordered)
    is refused. The bytes come from the primitives below: here, a local chunk memory-mapped; in
    ``cached_chunks.CachedChunks``, one read of a chunk in the node's cache of an object store.

    ``layout``: None for (image bytes, label) samples; else each leaf's (path, serializer) of dict samples of
    named fields (``leaves.py``), read with ``read_sample``, and ``label_leaf`` the path of the int leaf that
    labels.npy records (a class target), or None (labels.npy holds 0 for every sample).

    Pickles as paths and numbers, O(chunks + parts); read through the node's cache of its index
    (``Chunks.of``), as the directories and that cache's path, O(parts)."""

    AGAIN = AGAIN  # what to do about a chunk that is missing or not what index.json says

    def __init__(
        self,
        files: list[str],
        sizes,
        nbytes,
        parts=(0,),
        labels=None,
        identity: dict | None = None,
        layout=None,
        label_leaf=None,
        starts=None,
    ):
        self.files = files if isinstance(files, ChunkFiles) else list(files)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.nbytes = np.asarray(nbytes, dtype=np.int64)
        if starts is None:
            starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.starts = np.asarray(starts, dtype=np.int64)
        self._index = None  # the node's cache of the index these arrays are mapped from (pickled as its path)
        self.parts = [int(first) for first in parts]  # each part's first chunk
        # per part, (labels.npy to map, its name in messages): every sample read is checked against it
        self.label_files = [tuple(entry) for entry in labels] if labels else []
        # directory -> (inode, mtime_ns) of its index.json when the dataset was read: a chunk is mapped only
        # while its dataset is still that one (not converted again to the same out.path meanwhile)
        self.identity = dict(identity or {})
        self.layout = None if layout is None else [(tuple(path), name) for path, name in layout]
        self.label_leaf = None if label_leaf is None else tuple(label_leaf)
        paths = [path for path, _ in self.layout or ()]
        self._label_at = paths.index(self.label_leaf) if self.label_leaf in paths else None
        self._labels: dict[int, np.ndarray] = {}
        self._maps: collections.OrderedDict | None = None
        self._pid = None

    @classmethod
    def of(cls, directories: list[str], label_leaf=None, cache_dir=None) -> Chunks:
        """The chunks of the local dataset ``directories`` (its parts, in order). Their index.json files are
        parsed and checked once per node, and cached under ``cache_dir`` (``meta.chunk_index``); every other
        process maps the cached arrays."""
        directories = [str(d) for d in directories]
        labels = [(os.path.join(d, LABELS),) * 2 for d in directories]
        if not all(os.path.isfile(path) for path, _ in labels):
            labels = None  # being written (the writer reads the labels back from the chunks): nothing cached
        index = chunk_index(directories, part_layouts, cache_dir, cache=labels is not None)
        return cls._of_index(directories, index, labels, label_leaf)

    @classmethod
    def _of_index(cls, directories, index: ChunkIndex, labels, label_leaf) -> Chunks:
        identity = dict(zip(directories, index.stats or [index_identity(d) for d in directories]))
        files = ChunkFiles(directories, index.firsts, index.names)
        chunks = cls(
            files, index.sizes, index.nbytes, index.firsts, labels, identity, index.layout, label_leaf,
            index.starts,
        )  # fmt: skip
        chunks._index = index.where
        return chunks

    def __getstate__(self):
        if self._index is not None and isinstance(self.files, ChunkFiles):  # the cache's path, not its arrays
            return {
                "index": self._index, "directories": self.files.directories, "labels": self.label_files,
                "identity": self.identity, "label_leaf": self.label_leaf,
            }  # fmt: skip
        return (
            self.files, self.sizes, self.nbytes, self.parts, self.label_files, self.identity, self.layout,
            self.label_leaf,
        )  # fmt: skip

    def __setstate__(self, state):
        if not isinstance(state, dict):
            self.__init__(*state)
            return
        directories = state["directories"]
        index = load_chunk_index(state["index"])
        if (
            index is None
        ):  # the cache was cleared meanwhile: read again, kept in memory (a replaced dataset is
            index = chunk_index(directories, part_layouts, cache=False)  # refused on open)
        then = [tuple(state["identity"][d]) for d in directories]  # what the run read, not what is there now
        chunks = self._of_index(directories, index._replace(stats=then), state["labels"], state["label_leaf"])
        self.__dict__.update(chunks.__dict__)

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def part_totals(self) -> list[tuple[int, int]]:
        """(chunks, samples) of each part."""
        bounds = [*self.parts, len(self.files)]
        return [(b - a, int(self.starts[b] - self.starts[a])) for a, b in zip(bounds, bounds[1:])]

    def chunk_of(self, rows) -> np.ndarray:
        """The chunk of each row (vectorised)."""
        return np.searchsorted(self.starts, np.asarray(rows, dtype=np.int64), side="right") - 1

    def locate(self, row: int) -> tuple[int, int]:
        c = int(np.searchsorted(self.starts, row, side="right")) - 1
        return c, int(row - self.starts[c])

    def where(self, row: int) -> str:
        c, j = self.locate(row)
        return f"{self.name(c)}[{j}]"

    # -- the checks: one path for every backend -------------------------------------------------------------
    def check_files(self) -> None:
        """Every chunk present with the size index.json gives it, or a ChunkError naming the first that is
        not. Once per node (``prepare``): the stats are made by a few threads, blocks of chunks at a time (a
        network file system answers each in a round trip), and checked in order. A pass is recorded in the
        node's cache of the index, with each part folder's mtime: the next start checks again only once a
        chunk was added, removed or renamed (1.67M stats took 30 s on a local disk)."""
        stamp, record = self._folders_stamp(), self._checked_record()
        if record is not None and stamp is not None:
            try:
                with open(record) as f:
                    if json.load(f) == stamp:
                        return  # checked already, and no chunk added, removed or renamed since
            except (OSError, ValueError):
                pass
        count = len(self.files)
        if count < 2 * STAT_BLOCK:
            for c in range(count):
                self._checked_size(c, self._size_now(c))
        else:

            def sizes(a: int) -> list:
                return [self._size_now(c) for c in range(a, min(count, a + STAT_BLOCK))]

            with concurrent.futures.ThreadPoolExecutor(STAT_THREADS) as pool:
                blocks = pool.map(sizes, range(0, count, STAT_BLOCK))
                for a, block in zip(range(0, count, STAT_BLOCK), blocks):
                    for c, size in enumerate(block, a):
                        self._checked_size(c, size)
        if record is not None and stamp is not None:
            with contextlib.suppress(OSError):  # a read-only cache: the next prepare checks again
                temporary = f"{record}.{os.getpid()}.tmp"
                with open(temporary, "w") as f:
                    json.dump(stamp, f)
                os.replace(temporary, record)

    def _checked_record(self) -> str | None:
        """Where the node's cache of this index records a passed ``check_files`` (None: not cached)."""
        return None if self._index is None else os.path.join(self._index, "files-checked.json")

    def _folders_stamp(self) -> list | None:
        """Each part folder's (inode, mtime_ns), and the index read: a chunk added, removed or renamed changes
        its folder's mtime. A chunk rewritten in place does not, and is named when it is first opened."""
        if not isinstance(self.files, ChunkFiles):
            return None
        try:
            folders = [[d, os.stat(d).st_ino, os.stat(d).st_mtime_ns] for d in self.files.directories]
        except OSError:
            return None
        return [folders, sorted([d, list(v)] for d, v in self.identity.items())]

    def _checked_size(self, c: int, size: int | None) -> None:
        if size is None:
            raise ChunkError(f"chunk {self.name(c)} is missing (index.json lists it): {self.AGAIN}")
        if size != int(self.nbytes[c]):
            raise ChunkError(
                f"chunk {self.name(c)} holds {size} bytes, index.json says {int(self.nbytes[c])}: it is truncated "
                f"or was replaced; {self.AGAIN}"
            )

    def _open(self, c: int):
        """(handle, offsets) of chunk ``c`` in this process, checked when first opened."""
        if self._pid != os.getpid():  # first use in this process: never a map inherited through fork
            self._maps, self._pid = collections.OrderedDict(), os.getpid()
        if c in self._maps:
            self._maps.move_to_end(c)
            return self._maps[c]
        self._check_current(c)
        self._checked_size(c, self._size_now(c))
        n, size = int(self.sizes[c]), int(self.nbytes[c])
        wrong = ChunkError(
            f"chunk {self.name(c)} does not hold the {n} samples index.json lists: convert it again"
        )
        if 4 * (n + 2) > size:  # not even its offsets fit: never read past its end
            raise wrong
        handle = self._open_chunk(c)
        head = self._bytes(c, handle, 0, 4 * (n + 2))
        offsets = np.frombuffer(head, dtype="<u4", count=n + 1, offset=4).astype(np.int64)
        if struct.unpack_from("<I", head, 0)[0] != n or offsets[0] != 4 * (n + 2):
            raise wrong
        if n and (offsets[0] == offsets[-1] or bytes(self._bytes(c, handle, size - 8, 8)) == ARROW_TAIL):
            raise ChunkError(
                f"chunk {self.name(c)} keeps its samples in an Arrow footer (LitData writes dicts of only bytes, text "
                f"and numbers so when pyarrow is installed); feedline reads the samples python convert.py "
                f"out.format=shards writes: write it so"
            )
        least = SAMPLE_HEAD if self.layout is None else 4 * len(self.layout)  # a sample's head of sizes
        if offsets[-1] != size or np.any(np.diff(offsets) < least):
            raise ChunkError(
                f"chunk {self.name(c)}: its table of sample offsets does not tile its {size} bytes (it ends at "
                f"{int(offsets[-1])}, or a sample is shorter than {least} bytes): it is damaged; {self.AGAIN}"
            )
        self._maps[c] = (handle, offsets)
        while len(self._maps) > OPEN_MAPS:
            self._maps.popitem(last=False)  # a map is closed once the last view of it is gone
        return self._maps[c]

    def _sample_bytes(self, row: int):
        c, j = self.locate(row)
        handle, offsets = self._open(c)
        start = int(offsets[j])
        return c, j, self._bytes(c, handle, start, int(offsets[j + 1]) - start)

    def read_sample(self, row: int) -> dict:
        """Sample ``row`` of a dataset of named fields: its dict (``leaves.decode_sample``), the arrays views of
        the chunk; one that does not parse is an OSError naming the chunk and the sample."""
        c, j, data = self._sample_bytes(row)
        try:
            sample = decode_sample(self.layout, data)
        except ValueError as err:
            raise OSError(f"{self.where(row)}: malformed sample ({err})") from None
        if self.label_files:
            self._check_label(row, c, j, self._label_in(sample))
        return sample

    def _label_in(self, sample: dict) -> int:
        if self._label_at is None:
            return 0
        node = sample
        for key in self.label_leaf:
            node = node[key]
        return int(node)

    def read(self, row: int) -> tuple[np.ndarray, int]:
        if self.layout is not None:
            raise TypeError(f"{self.where(row)} is a sample of named fields: read it with read_sample")
        c, j, data = self._sample_bytes(row)
        size, label_size = struct.unpack_from("<II", data, 0)
        if label_size != 8 or SAMPLE_HEAD + size != len(data):
            raise OSError(
                f"{self.where(row)}: malformed sample (sizes {size}, {label_size} in {len(data)} bytes)"
            )
        label = struct.unpack_from("<q", data, 8 + size)[0]
        if self.label_files:
            self._check_label(row, c, j, label)
        return np.frombuffer(data, dtype=np.uint8, count=size, offset=8), label

    def _check_label(self, row: int, c: int, j: int, label: int) -> None:
        """The sample's label is the one labels.npy records for its row (mapped once per process), or a
        ChunkError: the chunk is not the one written there (another of the same size copied over it, index.json
        entries reordered), and its samples are not the rows the splits were drawn over."""
        d = bisect.bisect_right(self.parts, c) - 1  # the part of chunk c
        path, shown = self.label_files[d]
        if d not in self._labels:
            self._labels[d] = load_labels(path)
        first = int(self.starts[self.parts[d]])
        expected = int(self._labels[d][row - first]) if row - first < len(self._labels[d]) else None
        if label != expected:
            raise ChunkError(
                f"chunk {self.name(c)}: sample {j} holds label {label}, but {shown} records {expected} for it: the "
                f"chunk is not the one written there (another chunk copied over it, or index.json edited); "
                f"{self.AGAIN}"
            )

    def labels(self) -> np.ndarray:
        """Every sample's label, read from the chunks (what the writer records in labels.npy)."""
        out = np.empty(self.total, dtype=np.int64)
        if self.layout is not None:  # a class target's int leaf, or 0 for every sample
            for row in range(self.total):  # every sample's head of sizes checked on the way
                try:
                    leaves = split_leaves(self._sample_bytes(row)[2], len(self.layout))
                    at = self._label_at
                    out[row] = 0 if at is None else struct.unpack("<q", leaves[at])[0]
                except (ValueError, struct.error) as err:
                    raise OSError(f"{self.where(row)}: malformed sample ({err})") from None
            return out
        for c in range(len(self.files)):
            handle, offsets = self._open(c)
            data = np.frombuffer(self._bytes(c, handle, 0, int(self.nbytes[c])), dtype=np.uint8)
            starts = offsets[:-1]
            sizes = np.zeros(len(starts), dtype=np.int64)
            for k in range(4):
                sizes |= data[starts + k].astype(np.int64) << (8 * k)
            at = starts + 8 + sizes
            out[self.starts[c] : self.starts[c + 1]] = [struct.unpack_from("<q", data, int(a))[0] for a in at]
        return out

    # -- the primitives: where a chunk's bytes come from (here, a local file, memory-mapped) ------------------
    def name(self, c: int) -> str:
        """Chunk ``c`` in messages: its path (or URL)."""
        return self.files[c]

    def _size_now(self, c: int) -> int | None:
        """Chunk ``c``'s size in bytes as it is now (None: missing)."""
        try:
            st = os.stat(self.files[c])
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise ChunkError(f"chunk {self.files[c]} is not a regular file: {self.AGAIN}")
        return st.st_size

    def _check_current(self, c: int) -> None:
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

    def _open_chunk(self, c: int):
        with open(self.files[c], "rb") as f:
            # copy-on-write: views are writable (torch takes them without a copy or a warning); nothing writes
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))

    def _bytes(self, c: int, handle, offset: int, length: int):
        """``length`` bytes of chunk ``c`` at ``offset`` (a view of its map: no copy)."""
        return handle[offset : offset + length]


def part_layouts(parts, layout_of_part):
    """The one sample layout of every part (``layout_of_part(part)``), or a ChunkError naming the part that
    differs: parts of two conversions of other fields."""
    layouts = [layout_of_part(part) for part in parts]
    for part, layout in zip(parts[1:], layouts[1:]):
        if layout != layouts[0]:
            raise ChunkError(
                f"{part}: its samples hold other fields than {parts[0]}'s (index.json's data_format and data_spec): "
                f"convert every part again from one source"
            )
    return layouts[0] if layouts else None

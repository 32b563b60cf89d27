"""The chunks of a shards dataset in object storage, read through the node's chunk cache (``chunk_cache.py``).

The same samples, numbering and checks as ``chunks.Chunks`` (which maps local chunks): a sample is its
chunk's offsets (read once per process from the chunk's head) and one read of its bytes from the cached chunk;
a chunk not cached is fetched whole by the first process that needs it. A chunk missing from the store or of
another size than ``index.json`` says stops the run with a ``ChunkError`` naming its URL.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

from feedline.datasets.chunk_cache import ChunkCache
from feedline.datasets.chunks import ChunkError, Chunks
from feedline.datasets.stores import StoreError


def cache_directory(cache_root: str) -> str:
    """The node's one chunk cache under ``cache_root``: every dataset, URL and endpoint share it and its limit
    (a chunk's cache name tells them apart, ``CachedChunks.cache_name``), so train, val and a dataset
    converted again never hold more than the limit together, and chunks no longer read age out."""
    return os.path.join(os.path.expanduser(str(cache_root)), "chunks")


def cache_name(base: str, rel: str, etag: str | None) -> str:
    """A chunk's file name in the node's cache: its own name after a digest of ``base`` (endpoint, URL and
    conversion), its path and ETag, so that no two datasets, nor two uploads of one, share a cached chunk."""
    digest = hashlib.blake2b(f"{base}\n{rel}\n{etag or ''}".encode(), digest_size=8).hexdigest()
    return f"{digest}-{rel.rsplit('/', 1)[-1]}"


class CachedChunks(Chunks):
    """``files``: the chunks' names relative to ``store`` (``part-.../chunk-0-0.bin``)."""

    def __init__(
        self, store, cache: ChunkCache, files: list[str], sizes, nbytes, listed: dict, names: list[str]
    ):
        super().__init__(files, sizes, nbytes)
        self.store, self.cache, self.listed, self.names = store, cache, listed, names
        self._offsets: dict[int, np.ndarray] = {}
        self._offsets_pid = None

    @classmethod
    def of_store(cls, store, parts: list[str], cache: ChunkCache, version: str = "") -> CachedChunks:
        """``version``: the conversion's identity (its index.json files and sidecars). One listing of the
        store pins each chunk's size and ETag for the run."""
        from feedline.datasets.chunks import load_index

        files, sizes, nbytes = [], [], []
        for rel in parts:
            for chunk in load_index(store, rel):
                files.append(f"{rel}/{chunk['filename']}" if rel else chunk["filename"])
                sizes.append(int(chunk["chunk_size"]))
                nbytes.append(int(chunk["chunk_bytes"]))
        wanted = set(files)
        listed = {rel: entry for rel, entry in store.listing().items() if rel in wanted}
        base = f"{store.endpoint}\n{store.url}\n{version}"
        names = [cache_name(base, rel, (listed.get(rel) or (0, None))[1]) for rel in files]
        return cls(store, cache, files, sizes, nbytes, listed, names)

    def __getstate__(self):
        return self.store, self.cache, self.files, self.sizes, self.nbytes, self.listed, self.names

    def __setstate__(self, state):
        self.__init__(*state)

    def url(self, c: int) -> str:
        return self.store.where(self.files[c])

    def check_files(self) -> None:
        """Every chunk in the store, with the size index.json gives it and the ETag this run pinned: one
        listing."""
        now = self.store.listing()
        for c, rel in enumerate(self.files):
            if rel not in now:
                raise ChunkError(
                    f"chunk {self.url(c)} is missing (index.json lists it): upload the dataset again, or convert "
                    f"it again"
                )
            size, etag = now[rel]
            if size != int(self.nbytes[c]):
                raise ChunkError(
                    f"chunk {self.url(c)} holds {size} bytes, index.json says {int(self.nbytes[c])}: it is "
                    f"truncated or was replaced; upload the dataset again, or convert it again"
                )
            if rel in self.listed and etag != self.listed[rel][1]:
                raise ChunkError(
                    f"chunk {self.url(c)} was replaced after this run listed it (ETag {self.listed[rel][1]} -> "
                    f"{etag}): the dataset was written again under a running job; start the run again"
                )

    def _bytes(self, c: int, offset: int, length: int) -> bytearray:
        rel = self.files[c]
        etag = (self.listed.get(rel) or (0, None))[1]
        try:
            return self.cache.read(
                self.names[c], int(self.nbytes[c]), offset, length, self.store.fetch(rel, etag)
            )
        except StoreError as err:
            then = ""
            if getattr(err, "unreachable", False):  # it answered when the run listed the dataset
                then = (
                    "; it answered when this run listed the dataset, so it went down since: once it answers "
                    "again, resume from the run's checkpoints/last.ckpt (ckpt_path=PATH, or ckpt_path=last in the same "
                    "hydra.run.dir)"
                )
            raise ChunkError(f"chunk {self.url(c)} could not be fetched: {err}{then}") from None

    def _offsets_of(self, c: int) -> np.ndarray:
        if self._offsets_pid != os.getpid():
            self._offsets, self._offsets_pid = {}, os.getpid()
        if c not in self._offsets:
            n = int(self.sizes[c])
            if (
                4 * (n + 2) > self.nbytes[c]
            ):  # not even its offsets fit: a read past its end, never an eviction
                raise ChunkError(
                    f"chunk {self.url(c)} does not hold the {n} samples index.json lists ({int(self.nbytes[c])} "
                    f"bytes): convert it again"
                )
            head = self._bytes(c, 0, 4 * (n + 2))
            offsets = np.frombuffer(head, dtype="<u4", count=n + 1, offset=4).astype(np.int64)
            if (
                struct.unpack_from("<I", head, 0)[0] != n
                or offsets[0] != 4 * (n + 2)
                or offsets[-1] > self.nbytes[c]
            ):
                raise ChunkError(
                    f"chunk {self.url(c)} does not hold the {n} samples index.json lists: convert it again"
                )
            if n and offsets[0] == offsets[-1]:
                raise ChunkError(
                    f"chunk {self.url(c)} keeps its samples in an Arrow footer; feedline reads (image bytes, label) "
                    f"tuples: write it with python convert.py out.format=shards"
                )
            self._offsets[c] = offsets
        return self._offsets[c]

    def read(self, row: int) -> tuple[np.ndarray, int]:
        c, j = self.locate(row)
        offsets = self._offsets_of(c)
        start, stop = int(offsets[j]), int(offsets[j + 1])
        data = self._bytes(c, start, stop - start)
        size, label_size = struct.unpack_from("<II", data, 0)
        if label_size != 8 or 16 + size != len(data):
            raise OSError(
                f"{self.where(row)}: malformed sample (sizes {size}, {label_size} in {len(data)} bytes)"
            )
        return np.frombuffer(data, dtype=np.uint8, count=size, offset=8), struct.unpack_from(
            "<q", data, 8 + size
        )[0]

    def where(self, row: int) -> str:
        c, j = self.locate(row)
        return f"{self.url(c)}[{j}]"

    def labels(self) -> np.ndarray:
        raise NotImplementedError("labels come from the dataset's labels.npy")

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


def cache_directory(cache_root: str, url: str, endpoint: str, version: str = "") -> str:
    """One cache directory per dataset URL, endpoint and ``version`` (the same URL on two endpoints is two
    datasets, and so is a URL converted again)."""
    digest = hashlib.blake2b(f"{endpoint}\n{url}\n{version}".encode(), digest_size=8).hexdigest()
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in url.split("://", 1)[-1])[:60]
    return os.path.join(os.path.expanduser(str(cache_root)), "chunks", f"{name}-{digest}")


class CachedChunks(Chunks):
    """``files``: the chunks' names relative to ``store`` (``part-.../chunk-0-0.bin``)."""

    def __init__(self, store, cache: ChunkCache, files: list[str], sizes, nbytes):
        super().__init__(files, sizes, nbytes)
        self.store, self.cache = store, cache
        self._offsets: dict[int, np.ndarray] = {}
        self._offsets_pid = None

    @classmethod
    def of_store(cls, store, parts: list[str], cache: ChunkCache) -> CachedChunks:
        from feedline.datasets.chunks import load_index

        files, sizes, nbytes = [], [], []
        for rel in parts:
            for chunk in load_index(store, rel):
                files.append(f"{rel}/{chunk['filename']}" if rel else chunk["filename"])
                sizes.append(int(chunk["chunk_size"]))
                nbytes.append(int(chunk["chunk_bytes"]))
        return cls(store, cache, files, sizes, nbytes)

    def __getstate__(self):
        return self.store, self.cache, self.files, self.sizes, self.nbytes

    def __setstate__(self, state):
        self.__init__(*state)

    def url(self, c: int) -> str:
        return self.store.where(self.files[c])

    def check_files(self) -> None:
        """Every chunk in the store with the size index.json gives it: one listing."""
        listed = self.store.sizes()
        for c, rel in enumerate(self.files):
            if rel not in listed:
                raise ChunkError(
                    f"chunk {self.url(c)} is missing (index.json lists it): upload the dataset again, or convert "
                    f"it again"
                )
            if listed[rel] != int(self.nbytes[c]):
                raise ChunkError(
                    f"chunk {self.url(c)} holds {listed[rel]} bytes, index.json says {int(self.nbytes[c])}: it is "
                    f"truncated or was replaced; upload the dataset again, or convert it again"
                )

    def _bytes(self, c: int, offset: int, length: int) -> bytearray:
        rel = self.files[c]
        name = rel.replace("/", "__")
        try:
            return self.cache.read(name, int(self.nbytes[c]), offset, length, self.store.fetch(rel))
        except StoreError as err:
            raise ChunkError(f"chunk {self.url(c)} could not be fetched: {err}") from None

    def _offsets_of(self, c: int) -> np.ndarray:
        if self._offsets_pid != os.getpid():
            self._offsets, self._offsets_pid = {}, os.getpid()
        if c not in self._offsets:
            n = int(self.sizes[c])
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

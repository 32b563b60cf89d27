"""The chunks of a shards dataset in object storage, read through the node's chunk cache (``storage/chunk_cache.py``).

``CachedChunks`` is ``chunks.Chunks`` with other bytes under it: the same read path, so the same samples,
numbering and checks (size, sample count, offsets table, every sample's label against labels.npy), made in
one place. It gives only the primitives: a chunk's size from the listing this run pinned, and a read of
its bytes (one ``pread`` from the cached chunk, which the first process that needs it fetches whole). A
chunk missing from the store, of another size than ``index.json`` says, replaced since the listing (its
ETag), or whose bytes are not those ``feedline.json`` records (their digest, checked as the download is
written, before the chunk enters the cache) stops the run with a ``ChunkError`` naming its URL. A dataset
whose sidecar records no digests (an earlier feedline's) is read as before. A local chunk is never hashed
(``chunks.Chunks`` checks it by its size, offsets table and labels only): the digest guards the download.
"""

from __future__ import annotations

import hashlib
import os

from feedline.datasets.shards.chunks import ChunkError, Chunks, load_index, part_layouts
from feedline.datasets.shards.meta import SIDECAR, chunk_digests, index_layout, join, read_sidecar
from feedline.storage.chunk_cache import ChunkCache, DigestError
from feedline.storage.stores import StoreError


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
    """``files``: the chunks' names relative to ``store`` (``part-.../chunk-0-0.bin``); ``labels``: per part,
    a local copy of its labels.npy and the URL it was read from; ``digests``: per chunk, the (algorithm, hex
    digest) its part's feedline.json records, or None."""

    AGAIN = "upload the dataset again, or convert it again"

    def __init__(
        self, store, cache: ChunkCache, files: list[str], sizes, nbytes, listed: dict, names: list[str],
        parts=(0,), labels=None, digests=None, layout=None, label_leaf=None,
    ):  # fmt: skip
        super().__init__(files, sizes, nbytes, parts, labels, layout=layout, label_leaf=label_leaf)
        self.store, self.cache, self.listed, self.names = store, cache, listed, names
        self.digests = list(digests) if digests is not None else [None] * len(self.files)

    @classmethod
    def of_store(
        cls, store, parts: list[str], cache: ChunkCache, version: str = "", labels=None, sidecars=None,
        label_leaf=None,
    ) -> CachedChunks:  # fmt: skip
        """``version``: the conversion's identity (its index.json files and sidecars); ``sidecars``: each part's
        feedline.json as read (``shard_meta.read_sidecar``; read here when not given), whose chunk digests
        every download must match. One listing of the store pins each chunk's size and ETag for the run."""
        files, sizes, nbytes, firsts, digests = [], [], [], [], []
        for k, rel in enumerate(parts):
            firsts.append(len(files))
            entries = load_index(store, rel)
            sidecar = sidecars[k] if sidecars is not None else read_sidecar(store, rel)
            digests += chunk_digests(sidecar, entries, store.where(join(rel, SIDECAR)))
            for chunk in entries:
                files.append(join(rel, chunk["filename"]))
                sizes.append(chunk["chunk_size"])
                nbytes.append(chunk["chunk_bytes"])
        layout = part_layouts(parts, lambda rel: index_layout(store, rel))
        wanted = set(files)
        listed = {rel: entry for rel, entry in store.listing().items() if rel in wanted}
        base = f"{store.endpoint}\n{store.url}\n{version}"
        names = [cache_name(base, rel, (listed.get(rel) or (0, None))[1]) for rel in files]
        return cls(
            store, cache, files, sizes, nbytes, listed, names, firsts, labels, digests, layout, label_leaf
        )  # fmt: skip

    def __getstate__(self):
        return (
            self.store, self.cache, self.files, self.sizes, self.nbytes, self.listed, self.names, self.parts,
            self.label_files, self.digests, self.layout, self.label_leaf,
        )  # fmt: skip

    def __setstate__(self, state):
        self.__init__(*state)

    def url(self, c: int) -> str:
        return self.store.where(self.files[c])

    name = url

    def check_files(self) -> None:
        """Every chunk in the store, with the size index.json gives it and the ETag this run pinned: one
        listing."""
        now = self.store.listing()
        for c, rel in enumerate(self.files):
            size, etag = now.get(rel, (None, None))
            self._checked_size(c, size)
            if rel in self.listed and etag != self.listed[rel][1]:
                raise ChunkError(
                    f"chunk {self.url(c)} was replaced after this run listed it (ETag {self.listed[rel][1]} -> "
                    f"{etag}): the dataset was written again under a running job; start the run again"
                )

    # -- the primitives (``Chunks`` makes every check) ------------------------------------------------------
    def _size_now(self, c: int) -> int | None:
        """The size this run's listing pinned (no request): the ETag pinned with it makes every fetch read that
        very object, so a chunk replaced since is refused when fetched (``stores.S3Store.fetch``)."""
        return (self.listed.get(self.files[c]) or (None,))[0]

    def _check_current(self, c: int) -> None:
        """Nothing to look at: what a local dataset's index.json identity tells, the pinned ETags tell here."""

    def _open_chunk(self, c: int):
        return None

    def _bytes(self, c: int, handle, offset: int, length: int) -> bytearray:
        rel = self.files[c]
        etag = (self.listed.get(rel) or (0, None))[1]
        try:
            return self.cache.read(
                self.names[c],
                int(self.nbytes[c]),
                offset,
                length,
                self.store.fetch(rel, etag),
                self.digests[c],
            )
        except DigestError as err:
            raise ChunkError(
                f"chunk {self.url(c)}: its bytes differ from what feedline.json records ({err.algorithm} "
                f"{err.got[:16]}..., recorded {err.expected[:16]}...): it was replaced in the bucket, or damaged in "
                f"transit; it was not cached. {self.AGAIN[0].upper()}{self.AGAIN[1:]}"
            ) from None
        except StoreError as err:
            then = ""
            if getattr(err, "unreachable", False):  # it answered when the run listed the dataset
                then = (
                    "; it answered when this run listed the dataset, so it went down since: once it answers "
                    "again, resume from the run's checkpoints/last.ckpt (ckpt_path=PATH, or ckpt_path=last in the same "
                    "hydra.run.dir)"
                )
            raise ChunkError(f"chunk {self.url(c)} could not be fetched: {err}{then}") from None

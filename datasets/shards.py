"""The ``shards`` source: a shards dataset (``datasets/chunks.py``), as ``convert.py out.format=shards`` writes it.

The classes and every sample's label come from feedline's sidecar (no chunk is read to split); the splits
are separate datasets (``val_path``, ``test_path``) or a seeded, stratified share (``splits.py``); samples are
read through ``Chunks`` (O(1), memory-mapped in the process that reads). The train order is chunk-aware
(``chunk_order.py``): ``records.epoch_order(seed, epoch)``, partitioned over ranks and resumed by the sampler
like any other order.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os

import numpy as np

from feedline.datasets.cache import cache_path, default_cache_dir
from feedline.datasets.cached_chunks import CachedChunks, cache_directory
from feedline.datasets.chunk_cache import ChunkCache
from feedline.datasets.chunk_order import check_window, chunk_order
from feedline.datasets.chunks import LABELS, Chunks, dataset_parts, read_sidecar
from feedline.datasets.options import ShardsOptions as _O  # the defaults, written once
from feedline.datasets.records import Records, Source, check_class_names, require_dir
from feedline.datasets.sizes import describe, parse_bytes
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for
from feedline.datasets.stores import LocalStore, S3Store, is_url

log = logging.getLogger(__name__)


class ShardsRecords(Records):
    """One split of a shards dataset. Payload: the image file's bytes (uint8, 1-D, a view of the chunk)."""

    def __init__(self, chunks: Chunks, window: int, subset=None):
        super().__init__(subset)
        self.chunks, self.window = chunks, int(window)

    @property
    def total(self) -> int:
        return self.chunks.total

    def read(self, row: int):
        return self.chunks.read(row)

    def where(self, row: int) -> str:
        return self.chunks.where(row)

    def _bounds(self) -> np.ndarray:
        """Chunk c holds this split's samples ``bounds[c]:bounds[c + 1]`` (a split's rows are sorted)."""
        rows = self.subset.array if self.subset is not None else None
        starts = self.chunks.starts
        return starts if rows is None else np.searchsorted(rows, starts)

    def order_identity(self) -> str:
        """What ``epoch_order`` draws from besides (seed, epoch): the window and how the split's samples lie in
        the chunks. A resume checks it (``resume_checks.py``): another window, or the same samples converted
        into other chunks, is another order, whose rest would repeat some consumed samples and miss others."""
        bounds = np.ascontiguousarray(self._bounds(), dtype=np.int64)
        digest = hashlib.blake2b(bounds.data, digest_size=6).hexdigest()
        return f"window {self.window} over {len(bounds) - 1} chunks ({digest})"

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """This split's samples in the order epoch ``epoch`` reads them: chunks permuted, samples shuffled
        within windows of ``window`` chunks (``chunk_order.py``)."""
        return chunk_order(self._bounds(), self.window, seed, epoch)


class ShardsSource(Source):
    """Samples from a shards directory; val from ``val_path`` or a seeded, stratified ``val_fraction``; test
    likewise from ``test_path`` or ``test_fraction``."""

    def __init__(
        self,
        path: str,
        val_path: str | None = _O.val_path,
        val_fraction: float = _O.val_fraction,
        test_path: str | None = _O.test_path,
        test_fraction: float = _O.test_fraction,
        seed: int = _O.seed,
        window: int = _O.window,
        cache_dir: str | None = _O.cache_dir,
        cache_limit=_O.cache_limit,
        storage_options: dict | None = None,  # ShardsOptions: {}
    ):
        self.storage_options = dict(storage_options or {})
        self.path = self._location(path, "source.path")
        self.val_path = self._location(val_path, "source.val_path") if val_path else None
        self.test_path = self._location(test_path, "source.test_path") if test_path else None
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        if self.val_path:
            self.val_fraction = 0.0
        if self.test_path:
            self.test_fraction = 0.0
        self.seed = check_seed(seed)
        self.window = check_window(window)
        self.cache_dir = cache_dir
        self.cache_limit = parse_bytes(cache_limit, "source.cache_limit", 1000, 2**62, "20GB")
        self._datasets: dict[str, dict] = {}
        self._dataset(self.path, "source.path")  # a bad path, a missing part: fails before any work starts

    def _location(self, path, key: str) -> str:
        return str(path).rstrip("/") if is_url(path) else require_dir(path, key)

    def _store(self, path: str, key: str):
        return S3Store(path, self.storage_options, key) if is_url(path) else LocalStore(path)

    def _dataset(self, path: str, key: str) -> dict:
        if path not in self._datasets:
            store = self._store(path, key)
            parts = dataset_parts(store, key)
            sidecars = [read_sidecar(store, rel) for rel in parts]
            classes = check_class_names(sidecars[0]["classes"], f"{key} '{path}'")
            for rel, sidecar in zip(parts, sidecars):
                if list(sidecar["classes"]) != classes:
                    raise ValueError(
                        f"{key} '{path}': {store.where(rel)} has other classes than {store.where(parts[0])}: "
                        f"convert its parts again"
                    )
            chunks = self._chunks(store, parts, path, key)
            labels = np.concatenate([_labels(store, rel) for rel in parts])
            if len(labels) != chunks.total or (
                len(labels) and not 0 <= labels.min() <= labels.max() < len(classes)
            ):
                raise ValueError(
                    f"{key} '{path}': {LABELS} holds {len(labels)} labels for {chunks.total} samples in "
                    f"{len(classes)} classes: convert it again"
                )
            index = hashlib.blake2b(digest_size=8)
            for rel in parts:
                index.update(store.read(f"{rel}/index.json" if rel else "index.json"))
            index.update(
                np.ascontiguousarray(labels, dtype=np.int64).data
            )  # another write order: another split
            identity = [index.hexdigest(), [sidecar["samples"] for sidecar in sidecars]]
            self._datasets[path] = {
                "classes": classes,
                "chunks": chunks,
                "labels": labels,
                "identity": identity,
            }
        return self._datasets[path]

    def _chunks(self, store, parts: list[str], path: str, key: str):
        """Local chunks are mapped where they are; a URL's go through this source's chunk cache, which must
        hold what the order reads at once: two windows of the largest chunks."""
        if not store.remote:
            return Chunks.of([store.where(rel) for rel in parts])
        root = self.cache_dir or default_cache_dir()
        directory = cache_directory(root, store.url, store.endpoint)
        chunks = CachedChunks.of_store(store, parts, ChunkCache(directory, self.cache_limit))
        least = 2 * self.window * int(chunks.nbytes.max(initial=0))
        if self.cache_limit < least:
            raise ValueError(
                f"source.cache_limit={describe(self.cache_limit)} is smaller than the chunks {key} '{path}' is "
                f"read from at once: 2 x source.window ({self.window}) x its largest chunk "
                f"({describe(int(chunks.nbytes.max()))}) = {describe(least)}; raise source.cache_limit to at least "
                f"that, or lower source.window"
            )
        return chunks

    @property
    def classes(self) -> list[str]:
        return self._dataset(self.path, "source.path")["classes"]

    def prepare(self) -> None:
        """Check every chunk is there with its size (one stat each), and the held-out files' classes."""
        for path, key in (
            (self.path, "source.path"),
            (self.val_path, "source.val_path"),
            (self.test_path, "source.test_path"),
        ):
            if path:
                dataset = self._dataset(path, key)
                dataset["chunks"].check_files()
                if dataset["classes"] != self.classes:
                    raise ValueError(
                        f"{key} '{path}' has classes {dataset['classes'][:10]}, source.path {self.classes[:10]}: "
                        f"a held-out dataset must be converted with the classes of the training one"
                    )

    def split(self, name: str) -> ShardsRecords:
        own = {"val": self.val_path, "test": self.test_path}.get(check_split(name))
        if name == "test" and not own and not self.test_fraction:
            raise no_test_split(
                repr(self), "source.test_path=<a shards directory> or source.test_fraction=0.1"
            )
        path = own or self.path
        dataset = self._dataset(
            path,
            "source.test_path" if name == "test" and own else "source.val_path" if own else "source.path",
        )
        subset = None
        if not own:
            labels = dataset["labels"]
            counts = np.bincount(labels, minlength=len(self.classes))
            order = np.argsort(labels, kind="stable")
            cache = cache_path("shards", _basename(path), [path, dataset["identity"]], self.cache_dir)
            subset = subset_for(
                name, counts, self.val_fraction, self.seed, cache, order, self.test_fraction, self.classes
            )
        return ShardsRecords(dataset["chunks"], self.window, subset)

    def __repr__(self) -> str:
        return f"ShardsSource(path={self.path!r}, val_fraction={self.val_fraction})"


def _labels(store, rel: str) -> np.ndarray:
    """Every sample's label from the sidecar's labels.npy (a local one is mapped, a remote one read whole)."""
    name = f"{rel}/{LABELS}" if rel else LABELS
    if not store.remote:
        return np.load(store.where(name), mmap_mode="r")
    return np.load(io.BytesIO(store.read(name)))


def _basename(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or "shards"

"""The ``folder`` source: a class-folder tree (``root/<class>/**/<image>``) read through a cached index.

Classes, sample order and labels are those of torchvision ``ImageFolder`` on the same tree, so a
checkpoint trained on one reads the other. The index is built once per node in ``prepare()`` and
memory-mapped by every rank and worker after that.
"""

from __future__ import annotations

import os

import numpy as np

from feedline.datasets.cache import check_refresh
from feedline.datasets.folder.index import FolderIndex, open_index
from feedline.datasets.folder.packed import PackedIndex
from feedline.datasets.folder.scan_plan import check_scan_workers
from feedline.datasets.options import FolderOptions as _O  # the defaults, written once
from feedline.datasets.overlap.same_data import check_own
from feedline.datasets.paths import (
    IMG_EXTENSIONS,
    class_folders,
    local_path,
    normalize_extensions,
    require_dir,
)
from feedline.datasets.records import Records, Source, read_bytes
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for


class FolderRecords(Records):
    """One split of a folder index: index arrays and the root, never a list of samples."""

    def __init__(self, index: PackedIndex, root: str, subset=None, label_map=None):
        super().__init__(subset)
        self.index = index.view()  # arrays only: the metadata stays in the main process
        self.root = root
        self.label_map = tuple(label_map) if label_map is not None else None

    @property
    def total(self) -> int:
        return len(self.index)

    def path_and_label(self, row: int) -> tuple[str, int]:
        label = self.index.label(row)
        if self.label_map is not None:
            label = self.label_map[label]
        return os.path.join(self.root, self.index.relpath(row)), label

    def locate(self, i: int) -> tuple[str, int]:
        """Sample ``i``'s path and label, without reading it."""
        return self.path_and_label(self.row(i))

    def read(self, row: int) -> tuple[np.ndarray, int]:
        path, label = self.path_and_label(row)
        return read_bytes(path), label

    def where(self, row: int) -> str:
        return self.path_and_label(row)[0]


class FolderSource(Source):
    """Class folders under ``root``. Val from ``val_root`` or a seeded, stratified ``val_fraction`` of
    ``root``; test likewise from ``test_root`` or ``test_fraction``."""

    def __init__(
        self,
        root: str,
        val_root: str | None = _O.val_root,
        val_fraction: float = _O.val_fraction,
        seed: int = _O.seed,
        extensions=IMG_EXTENSIONS,
        cache_dir: str | None = _O.cache_dir,
        refresh: str = _O.refresh,
        scan_workers: int | str = _O.scan_workers,
        test_root: str | None = _O.test_root,
        test_fraction: float = _O.test_fraction,
    ):
        self.root = local_path(root, "source.root")
        self.val_root = local_path(val_root, "source.val_root") if val_root else None
        self.test_root = local_path(test_root, "source.test_root") if test_root else None
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        self.seed = check_seed(seed)
        self.extensions = normalize_extensions(extensions)
        self.cache_dir = cache_dir
        self.refresh = check_refresh(refresh)
        self.scan_workers = check_scan_workers(scan_workers)
        if self.val_root:
            self.val_fraction = 0.0  # val comes from val_root; train keeps root's samples
        if self.test_root:
            self.test_fraction = 0.0
        self._indexes: dict[str, FolderIndex] = {}
        self._check_roots()
        check_own(self)  # val_root, test_root: neither root (however spelt) nor each other

    def _roots(self) -> tuple[tuple[str, str | None], ...]:
        return (
            ("source.root", self.root),
            ("source.val_root", self.val_root),
            ("source.test_root", self.test_root),
        )

    def _check_roots(self) -> None:
        for key, path in self._roots():
            if path is not None:
                require_dir(path, key)

    @property
    def classes(self) -> list[str]:
        if self.root in self._indexes:
            return self._indexes[self.root].classes
        return class_folders(self.root, "<image>")

    def prepare(self) -> None:
        """Build (or refresh) the index of every root. Run once per node; safe to run concurrently."""
        self._indexes.clear()
        for key, path in self._roots():
            if path is not None:
                self._index(path, key)
        for key, path in self._roots()[1:]:  # a held-out tree with a class root lacks: say so before training
            if path is not None:
                self._tree_records(self._indexes[self.root], path, key)
        drawn = (("val", self.val_root, self.val_fraction), ("test", self.test_root, self.test_fraction))
        for name in ["train"] + [name for name, root, fraction in drawn if fraction and not root]:
            self.split(name)  # seeded splits drawn and cached here, once per node, not raced for by each rank

    def _index(self, path: str, key: str) -> FolderIndex:
        if path not in self._indexes:
            self._indexes[path] = open_index(
                path, self.extensions, self.cache_dir, self.refresh, key=key, workers=self.scan_workers
            )
        return self._indexes[path]

    def split(self, name: str) -> FolderRecords:
        index = self._index(self.root, "source.root")
        tree = {"val": self.val_root, "test": self.test_root}.get(check_split(name))
        if tree:
            return self._tree_records(index, tree, f"source.{name}_root")
        if name == "test" and not self.test_fraction:
            raise no_test_split(
                repr(self), "source.test_root=<a class-folder tree> or source.test_fraction=0.1"
            )
        subset = subset_for(
            name,
            index.counts,
            self.val_fraction,
            self.seed,
            index.directory,
            test_fraction=self.test_fraction,
            classes=index.classes,
        )
        return FolderRecords(index, self.root, subset)

    def _tree_records(self, train: FolderIndex, root: str, key: str) -> FolderRecords:
        """A split read from a tree of its own, labelled with ``root``'s classes (it may lack some)."""
        held = self._index(root, key)
        if held.classes == train.classes:
            return FolderRecords(held, root)
        unknown = sorted(set(held.classes) - set(train.classes))
        if unknown:
            raise ValueError(f"{key} '{root}' has classes that source.root lacks: {', '.join(unknown[:10])}")
        position = {c: i for i, c in enumerate(train.classes)}
        return FolderRecords(held, root, label_map=[position[c] for c in held.classes])

    def __repr__(self) -> str:
        return f"FolderSource(root={self.root!r})"

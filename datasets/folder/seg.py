"""The ``seg_folder`` source: a segmentation tree read without a table, as VOC- and ADE20K-style sets ship.

    root/images/<stem>.<jpg|png>     root/masks/<stem>.png        (subfolders too: images/a/x.jpg, masks/a/x.png)
    or root/train/{images,masks}, with root/val/{images,masks} and root/test/{images,masks} where they exist

A sample is ``{image, mask}`` with ``mask`` the target; a mask's pixel value is its class index (``classes``,
or ``num_classes`` numbered "0".."K-1"; ``ignore_index``, 255 by default, marks "no class"). The pairs are
indexed once per node (``seg_index.py``) and memory-mapped by every rank and worker; a split pickles as the
index directory's name. Val and test come from their own trees, else from a seeded share of root.
"""

from __future__ import annotations

import os

import numpy as np

from feedline.datasets.cache import check_refresh
from feedline.datasets.fields import Field, Fields
from feedline.datasets.folder.packed import FolderIndex, PackedIndex
from feedline.datasets.folder.seg_index import IMAGES, open_pairs
from feedline.datasets.options import SegFolderOptions as _O  # the defaults, written once
from feedline.datasets.paths import IMG_EXTENSIONS, local_path, normalize_extensions, require_dir
from feedline.datasets.records import Records, Source, check_class_names, read_bytes
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for


class SegFolderRecords(Records):
    """One split of a paired index: the index's arrays and the tree's root, never a list of samples."""

    def __init__(self, index: PackedIndex, root: str, count: int, subset=None):
        super().__init__(subset)
        self.index = index.view()
        self.root = root
        self.count = int(count)  # pairs: entry i is an image, entry count + i its mask

    @property
    def total(self) -> int:
        return self.count

    def paths(self, i: int) -> tuple[str, str]:
        """Sample ``i``'s image and mask paths, without reading them."""
        return self._paths(self.row(i))

    def _paths(self, row: int) -> tuple[str, str]:
        index = self.index
        return (
            os.path.join(self.root, index.relpath(row)),
            os.path.join(self.root, index.relpath(self.count + row)),
        )

    def read(self, row: int) -> dict:
        image, mask = self._paths(row)
        return {"image": read_bytes(image), "mask": read_bytes(mask)}

    def where(self, row: int) -> str:
        image, mask = self._paths(row)
        return f"{image} (mask {mask})"


class SegFolderSource(Source):
    """Images and their masks under ``root`` (see above); val from ``root/val``, else a seeded
    ``val_fraction`` of root; test from ``root/test``, else ``test_fraction``."""

    def __init__(
        self,
        root: str,
        classes: list[str] | None = _O.classes,
        num_classes: int | None = _O.num_classes,
        ignore_index: int = _O.ignore_index,
        val_fraction: float = _O.val_fraction,
        test_fraction: float = _O.test_fraction,
        seed: int = _O.seed,
        extensions=IMG_EXTENSIONS,
        cache_dir: str | None = _O.cache_dir,
        refresh: str = _O.refresh,
    ):
        self.root = require_dir(local_path(root, "source.root"), "source.root")
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        self.seed = check_seed(seed)
        self.extensions = normalize_extensions(extensions)
        self.cache_dir = cache_dir
        self.refresh = check_refresh(refresh)
        names = _class_names(classes, num_classes)
        self.fields = Fields(
            [Field("image", "image"), Field("mask", "mask", classes=tuple(names), ignore_index=ignore_index)],
            target="mask",
        )
        self.trees = _trees(self.root)
        if self.trees.get("val"):
            self.val_fraction = 0.0  # val comes from root/val
        if self.trees.get("test"):
            self.test_fraction = 0.0
        self._indexes: dict[str, FolderIndex] = {}

    @property
    def classes(self) -> list[str]:
        return self.fields.classes

    def prepare(self) -> None:
        """Index every tree's pairs (once per node; safe to run concurrently)."""
        self._indexes.clear()
        for name in self.trees:
            self._index(name)

    def _index(self, name: str) -> FolderIndex:
        tree = self.trees[name]
        if tree not in self._indexes:
            key = "source.root" if name == "train" else f"source.root ({name}/)"
            self._indexes[tree] = open_pairs(tree, self.extensions, self.cache_dir, self.refresh, key)
        return self._indexes[tree]

    def split(self, name: str) -> SegFolderRecords:
        check_split(name)
        if name in ("val", "test") and name in self.trees:
            index = self._index(name)
            return SegFolderRecords(index, self.trees[name], index.counts[0])
        if name == "test" and not self.test_fraction:
            raise no_test_split(
                repr(self), f"a {self.root}/test/ tree (images/, masks/) or source.test_fraction=0.1"
            )
        index = self._index("train")
        count = index.counts[0]
        subset = subset_for(
            name,
            np.asarray([count], dtype=np.int64),  # one stratum: masks hold many classes each, so seeded alone
            self.val_fraction,
            self.seed,
            index.directory,
            test_fraction=self.test_fraction,
            classes=["pairs"],
        )
        return SegFolderRecords(index, self.trees["train"], count, subset)

    def __repr__(self) -> str:
        return f"SegFolderSource(root={self.root!r})"


def _class_names(classes, num_classes) -> list[str]:
    """``source.classes`` (index = pixel value), else "0".."K-1" for ``source.num_classes``; one of them is
    required: finding K would mean reading every mask."""
    if classes:
        names = check_class_names(classes, "source.classes")
        if num_classes is not None and int(num_classes) != len(names):
            raise ValueError(
                f"source.num_classes={num_classes} but source.classes names {len(names)}: set one of them"
            )
        return names
    if num_classes is None:
        raise ValueError(
            "source=seg_folder needs the class list, as finding it would mean reading every mask: set "
            "source.classes=[background, ...] (index = pixel value) or source.num_classes=K"
        )
    if isinstance(num_classes, bool) or not 1 <= int(num_classes) <= 255:
        raise ValueError(f"source.num_classes={num_classes!r}: a mask is uint8, so 1..255 classes")
    return [str(c) for c in range(int(num_classes))]


def _trees(root: str) -> dict[str, str]:
    """split -> tree: root itself when it holds images/, else root/train, with root/val and root/test
    where they hold images/."""
    if os.path.isdir(os.path.join(root, IMAGES)):
        beside = [s for s in ("val", "test") if os.path.isdir(os.path.join(root, s, IMAGES))]
        if beside:  # root/images is train, and root/val would be silently unused
            raise ValueError(
                f"source.root '{root}' holds images/ and {beside[0]}/images/: move images/ and masks/ under "
                f"{root}/train/ to read {beside[0]}/ as the {beside[0]} split (or point source.root at one tree)"
            )
        return {"train": root}
    trees = {
        split: os.path.join(root, split)
        for split in ("train", "val", "test")
        if os.path.isdir(os.path.join(root, split, IMAGES))
    }
    if "train" not in trees:
        raise FileNotFoundError(
            f"source.root '{root}' holds neither images/ nor train/images/: expected {root}/images/<stem>.<jpg|png> "
            f"with {root}/masks/<stem>.png, or the same under {root}/train (and {root}/val, {root}/test)"
        )
    return trees

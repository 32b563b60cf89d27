"""The ``coco`` source: a COCO instances JSON plus its image folder, read as the fields ``image`` and ``objects``.

    source.annotations        the instances JSON (instances_train2017.json)
    source.images             the folder its images' file_name start from (train2017/)
    source.val_annotations    val's JSON and folder (both, or neither: then a seeded share, source.val_fraction)
    source.val_images
    source.test_annotations   likewise for trainer.test (else source.test_fraction)
    source.test_images
    source.crowd              false: iscrowd annotations are left out (torchvision's detection references do)
    source.empty              keep | skip: an image without (kept) annotations is a sample with no boxes, or none
    source.masks              true: each box's instance mask, decoded through pycocotools, in ``objects.masks``

Each file is checked and packed into an index once per node (``prepare()``, ``index.py``); every rank and
worker maps it after that. The categories, in id order, are the classes (label = position, whatever COCO ids they
have); val and test are labelled with the train file's.
"""

from __future__ import annotations

import os

from feedline.datasets.coco.index import file_digest, open_index
from feedline.datasets.coco.records import BOX_FORMAT, CocoRecords
from feedline.datasets.fields import Field, Fields
from feedline.datasets.options import CocoOptions as _O  # the defaults, written once
from feedline.datasets.paths import local_path, require_dir
from feedline.datasets.records import Source
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for

SPLITS = ("train", "val", "test")
EMPTY = ("keep", "skip")


def _key(split: str, what: str) -> str:
    return f"source.{what}" if split == "train" else f"source.{split}_{what}"


class CocoSource(Source):
    """Images and their boxes from a COCO instances file; val from ``val_annotations`` or a seeded
    ``val_fraction`` of the images, test likewise."""

    def __init__(
        self,
        annotations: str,
        images: str,
        val_annotations: str | None = _O.val_annotations,
        val_images: str | None = _O.val_images,
        test_annotations: str | None = _O.test_annotations,
        test_images: str | None = _O.test_images,
        val_fraction: float = _O.val_fraction,
        test_fraction: float = _O.test_fraction,
        seed: int = _O.seed,
        crowd: bool = _O.crowd,
        empty: str = _O.empty,
        masks: bool = _O.masks,
        cache_dir: str | None = _O.cache_dir,
    ):
        given = {
            "train": (annotations, images),
            "val": (val_annotations, val_images),
            "test": (test_annotations, test_images),
        }
        self._files: dict[str, tuple[str, str]] = {}
        for split, (json_path, folder) in given.items():
            if not json_path and not folder:
                continue
            if not json_path or not folder:
                missing, have = (
                    (_key(split, "images"), _key(split, "annotations"))
                    if json_path
                    else (_key(split, "annotations"), _key(split, "images"))
                )
                raise ValueError(
                    f"{have} is set and {missing} is not: set both (the JSON and its image folder)"
                )
            self._files[split] = (
                self._json(json_path, _key(split, "annotations")),
                require_dir(folder, _key(split, "images")),
            )
        if "train" not in self._files:
            raise ValueError(
                "source.annotations and source.images are required: the instances JSON and its images"
            )
        train = self._files["train"][0]
        for split in ("val", "test"):
            if split in self._files and self._files[split][0] == train:
                raise ValueError(
                    f"{_key(split, 'annotations')} is source.annotations ({train}): every {split} image would be "
                    f"one the model trains on; give another file, or leave it unset and set source.{split}_fraction"
                )
        self.annotations, self.images = self._files["train"]
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        if "val" in self._files:
            self.val_fraction = 0.0  # val comes from its own file; train keeps every image
        if "test" in self._files:
            self.test_fraction = 0.0
        self.seed = check_seed(seed)
        if str(empty) not in EMPTY:
            raise ValueError(
                f"source.empty={empty!r} is not one of: {', '.join(EMPTY)} (images without boxes)"
            )
        for key, value in (("crowd", crowd), ("masks", masks)):
            if not isinstance(value, bool):
                raise ValueError(f"source.{key}={value!r} must be true or false")
        self.options = {"crowd": crowd, "empty": str(empty), "masks": masks}
        self.cache_dir = cache_dir
        self._indexes: dict[str, dict] = {}
        self._digests: dict[str, tuple] = {}

    @staticmethod
    def _json(path: str, key: str) -> str:
        path = local_path(path, key)
        if not os.path.isfile(path):
            what = "is not a file" if os.path.exists(path) else "does not exist"
            raise FileNotFoundError(
                f"{key} '{path}' {what} (set {key}=<an instances JSON> or check the path)"
            )
        return path

    # -- fields -----------------------------------------------------------------------------------
    @property
    def fields(self) -> Fields:
        """``image`` and ``objects`` (boxes, XYXY pixels, the categories as classes), the target."""
        classes = tuple(self._index("train")["meta"]["classes"])
        objects = Field("objects", "boxes", classes=classes, format=BOX_FORMAT)
        return Fields([Field("image", "image"), objects], "objects")

    @property
    def classes(self) -> list[str]:
        return list(self._index("train")["meta"]["classes"])

    # -- the index --------------------------------------------------------------------------------
    def _digest(self, path: str) -> str:
        st = os.stat(path)
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._digests.get(path, (None,))[0] != stamp:
            self._digests[path] = (stamp, file_digest(path))
        return self._digests[path][1]

    def _index(self, split: str) -> dict:
        if split not in self._indexes:
            path, root = self._files[split]
            categories = None
            if split != "train":  # val and test get the train file's labels
                meta = self._index("train")["meta"]
                categories = [[c, n] for c, n in zip(meta["category_ids"], meta["classes"])]
            self._indexes[split] = open_index(
                path, self._digest(path), root, self.options, categories, self.cache_dir
            )
        return self._indexes[split]

    def content_digest(self) -> str:
        """The train file's content as 16 hex digits (a strict resume compares it)."""
        return self._digest(self.annotations)

    def prepare(self) -> None:
        """Check and index every annotation file once (per node; later runs map the cached index). Every
        problem is named here, before training."""
        self._indexes.clear()
        for split in SPLITS:
            if split in self._files:
                self._index(split)

    def split(self, name: str) -> CocoRecords:
        check_split(name)
        if name in ("val", "test") and name in self._files:
            return CocoRecords(self._index(name), self._files[name][1])
        if name == "test" and not self.test_fraction:
            raise no_test_split(
                repr(self), "source.test_annotations=... source.test_images=... or source.test_fraction=0.1"
            )
        index = self._index("train")
        rows = int(index["meta"]["images"])
        subset = subset_for(
            name,
            [rows],
            self.val_fraction,
            self.seed,
            index["directory"],
            None,
            self.test_fraction,
            ["images"],
        )
        return CocoRecords(index, self.images, subset)

    def __repr__(self) -> str:
        return f"CocoSource(annotations={self.annotations!r})"

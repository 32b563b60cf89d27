"""The ``hdf5`` source: one HDF5 file of images and labels (layouts: ``datasets/hdf5/layout.py``).

Reading with workers: the RecordSet pickles as the path and a few settings; each process opens its own
handle on first use (a handle inherited through fork is never used), checked to be the file inspected
here (``datasets/hdf5/files.py``), and a batch is read with one sorted read (``getitems``). Contiguous,
uncompressed array datasets are memory-mapped instead.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from feedline.datasets.arrays import LazyArray
from feedline.datasets.cache import cache_path, check_array, save_array
from feedline.datasets.hdf5.files import check_path, open_hdf5
from feedline.datasets.hdf5.layout import LAYOUTS, SCALES, check_labels, inspect_file
from feedline.datasets.hdf5.records import HDF5Records
from feedline.datasets.options import HDF5Options as _O  # the defaults, written once
from feedline.datasets.overlap.same_data import check_own
from feedline.datasets.paths import local_path
from feedline.datasets.records import Source, check_class_names
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for

log = logging.getLogger(__name__)


class HDF5Source(Source):
    """Samples from one HDF5 file; val from ``val_path`` or a seeded, stratified ``val_fraction``; test
    likewise from ``test_path`` or ``test_fraction``."""

    def __init__(
        self,
        path: str,
        val_path: str | None = _O.val_path,
        val_fraction: float = _O.val_fraction,
        seed: int = _O.seed,
        images_key: str = _O.images_key,
        labels_key: str = _O.labels_key,
        layout: str = _O.layout,
        dtype: str | None = _O.dtype,
        classes: list[str] | None = _O.classes,
        cache_dir: str | None = _O.cache_dir,
        test_path: str | None = _O.test_path,
        test_fraction: float = _O.test_fraction,
        fields: dict | None = None,
        target: str | None = _O.target,
    ):
        self.path = local_path(path, "source.path")
        self.val_path = local_path(val_path, "source.val_path") if val_path else None
        self.test_path = local_path(test_path, "source.test_path") if test_path else None
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        if self.val_path:
            self.val_fraction = 0.0
        if self.test_path:
            self.test_fraction = 0.0
        self.seed = check_seed(seed)
        self.images_key, self.labels_key = images_key, labels_key
        self.cache_dir = cache_dir
        if layout not in LAYOUTS:
            raise ValueError(f"source.layout={layout!r} is not one of: {', '.join(LAYOUTS)}")
        if dtype is not None and str(dtype) not in SCALES:
            raise ValueError(
                f"source.dtype={dtype!r} is not one of: {', '.join(SCALES)} (or null: from the file)"
            )
        self._layout_arg, self._dtype_arg = layout, dtype
        self._given_classes = check_class_names(classes, "source.classes") if classes else None
        fields = fields or None  # empty (the schema's default): the file's own, else images and labels
        if fields is not None and classes:
            raise ValueError(
                "source.classes names a classification's classes: with source.fields, give each "
                "field its own (source.fields.<name>.classes=[...])"
            )
        self._fields_arg = None if fields is None else {str(k): v for k, v in dict(fields).items()}
        self._target_arg = None if target is None else str(target)
        self._inspected: dict | None = None
        if self._check_now():
            self._files  # noqa: B018 - check the file now: a bad path or key fails before any work starts
        check_own(self)  # val_path, test_path: neither path (a link, a conversion of it) nor each other

    def _check_now(self) -> bool:
        """Whether the file is checked at construction (a subclass that writes it in prepare() waits)."""
        return True

    @property
    def _files(self) -> dict:
        if self._inspected is None:
            self._inspected = {
                p: inspect_file(
                    p,
                    key,
                    self.images_key,
                    self.labels_key,
                    self._layout_arg,
                    self._dtype_arg,
                    named=self._given_classes is not None,
                    fields=self._fields_arg,
                    target=self._target_arg,
                )
                for p, key in (
                    (self.path, "source.path"),
                    (self.val_path, "source.val_path"),
                    (self.test_path, "source.test_path"),
                )
                if p
            }
        return self._inspected

    @property
    def fields(self):
        """The file's named fields (``source.fields``, or the file's own ``fields`` attribute), or None for a
        file of images and labels (``datasets/hdf5/columns.py``)."""
        if self._inspected is None and self._fields_arg is None and not self._check_now():
            return None  # not written yet (a subclass converts it in prepare()): images and labels
        return self._files[self.path]["fields"]

    @property
    def classes(self) -> list[str]:
        if self._given_classes:
            return self._given_classes
        if self.fields is not None:
            return self.fields.classes
        return self._files[self.path]["classes"]

    def _strata(self) -> tuple[str | None, list[str]]:
        """The labels a split is stratified on: (their dataset, their classes). Named fields: the first
        field of kind class, else none (one stratum: a seeded split)."""
        if self.fields is None:
            return self.labels_key, self.classes
        first = next(iter(self.fields.of_kind("class")), None)
        return (first.source_column, list(first.classes)) if first else (None, ["all"])

    def prepare(self) -> None:
        """Cache the labels and the split arrays next to each other (once per node)."""
        for path in self._files:
            self._labels(path)

    def _cache(self, path: str):
        _, size, mtime_ns = self._files[path]["identity"]  # the file as inspected, not as it may be now
        key = [path, self._strata()[0], size, mtime_ns, self._label_map(path)]
        return cache_path("hdf5", os.path.splitext(os.path.basename(path))[0], key, self.cache_dir)

    def _label_map(self, path: str) -> list[int] | None:
        """For a val or test file whose classes differ from the training file's: its label -> the training
        label of the class of that name. None when the classes agree (or for the training file)."""
        if path == self.path or self._given_classes or self.fields is not None:
            return None
        own, classes = self._files[path]["classes"], self.classes
        if own == classes[: len(own)]:
            return None
        unknown = sorted(set(own) - set(classes))
        if unknown:
            key = "source.val_path" if path == self.val_path else "source.test_path"
            raise ValueError(f"{key} '{path}' has classes that source.path lacks: {', '.join(unknown[:10])}")
        return [classes.index(name) for name in own]

    def _labels(self, path: str):
        """The labels of ``path``, checked once and cached as an int64 array beside the split arrays. A
        cache that does not read back as N labels in range is rebuilt, with a warning."""
        target = self._cache(path) / "labels.npy"
        column, names = self._strata()
        n, classes = self._files[path]["n"], len(names)
        if target.exists() or target.with_name(target.name + ".sum").exists():
            try:
                reason = check_array(target)
                if reason:
                    raise ValueError(reason)
                cached = np.load(target, mmap_mode="r")
                if cached.shape != (n,) or cached.dtype != np.int64:
                    raise ValueError(f"shape {cached.shape}, dtype {cached.dtype}; expected ({n},) int64")
                if n and (int(cached.min()) < 0 or int(cached.max()) >= classes):
                    raise ValueError(f"labels outside 0..{classes - 1}")
                return target
            except (OSError, ValueError) as err:
                log.warning("label cache %s is damaged (%s); rebuilding it", target, err)
        mapping = self._label_map(path)
        with open_hdf5(path, self._files[path]["key"], self._files[path]["identity"]) as f:
            values = check_labels(
                f[column][:] if column is not None else np.zeros(n, dtype=np.int64),
                len(mapping) if mapping else classes,
                f"{self._files[path]['key']} '{path}': labels '{column}'",
            )
        if mapping:
            values = np.asarray(mapping, dtype=np.int64)[values]
        save_array(target, values)
        return target

    def split(self, name: str) -> HDF5Records:
        own_file = {"val": self.val_path, "test": self.test_path}.get(check_split(name))
        if name == "test" and not own_file and not self.test_fraction:
            raise no_test_split(repr(self), "source.test_path=<an HDF5 file> or source.test_fraction=0.1")
        path = own_file or self.path
        info = self._files[path]
        check_path(path, info["key"], info["identity"])  # trainer.test after fit: still the file fit read
        if own_file and _kinds(info["fields"]) != _kinds(self.fields):
            raise ValueError(
                f"{info['key']} '{path}' holds other fields or class lists than source.path '{self.path}' "
                f"({info['fields']!r} against {self.fields!r}): convert both from sources of the same fields"
            )
        labels = LazyArray(self._labels(path))
        subset = None
        if not own_file:
            array = labels.array
            classes = self._strata()[1]
            counts = np.bincount(array, minlength=len(classes))
            order = None if np.all(array[1:] >= array[:-1]) else np.argsort(array, kind="stable")
            cache = self._cache(path)
            subset = subset_for(
                name, counts, self.val_fraction, self.seed, cache, order, self.test_fraction, classes
            )
        return HDF5Records(
            path,
            info["images_key"],
            info["encoded"],
            info["layout"],
            info["scale"],
            labels,
            subset=subset,
            mapped=info["mapped"],
            ragged=info["ragged"],
            key=info["key"],
            identity=info["identity"],
            columns=_columns(info) if info["fields"] is not None else None,
        )

    def __repr__(self) -> str:
        return f"HDF5Source(path={self.path!r}, val_fraction={self.val_fraction})"


def _columns(info: dict) -> tuple:
    """What a field split's records read beside the images: the input image's field name, then (name,
    dataset, kind, store, number of classes) per other field."""
    fields = info["fields"]
    rest = tuple(
        (name, column, kind, store, len(fields[name].classes or ()))
        for name, (column, kind, store) in info["columns"].items()
    )
    return (fields.input, *rest)


def _kinds(fields) -> list | None:
    """What a val or test file must share with the training file: each field's name, kind and class list."""
    return (
        None if fields is None else [(f.name, f.kind, f.classes) for f in fields.values()] + [fields.target]
    )

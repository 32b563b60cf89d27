"""The ``manifest`` source: a table of samples (``tables.py``), one row each, its columns mapped to named fields.

    source.path        the table (.csv, .tsv, .parquet, or a ``path label`` .txt list)
    source.root        where relative paths start (default: the table's folder)
    source.fields      field -> {column, kind, classes, ...} (``datasets/fields.py``); unset: the table's
                       ``image`` and ``label`` columns (a .txt list: ``path`` and ``label``) as a classification
    source.target      the field that is ``y`` in ``x, y = batch``

The table is checked and packed into an index once per node (``prepare()``, ``index.py``) and memory-mapped
by every rank and worker after that. A class field without a class list gets the sorted names found ("0".."max"
when they are class numbers). Val and test come from other tables (``val_path``, ``test_path``: the same fields,
the train table's class lists), or from a seeded share of the table, stratified on the target when it is a class.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from feedline.datasets.fields import Field, Fields, fields_from_config
from feedline.datasets.manifest.index import open_index
from feedline.datasets.manifest.records import ManifestRecords
from feedline.datasets.manifest.tables import (
    LIST_COLUMNS,
    content_digest,
    header,
    require_table,
    table_format,
)
from feedline.datasets.options import ManifestOptions as _O  # the defaults, written once
from feedline.datasets.overlap.same_data import check_own
from feedline.datasets.paths import local_path, require_dir
from feedline.datasets.records import Source
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for

KEYS = {"train": "source.path", "val": "source.val_path", "test": "source.test_path"}
_UNLISTED = ("?",)  # stands in for a class list the table will give, while the configured fields are checked


class ManifestSource(Source):
    """Samples as rows of a table; val from ``val_path`` or a seeded ``val_fraction``, test likewise."""

    def __init__(
        self,
        path: str,
        root: str | None = _O.root,
        fields: Mapping | None = None,
        target: str | None = _O.target,
        val_path: str | None = _O.val_path,
        val_fraction: float = _O.val_fraction,
        test_path: str | None = _O.test_path,
        test_fraction: float = _O.test_fraction,
        seed: int = _O.seed,
        cache_dir: str | None = _O.cache_dir,
    ):
        self.path = require_table(local_path(path, KEYS["train"]), KEYS["train"])
        self.val_path = require_table(local_path(val_path, KEYS["val"]), KEYS["val"]) if val_path else None
        self.test_path = (
            require_table(local_path(test_path, KEYS["test"]), KEYS["test"]) if test_path else None
        )
        # Not ``self.root``: a manifest's data is its table, and a folder named ``root`` would read as a tree of
        # class folders to the overlap check and the bench anchor.
        self.image_root = require_dir(root, "source.root") if root else None
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        if self.val_path:
            self.val_fraction = 0.0  # val comes from its own table; train keeps every row of path
        if self.test_path:
            self.test_fraction = 0.0
        self.seed = check_seed(seed)
        self.cache_dir = cache_dir
        self._specs, self.target = self._configured(fields, target)
        self._indexes: dict[str, dict] = {}
        self._digests: dict[str, tuple] = {}
        check_own(self)  # val_path, test_path: neither the train table nor each other

    # -- fields -----------------------------------------------------------------------------------
    def _configured(self, fields, target) -> tuple[list[Field], str]:
        """The fields as configured (a class list may be left to the table), checked now, before any work."""
        if not fields:  # None or {} (the schema's default, so +source.fields.<name>=... works)
            return self._shorthand(target)
        plain = {}
        for name, spec in fields.items():
            spec = (
                dict(spec) if isinstance(spec, Mapping) else {"kind": spec} if isinstance(spec, str) else spec
            )
            if isinstance(spec, dict) and spec.get("classes") is not None:
                spec["classes"] = list(spec["classes"])
            plain[str(name)] = spec
        checked = {
            n: {**s, "classes": list(_UNLISTED)}
            if isinstance(s, dict) and s.get("kind") == "classes" and s.get("classes") is None
            else s
            for n, s in plain.items()
        }
        parsed = fields_from_config(checked, target)
        specs = [
            replace(f, classes=None) if f.classes == _UNLISTED and plain[f.name].get("classes") is None else f
            for f in parsed.values()
        ]
        target = parsed[parsed.target]
        if target.kind == "mask" and target.classes is None:
            raise ValueError(
                f"source.fields.{target.name}: a mask target needs its class list, index = pixel value "
                f"(source.fields.{target.name}.classes=[background, ...]): it is what the model predicts"
            )
        return specs, parsed.target

    def _shorthand(self, target) -> tuple[list[Field], str]:
        """No ``source.fields``: an ``image`` and a ``label`` column (a list's ``path`` and ``label``) classify."""
        listed = table_format(self.path) == "list"
        image = LIST_COLUMNS[0] if listed else "image"
        found = header(self.path)
        if image not in found or "label" not in found:
            raise ValueError(
                f"source.fields is not set, and {self.path} has no columns 'image' and 'label' to read as a "
                f"classification (its columns: {', '.join(found)}). Map each field to a column: "
                "source.fields={image: {column: <paths>, kind: image}, label: {column: <classes>, kind: class}}"
            )
        parsed = fields_from_config(
            {"image": {"column": image, "kind": "image"}, "label": {"column": "label", "kind": "class"}},
            target or "label",
        )
        return list(parsed.values()), parsed.target

    @property
    def fields(self) -> Fields:
        """The fields, each class list as given or as the table holds it (reads the index: ``prepare()``)."""
        found = self._index("train")["meta"]["classes"]
        specs = [replace(f, classes=tuple(found[f.name])) if f.name in found else f for f in self._specs]
        return Fields(specs, self.target)

    @property
    def classes(self) -> list[str]:
        return self.fields.classes

    # -- the index --------------------------------------------------------------------------------
    def _table(self, split: str) -> str:
        return {"train": self.path, "val": self.val_path, "test": self.test_path}[split]

    def _root(self, table: str) -> str:
        return self.image_root or os.path.dirname(table)

    def _digest(self, table: str) -> str:
        st = os.stat(table)
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._digests.get(table, (None,))[0] != stamp:
            self._digests[table] = (stamp, content_digest(table))
        return self._digests[table][1]

    def _index(self, split: str) -> dict:
        if split not in self._indexes:
            table = self._table(split)
            specs = self._specs
            if split != "train":  # held-out rows get the train table's class indices
                found = self._index("train")["meta"]["classes"]
                specs = [replace(f, classes=tuple(found[f.name])) if f.name in found else f for f in specs]
            self._indexes[split] = open_index(
                table, self._digest(table), self._root(table), specs, self.cache_dir
            )
        return self._indexes[split]

    def content_digest(self) -> str:
        """The train table's content as 16 hex digits (a resume compares it)."""
        return self._digest(self.path)

    def prepare(self) -> None:
        """Check and index every table once (per node; later runs map the cached index). Every bad cell is
        named here, before training."""
        self._indexes.clear()
        for split in ("train", "val", "test"):
            if self._table(split):
                self._index(split)

    def split(self, name: str) -> ManifestRecords:
        check_split(name)
        fields = self.fields
        kinds = [(f.name, f.kind) for f in fields.values()]
        if name in ("val", "test") and self._table(name):
            table = self._table(name)
            return ManifestRecords(self._index(name), kinds, fields.input, self._root(table))
        if name == "test" and not self.test_fraction:
            raise no_test_split(repr(self), "source.test_path=<a table> or source.test_fraction=0.1")
        index = self._index("train")
        rows = int(index["meta"]["rows"])
        target = fields[fields.target]
        counts, order, classes = [rows], None, None  # seeded, at random
        if target.kind == "class":  # stratified: each class gives its share
            labels = index["arrays"][f"{target.name}.labels"].array
            classes = fields.classes
            counts = np.bincount(labels, minlength=len(classes))
            order = np.argsort(labels, kind="stable")
        subset = subset_for(
            name, counts, self.val_fraction, self.seed, index["directory"], order, self.test_fraction, classes
        )
        return ManifestRecords(index, kinds, fields.input, self._root(self.path), subset)

    def __repr__(self) -> str:
        return f"ManifestSource(path={self.path!r})"

"""The ``lazy_folder`` source: class folders whose files are named ``0.<ext>`` ... ``<n-1>.<ext>``.

No file is listed one by one: a sample's path is computed from its index, so setup costs O(classes).
``prepare()`` writes a small manifest (classes, per-class counts and extensions, directory mtimes) into
the cache once, with one directory listing per class; without a manifest the counts are taken on the fly.

    feedline-lazy-folder layout SRC DST [--move]    # lay out a class-folder tree this way (feedline.writers)
    feedline-lazy-folder verify ROOT                # check every class holds exactly 0..n-1
"""

from __future__ import annotations

import bisect
import json
import logging
import os

from feedline.datasets.cache import cache_path, check_refresh, json_checksum, stale_dirs, write_text
from feedline.datasets.folder.lazy_checks import LayoutError, check_extension, class_count, verify_tree
from feedline.datasets.options import LazyFolderOptions as _O  # the defaults, written once
from feedline.datasets.overlap.same_data import check_own
from feedline.datasets.paths import class_folders, require_dir
from feedline.datasets.records import Records, Source, read_bytes
from feedline.datasets.splits import check_fractions, check_seed, check_split, no_test_split, subset_for

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 2  # 2: with a checksum of its content


class LazyFolderRecords(Records):
    """A split of a lazy layout: per-class tuples and an optional subset array, no per-sample objects."""

    def __init__(self, root: str, classes, exts, starts, subset=None, label_map=None):
        super().__init__(subset)
        self.root = root
        self.classes = tuple(classes)
        self.exts = tuple(exts)
        self.starts = tuple(int(s) for s in starts)  # len(classes) + 1 cumulative counts
        self.label_map = (
            tuple(label_map) if label_map is not None else None
        )  # a test tree's classes -> labels

    @property
    def total(self) -> int:
        return self.starts[-1]

    def path_and_label(self, row: int) -> tuple[str, int]:
        k = bisect.bisect_right(self.starts, row) - 1
        path = f"{self.root}/{self.classes[k]}/{row - self.starts[k]}{self.exts[k]}"
        return path, (self.label_map[k] if self.label_map is not None else k)

    def locate(self, i: int) -> tuple[str, int]:
        """Sample ``i``'s path and label, without reading it."""
        return self.path_and_label(self.row(i))

    def read(self, row: int):
        path, label = self.path_and_label(row)
        return read_bytes(path), label

    def where(self, row: int) -> str:
        return self.path_and_label(row)[0]


class LazyFolderSource(Source):
    """Class folders of files named by index. Val (and test) come from a seeded, stratified
    ``val_fraction`` (``test_fraction``): the same split ``folder`` draws, so a tree and its lazy layout
    validate on the same samples. ``test_root``: a lazy layout of its own for test."""

    def __init__(
        self,
        root: str,
        val_fraction: float = _O.val_fraction,
        seed: int = _O.seed,
        extension: str | None = _O.extension,
        verify: bool = _O.verify,
        cache_dir: str | None = _O.cache_dir,
        refresh: str = _O.refresh,
        test_fraction: float = _O.test_fraction,
        test_root: str | None = _O.test_root,
    ):
        self.root = self._check_root(root)
        self.val_fraction, self.test_fraction = check_fractions(val_fraction, test_fraction)
        self.test_root = require_dir(test_root, "source.test_root") if test_root else None
        if self.test_root:
            self.test_fraction = 0.0
        self.seed = check_seed(seed)
        self.extension = check_extension(extension)
        self.verify = bool(verify)
        self.cache_dir = cache_dir
        self.refresh = check_refresh(refresh)
        self._manifest: dict | None = None
        check_own(self)  # test_root: not root (however spelt), nor the tree root was laid out from

    def _check_root(self, root: str) -> str:
        """The root, made absolute; it must exist now (a subclass that makes it in prepare() relaxes this)."""
        return require_dir(root, "source.root")

    @property
    def manifest_dir(self):
        return cache_path(
            "lazy-folder", os.path.basename(self.root), [self.root, [self.extension or "*"]], self.cache_dir
        )

    @property
    def classes(self) -> list[str]:
        if self._manifest is not None:
            return self._manifest["classes"]
        return class_folders(self.root, "0.<ext>")

    def prepare(self) -> None:
        """Write (or refresh) the manifest: one listing per class. With ``verify``, check every class."""
        if self.verify:
            reports = [r for r in verify_tree(self.root, self.extension) if not r.ok]
            if reports:
                raise LayoutError(
                    f"source.verify found {len(reports)} class(es) that are not 0..n-1 under '{self.root}':\n  "
                    + "\n  ".join(r.describe() for r in reports[:20])
                )
        self._manifest = self._load_manifest() if self.refresh != "always" else None
        if self._manifest is None:
            self._manifest = self._build_manifest()
            self._manifest["checksum"] = json_checksum(self._manifest)
            write_text(self.manifest_dir / "manifest.json", json.dumps(self._manifest, ensure_ascii=False))
        if self.test_root:
            self._test_tree()  # its layout and classes, checked before training rather than at trainer.test

    def _load_manifest(self) -> dict | None:
        path = self.manifest_dir / "manifest.json"
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            if manifest.get("format") != MANIFEST_FORMAT or manifest["root"] != self.root:
                raise ValueError("written for another format or root")
            if manifest.get("checksum") != json_checksum(manifest):
                raise ValueError("it changed after it was written (checksum mismatch)")
        except FileNotFoundError:
            if path.parent.exists() and any(path.parent.glob("split-*")):  # used before: the manifest went
                log.warning("lazy_folder manifest %s is missing; rebuilding it", path)
            return None
        except (ValueError, KeyError, OSError) as err:
            log.warning("lazy_folder manifest %s is unusable (%s); rebuilding it", path, err)
            return None
        if self.refresh == "auto":
            changed = stale_dirs(self.root, manifest["dirs"])
            if changed:
                log.info(
                    "%s changed since its manifest was written (%s); re-counting",
                    self.root,
                    ", ".join(changed),
                )
                return None
        return manifest

    def _build_manifest(self) -> dict:
        root_mtime = os.stat(self.root).st_mtime_ns
        classes = self.classes
        dirs, exts, counts = [("", root_mtime)], [], []
        for name in classes:
            dirs.append((name, os.stat(os.path.join(self.root, name)).st_mtime_ns))
            ext, count = class_count(self.root, name, self.extension)
            exts.append(ext)
            counts.append(count)
        return {
            "format": MANIFEST_FORMAT,
            "root": self.root,
            "classes": classes,
            "exts": exts,
            "counts": counts,
            "dirs": dirs,
        }

    def _layout(self) -> dict:
        """The manifest when there is one (mapped, O(1) per class); else counts taken now."""
        if self._manifest is None:
            self._manifest = self._load_manifest() if self.refresh != "always" else None
        if self._manifest is None:
            self._manifest = self._build_manifest()
            self._manifest["transient"] = True  # taken on the fly: split arrays stay in memory
        return self._manifest

    def split(self, name: str) -> LazyFolderRecords:
        if check_split(name) == "test":
            if self.test_root:
                return self._test_tree()
            if not self.test_fraction:
                raise no_test_split(
                    repr(self), "source.test_root=<a lazy layout> or source.test_fraction=0.1"
                )
        m = self._layout()
        starts = [0]
        for count in m["counts"]:
            starts.append(starts[-1] + count)
        cache = None if m.get("transient") else self.manifest_dir
        subset = subset_for(
            name,
            m["counts"],
            self.val_fraction,
            self.seed,
            cache,
            test_fraction=self.test_fraction,
            classes=m["classes"],
        )
        return LazyFolderRecords(self.root, m["classes"], m["exts"], starts, subset)

    def _test_tree(self) -> LazyFolderRecords:
        """Every sample of ``test_root``, labelled with ``root``'s classes (it may lack some)."""
        tree = LazyFolderSource(
            self.test_root,
            val_fraction=0.0,
            extension=self.extension,
            cache_dir=self.cache_dir,
            refresh=self.refresh,
        )
        records, classes = tree.split("all"), self.classes
        unknown = sorted(set(records.classes) - set(classes))
        if unknown:
            raise ValueError(
                f"source.test_root '{self.test_root}' has classes that source.root lacks: {', '.join(unknown[:10])}"
            )
        records.label_map = tuple(classes.index(c) for c in records.classes)
        return records

    def __repr__(self) -> str:
        return f"LazyFolderSource(root={self.root!r}, val_fraction={self.val_fraction})"

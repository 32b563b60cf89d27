"""The ``lazy_folder`` source: class folders whose files are named ``0.<ext>`` ... ``<n-1>.<ext>``.

No file is listed one by one: a sample's path is computed from its index, so setup costs O(classes).
``prepare()`` writes a small manifest (classes, per-class counts and extensions, directory mtimes) into
the cache once, with one directory listing per class; without a manifest the counts are taken on the fly.

    python -m datasets.lazy_folder layout SRC DST [--move]    # lay out a class-folder tree this way
    python -m datasets.lazy_folder verify ROOT                # check every class holds exactly 0..n-1
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field

from datasets.index import check_refresh, index_dir
from datasets.records import LazyArray, read_bytes, require_dir
from datasets.scan import list_classes, stale_dirs
from datasets.splits import cached_split, check_fraction, stratified_split

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
SHOWN = 5  # paths listed per kind of defect


class LayoutError(ValueError):
    """The tree is not a lazy_folder layout (mixed extensions, gaps, duplicates, extra files)."""


# -- one class directory ------------------------------------------------------------------------------
def _visible_names(path: str) -> list[str]:
    names = os.listdir(path)
    if "\0." not in "\0" + "\0".join(names):  # the usual case, checked in C: nothing hidden
        return names
    return [n for n in names if not n.startswith(".")]


def _extension_of(root: str, name: str, names: list[str], extension: str | None) -> str:
    """The class's one extension: ``extension`` when given, else the one every file shares."""
    if extension:
        return extension
    if not names:
        raise LayoutError(f"class folder {os.path.join(root, name)} is empty (source.root '{root}')")
    first = os.path.splitext(names[0])[1]
    if ("\0".join(names) + "\0").count(first + "\0") == len(names):  # C-speed check of the usual case
        return first
    by_ext: dict[str, list[str]] = {}
    for n in names:
        by_ext.setdefault(os.path.splitext(n)[1], []).append(n)
    common = _common_extension(names)
    odd = sorted(n for e, group in by_ext.items() if e != common for n in group)
    shown = ", ".join(os.path.join(root, name, n) for n in odd[:SHOWN])
    raise LayoutError(
        f"class '{name}' mixes extensions ({', '.join(sorted(by_ext))}): lazy_folder needs one per class. "
        f"{len(odd)} file(s) differ from '{common}': {shown}{' ...' if len(odd) > SHOWN else ''} "
        f"(set source.extension={common} to read only those, or re-run the layout tool)"
    )


def class_count(root: str, name: str, extension: str | None = None) -> tuple[str, int]:
    """(extension, number of samples) of one class, from one listing. Normally: the number of files,
    confirmed by two stats (``n-1`` exists, ``n`` does not); else the highest index + 1, with a warning."""
    path = os.path.join(root, name)
    names = _visible_names(path)
    ext = _extension_of(root, name, names, extension)
    if extension:
        names = [n for n in names if n.endswith(ext)]
    n = len(names)
    if (
        n
        and os.path.exists(os.path.join(path, f"{n - 1}{ext}"))
        and not os.path.exists(os.path.join(path, f"{n}{ext}"))
    ):
        return ext, n
    report = check_class(root, name, ext, names)
    log.warning("%s (set source.verify=true to stop on such defects)", report.describe())
    return ext, report.count


@dataclass
class ClassReport:
    """What ``verify`` found in one class folder."""

    root: str
    name: str
    ext: str
    count: int = 0  # highest index + 1: every readable sample, gaps included
    gaps: list[int] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.duplicates or self.extras)

    def describe(self) -> str:
        where = os.path.join(self.root, self.name)
        parts = []
        for label, items in (
            ("missing", [f"{i}{self.ext}" for i in self.gaps]),
            ("duplicate", self.duplicates),
            ("extra", self.extras),
        ):
            if items:
                shown = ", ".join(os.path.join(where, p) for p in items[:SHOWN])
                parts.append(f"{len(items)} {label}: {shown}{' ...' if len(items) > SHOWN else ''}")
        return (
            f"class '{self.name}' does not hold exactly 0{self.ext} .. {self.count - 1}{self.ext}: "
            + "; ".join(parts)
        )


def check_class(root: str, name: str, ext: str, names: list[str] | None = None) -> ClassReport:
    """Check that a class folder holds exactly ``0..n-1`` + ``ext``, from its listing (no image is read).

    A name the loader would never read is a *duplicate* when its number is already present (``01.jpg``
    or ``1.png`` beside ``1.jpg``), else an *extra*; a number below the highest that has no file is a gap.
    """
    names = _visible_names(os.path.join(root, name)) if names is None else names
    report = ClassReport(root, name, ext)
    canonical: dict[int, str] = {}
    others = []
    for n in names:
        stem = n[: len(n) - len(ext)] if n.endswith(ext) else ""
        if _is_number(stem) and str(int(stem)) == stem:
            canonical[int(stem)] = n
        else:
            others.append(n)
    for n in sorted(others):
        stem = os.path.splitext(n)[0]
        number = int(stem) if _is_number(stem) else None
        (report.duplicates if number in canonical else report.extras).append(n)
    report.count = max(canonical) + 1 if canonical else 0
    if len(canonical) != report.count:
        report.gaps = sorted(set(range(report.count)) - set(canonical))
    return report


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _common_extension(names: list[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        ext = os.path.splitext(n)[1]
        counts[ext] = counts.get(ext, 0) + 1
    return max(counts, key=counts.get) if counts else ""


# -- the source ---------------------------------------------------------------------------------------
class LazyFolderRecords:
    """A split of a lazy layout: per-class tuples and an optional subset array, no per-sample objects."""

    def __init__(self, root: str, classes, exts, starts, subset: LazyArray | None = None):
        self.root = root
        self.classes = tuple(classes)
        self.exts = tuple(exts)
        self.starts = tuple(int(s) for s in starts)  # len(classes) + 1 cumulative counts
        self.subset = subset

    def __len__(self) -> int:
        return len(self.subset.array) if self.subset is not None else self.starts[-1]

    def locate(self, i: int) -> tuple[str, int]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        j = int(self.subset.array[i]) if self.subset is not None else i % self.starts[-1]
        label = bisect.bisect_right(self.starts, j) - 1
        return f"{self.root}/{self.classes[label]}/{j - self.starts[label]}{self.exts[label]}", label

    def __getitem__(self, i: int):
        path, label = self.locate(i)
        return read_bytes(path), label

    def describe(self, i: int) -> str:
        return self.locate(i)[0]


class LazyFolderSource:
    """Class folders of files named by index. Val comes from a seeded, stratified ``val_fraction``:
    the same split ``folder`` draws, so a tree and its lazy layout validate on the same samples."""

    def __init__(
        self,
        root: str,
        val_fraction: float = 0.1,
        seed: int = 0,
        extension: str | None = None,
        verify: bool = False,
        cache_dir: str | None = None,
        refresh: str = "auto",
        origin=None,
    ):
        # origin: a class-folder source (folder, digits); prepare() lays it out into root when root is not a
        # complete layout of it yet, so one config can make this form of the data (`experiment=backends`).
        self.origin = origin
        if origin is None:
            self.root = require_dir(root, "source.root")
        else:
            self.root = os.path.abspath(os.path.expanduser(str(root)))
        self.val_fraction = check_fraction(val_fraction)
        self.seed = int(seed)
        self.extension = (
            (extension if str(extension).startswith(".") else f".{extension}") if extension else None
        )
        self.verify = bool(verify)
        self.cache_dir = cache_dir
        self.refresh = check_refresh(refresh)
        self._manifest: dict | None = None

    @property
    def manifest_dir(self):
        return index_dir(self.root, [self.extension or "*"], self.cache_dir, kind="lazy-folder")

    @property
    def classes(self) -> list[str]:
        if self._manifest is not None:
            return self._manifest["classes"]
        if self.origin is not None and not os.path.isdir(self.root):
            return self.origin.classes  # not laid out yet (prepare() does it): the same classes
        classes = list_classes(self.root)
        if not classes:
            raise FileNotFoundError(
                f"source.root '{self.root}' has no class folders: expected {self.root}/<class>/0.<ext>"
            )
        return classes

    def prepare(self) -> None:
        """Write (or refresh) the manifest: one listing per class. With ``verify``, check every class.
        With ``origin``, lay the origin out into root first (links; a no-op once the layout is complete)."""
        if self.origin is not None:
            from datasets.lazy_layout import layout

            self.origin.prepare()
            log.info(layout(self.origin.root, self.root, cache_dir=self.cache_dir))
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
            self._write_manifest(self._manifest)

    def _load_manifest(self) -> dict | None:
        path = self.manifest_dir / "manifest.json"
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            if manifest.get("format") != MANIFEST_FORMAT or manifest["root"] != self.root:
                raise ValueError("written for another format or root")
        except FileNotFoundError:
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

    def _write_manifest(self, manifest: dict) -> None:
        directory = self.manifest_dir
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".manifest-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(manifest, f, ensure_ascii=False)
        os.replace(tmp, directory / "manifest.json")

    def _layout(self) -> dict:
        """The manifest when there is one (mapped, O(1) per class); else counts taken now."""
        if self._manifest is None:
            self._manifest = self._load_manifest() if self.refresh != "always" else None
        if self._manifest is None:
            self._manifest = self._build_manifest()
            self._manifest["transient"] = True  # taken on the fly: split arrays stay in memory
        return self._manifest

    def split(self, name: str) -> LazyFolderRecords:
        if name not in ("train", "val", "all"):
            raise ValueError(f"unknown split {name!r}; sources have train, val, all")
        m = self._layout()
        starts = [0]
        for count in m["counts"]:
            starts.append(starts[-1] + count)
        records = LazyFolderRecords(self.root, m["classes"], m["exts"], starts)
        if name == "all" or (name == "train" and not self.val_fraction):
            return records
        if m.get("transient"):
            subset = _InMemory(stratified_split(m["counts"], self.val_fraction, self.seed)[name == "val"])
        else:
            subset = LazyArray(
                cached_split(self.manifest_dir, m["counts"], self.val_fraction, self.seed, name)
            )
        records.subset = subset
        return records

    def __repr__(self) -> str:
        return f"LazyFolderSource(root={self.root!r}, val_fraction={self.val_fraction})"


class _InMemory:
    """A split array held in memory, for a layout read without a manifest."""

    def __init__(self, array):
        self.array = array


def verify_tree(root: str, extension: str | None = None) -> list[ClassReport]:
    """One report per class; with no ``extension`` given, each class is checked against its commonest."""
    root = require_dir(root, "source.root")
    reports = []
    for name in list_classes(root):
        names = _visible_names(os.path.join(root, name))
        reports.append(check_class(root, name, extension or _common_extension(names), names))
    return reports


# -- command line -------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m datasets.lazy_folder", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    lay = commands.add_parser("layout", help="lay out a class-folder tree as 0..n-1 files per class")
    lay.add_argument("src", help="class-folder tree (ImageFolder layout)")
    lay.add_argument("dst", help="new tree; hard links when on the same filesystem, copies otherwise")
    lay.add_argument("--move", action="store_true", help="move the files instead (SRC is emptied)")
    lay.add_argument("--cache-dir", default=None, help="where SRC's folder index is cached")
    ver = commands.add_parser("verify", help="check every class holds exactly 0..n-1, without reading images")
    ver.add_argument("root")
    ver.add_argument("--extension", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "layout":
            from datasets.lazy_layout import layout

            summary = layout(args.src, args.dst, move=args.move, cache_dir=args.cache_dir)
            print(summary)
            return 0
        reports = verify_tree(args.root, args.extension)
    except (FileNotFoundError, LayoutError) as err:
        parser.exit(2, f"error: {err}\n")
    bad = [r for r in reports if not r.ok]
    for r in bad:
        print(r.describe())
    print(f"{len(reports)} classes, {sum(r.count for r in reports)} samples, {len(bad)} with defects")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

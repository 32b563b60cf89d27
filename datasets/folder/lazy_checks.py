"""Checks of a lazy_folder tree (``<class>/0.<ext> .. <n-1>.<ext>``) from directory listings alone.

``class_count`` takes one class's sample count from one listing and two stats; ``check_class`` and
``verify_tree`` report every gap, duplicate and extra file (``source.verify=true``, ``feedline-lazy-folder
verify``). No image is opened.
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass, field

from feedline.datasets.paths import list_classes, require_dir

log = logging.getLogger(__name__)

SHOWN = 5  # paths listed per kind of defect
OUT_OF_RANGE = 2  # a file numbered at least this many times the class's numbered files is never read


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


def check_extension(extension) -> str | None:
    """``source.extension`` with its dot (``jpg`` -> ``.jpg``), or None (detected per class)."""
    if extension is None or extension == "":
        return None
    ext = str(extension) if str(extension).startswith(".") else f".{extension}"
    if len(ext) < 2 or "/" in ext or "\0" in ext or not isinstance(extension, str):
        raise ValueError(
            f"source.extension={extension!r} is not a file extension: give one such as .jpg, or null to "
            "detect each class's own"
        )
    return ext


def class_count(root: str, name: str, extension: str | None = None) -> tuple[str, int]:
    """(extension, number of samples) of one class, from one listing. Normally: the number of files,
    confirmed by two stats (``n-1`` exists, ``n`` does not); else the highest index + 1, with a warning."""
    path = os.path.join(root, name)
    names = _visible_names(path)
    ext = _extension_of(root, name, names, extension)
    if extension:
        names = [n for n in names if n.endswith(ext)]
        if not names:
            raise LayoutError(
                f"class folder {os.path.join(root, name)} has no '{ext}' file (source.extension={ext}; "
                "null detects each class's extension)"
            )
    n = len(names)
    if (
        n
        and os.path.exists(os.path.join(path, f"{n - 1}{ext}"))
        and not os.path.exists(os.path.join(path, f"{n}{ext}"))
    ):
        return ext, n
    report = check_class(root, name, ext, names)
    if not report.count:
        raise LayoutError(f"{report.describe()} (renumber its files 0..n-1: feedline-lazy-folder layout)")
    log.warning("%s (set source.verify=true to stop on such defects)", report.describe())
    return ext, report.count


@dataclass
class ClassReport:
    """What ``verify`` found in one class folder."""

    root: str
    name: str
    ext: str
    count: int = 0  # highest index in range + 1: every readable sample, gaps included
    gaps: list[int] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    out_of_range: list[str] = field(default_factory=list)  # numbered ``limit`` or above
    limit: int = 0  # twice the class's numbered files: a number this high is never read

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.duplicates or self.extras or self.out_of_range)

    def describe(self) -> str:
        where = os.path.join(self.root, self.name)
        parts = []
        for label, items in (
            ("missing", [f"{i}{self.ext}" for i in self.gaps]),
            ("duplicate", self.duplicates),
            ("extra", self.extras),
            (f"out of range (numbered {self.limit}{self.ext} or above, never read)", self.out_of_range),
        ):
            if items:
                shown = ", ".join(os.path.join(where, p) for p in items[:SHOWN])
                parts.append(f"{len(items)} {label}: {shown}{' ...' if len(items) > SHOWN else ''}")
        held = f"exactly 0{self.ext} .. {self.count - 1}{self.ext}" if self.count else f"0{self.ext}"
        return f"class '{self.name}' does not hold {held}: " + "; ".join(parts)


def check_class(root: str, name: str, ext: str, names: list[str] | None = None) -> ClassReport:
    """Check that a class folder holds exactly ``0..n-1`` + ``ext``, from its listing (no image is read).

    A name the loader would never read is a *duplicate* when its number is already present (``01.jpg``
    or ``1.png`` beside ``1.jpg``), else an *extra*. A file numbered at least twice the class's numbered
    files is *out of range* (a stray ``1700000000.png``: counting up to it would make the class mostly
    gaps); a number below the highest in range that has no file is a gap. Memory: O(files).
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
    report.limit = OUT_OF_RANGE * len(canonical)
    numbers = sorted(canonical)
    kept = bisect.bisect_left(numbers, report.limit)
    report.out_of_range = [canonical[i] for i in numbers[kept:]]
    numbers = numbers[:kept]
    report.count = numbers[-1] + 1 if numbers else 0
    if len(numbers) != report.count:  # count < limit = 2 x files: the gaps are O(files)
        expected = 0
        for i in numbers:
            report.gaps.extend(range(expected, i))
            expected = i + 1
    return report


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _common_extension(names: list[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        ext = os.path.splitext(n)[1]
        counts[ext] = counts.get(ext, 0) + 1
    return max(counts, key=counts.get) if counts else ""


def verify_tree(root: str, extension: str | None = None) -> list[ClassReport]:
    """One report per class; with no ``extension`` given, each class is checked against its commonest."""
    root = require_dir(root, "source.root")
    reports = []
    for name in list_classes(root):
        names = _visible_names(os.path.join(root, name))
        reports.append(check_class(root, name, extension or _common_extension(names), names))
    return reports

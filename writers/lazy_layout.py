"""Lay out a class-folder tree as a lazy_folder tree: ``DST/<class>/<i><ext>``, in ImageFolder order.

The plan (``DST/mapping.tsv``: new path, original path) is written atomically before any file is
linked, copied or moved, so nothing is lost and a rerun after an interruption completes the job from
the plan, even after ``--move`` has emptied part of SRC. Files are hard-linked when SRC and DST share a
filesystem and copied otherwise (each copy lands under a temporary name first, so a rerun never
mistakes a half-written file for a finished one).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tqdm.auto import tqdm

from feedline.datasets.folder.index import open_index
from feedline.datasets.folder.lazy_checks import LayoutError
from feedline.datasets.paths import require_dir
from feedline.writers.lock import writer_lock

MARKER = ".feedline-layout.json"
MAPPING = "mapping.tsv"


def plan_layout(src: str, cache_dir: str | None = None) -> list[tuple[str, str]]:
    """(new relative path, original absolute path) for every sample of ``src``, in sample order."""
    index = open_index(src, cache_dir=cache_dir, key="SRC")
    plan, local, exts = [], [0] * len(index.classes), [None] * len(index.classes)
    mixed: dict[int, list[str]] = {}
    for i in range(len(index)):
        rel, label = index.relpath(i), index.label(i)
        ext = os.path.splitext(rel)[1].lower()
        if exts[label] is None:
            exts[label] = ext
        elif ext != exts[label]:
            mixed.setdefault(label, []).append(os.path.join(src, rel))
        plan.append((f"{index.classes[label]}/{local[label]}{exts[label]}", os.path.join(src, rel)))
        local[label] += 1
    if mixed:
        lines = [
            f"class '{index.classes[c]}' ({exts[c]} first): {', '.join(files[:5])}"
            for c, files in mixed.items()
        ]
        raise LayoutError(
            "lazy_folder needs one extension per class; these files differ from their class's first:\n  "
            + "\n  ".join(lines)
        )
    return plan


def _read_plan(dst: Path) -> list[tuple[str, str]]:
    with open(dst / MAPPING, encoding="utf-8", errors="surrogateescape") as f:
        next(f)  # header
        return [tuple(line.rstrip("\n").split("\t", 1)) for line in f]


def _write_plan(dst: Path, plan) -> None:
    tmp = dst / f".{MAPPING}.tmp"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write("new_path\toriginal_path\n")
        f.writelines(f"{new}\t{orig}\n" for new, orig in plan)
    os.replace(tmp, dst / MAPPING)


def layout(src: str, dst: str, move: bool = False, cache_dir: str | None = None, wait: bool = False) -> str:
    """Lay ``src`` out into ``dst``; a summary line. One process at a time per DST: another one is refused
    at once (``wait``: waited for, then this one completes or confirms its layout)."""
    src = require_dir(src, "SRC")
    dst_path = Path(os.path.abspath(os.path.expanduser(dst)))
    with writer_lock(str(dst_path), "layout", "DST", wait=wait):
        return _layout(src, dst_path, move, cache_dir)


def _layout(src: str, dst_path: Path, move: bool, cache_dir: str | None) -> str:
    marker = dst_path / MARKER
    if dst_path.exists() and any(dst_path.iterdir()):
        try:
            earlier = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            earlier = {}
        if earlier.get("src") != src:
            raise LayoutError(
                f"DST '{dst_path}' is not empty and is not an earlier layout of '{src}': choose an empty or new DST"
            )
        if earlier.get("complete"):
            return f"{dst_path} is already a complete layout of {src}"
        plan = _read_plan(dst_path) if (dst_path / MAPPING).exists() else None
    else:
        plan = None
    dst_path.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"src": src, "move": move}), encoding="utf-8")
    if plan is None:  # nothing has been moved before the plan exists, so SRC is still whole
        plan = plan_layout(src, cache_dir)
        _write_plan(dst_path, plan)

    same_fs = os.stat(src).st_dev == os.stat(dst_path).st_dev
    done = {"links": 0, "copies": 0, "moves": 0, "already there": 0}
    made_dirs: set[str] = set()
    for new, orig in tqdm(plan, desc=f"laying out {src}", unit="file", delay=1.0):
        target = dst_path / new
        if target.exists():
            done["already there"] += 1
            continue
        if not os.path.exists(orig):
            raise LayoutError(
                f"{orig} (planned as {target}) is gone: it was neither laid out nor left in SRC"
            )
        parent = os.path.dirname(target)
        if parent not in made_dirs:
            os.makedirs(parent, exist_ok=True)
            made_dirs.add(parent)
        done[_place(orig, target, move, same_fs)] += 1
    marker.write_text(json.dumps({"src": src, "move": move, "complete": True}), encoding="utf-8")
    kinds = ", ".join(f"{k}: {v}" for k, v in done.items() if v)
    return f"laid out {len(plan)} files from {src} into {dst_path} ({kinds}); mapping: {dst_path / MAPPING}"


def _place(orig: str, target: Path, move: bool, same_fs: bool) -> str:
    if move and same_fs:
        os.rename(orig, target)
        return "moves"
    if same_fs and not move:
        try:
            os.link(orig, target)
            return "links"
        except OSError:  # the filesystem refuses hard links: copy instead
            pass
    tmp = target.with_name(f".{target.name}.partial")
    shutil.copy2(orig, tmp)
    os.replace(tmp, target)
    if move:
        os.remove(orig)
        return "moves"
    return "copies"

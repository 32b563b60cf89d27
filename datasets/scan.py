"""Scan a class-folder tree in torchvision ``ImageFolder``'s order, without a ``stat`` per file.

Order contract (what ``ImageFolder`` does): classes are the sorted sub-directory names of the root;
within a class, ``sorted(os.walk(class_dir, followlinks=True))`` orders directories by their full path
string, and files are sorted by name inside each directory. Hidden entries (names starting with '.')
are skipped, which ``ImageFolder`` does not do (it picks up ``.ipynb_checkpoints`` and ``._x.jpg``).

Every directory is listed once with ``os.scandir``; the entry type comes from the listing (``d_type``),
and Python falls back to ``stat`` only where the filesystem reports none. Directories are ``stat``-ed
once each, for the staleness signature and for symlink-loop detection.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def normalize_extensions(extensions) -> tuple[str, ...]:
    exts = tuple(str(e).lower() for e in extensions)
    return tuple(e if e.startswith(".") else "." + e for e in exts)


def list_classes(root: str) -> list[str]:
    """Sorted names of the visible sub-directories of ``root`` (symlinked directories count)."""
    with os.scandir(root) as it:
        return sorted(e.name for e in it if not e.name.startswith(".") and _is_dir(e))


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks; stats only for links and unknown d_type
    except OSError:
        return False


@dataclass
class ClassScan:
    """One class's files (paths relative to the root, in ImageFolder order) and its directories."""

    files: list[str] = field(default_factory=list)
    dirs: list[tuple[str, int]] = field(default_factory=list)  # (relative dir, mtime_ns)
    loops: list[str] = field(default_factory=list)  # symlinks that point back at an ancestor


def scan_class(root: str, name: str, extensions: tuple[str, ...]) -> ClassScan:
    result = ClassScan()
    top = os.path.join(root, name)
    st = os.stat(top)
    result.dirs.append((name, st.st_mtime_ns))
    listed: list[tuple[str, list[str]]] = []  # (relative dir, matching file names)
    # Depth-first over (absolute dir, relative dir, identities of the dirs above it): a directory whose
    # (st_dev, st_ino) is one of its ancestors' is a symlink loop; walking it would never end.
    stack = [(top, name, frozenset({(st.st_dev, st.st_ino)}))]
    while stack:
        path, rel, ancestors = stack.pop()
        names: list[str] = []
        try:
            it = os.scandir(path)
        except OSError as err:  # os.walk (and so ImageFolder) skips unreadable directories too
            log.warning("cannot list %s: %s", path, err)
            continue
        with it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if _is_dir(entry):
                    sub = entry.stat()  # follows the symlink: the identity of the real directory
                    key = (sub.st_dev, sub.st_ino)
                    child = rel + "/" + entry.name
                    if key in ancestors:
                        result.loops.append(child)
                        continue
                    result.dirs.append((child, sub.st_mtime_ns))
                    stack.append((entry.path, child, ancestors | {key}))
                elif entry.name.lower().endswith(extensions):
                    names.append(entry.name)
        listed.append((rel, names))
    listed.sort(key=lambda item: item[0])
    for rel, names in listed:
        names.sort()
        result.files.extend(rel + "/" + n for n in names)
    return result


@dataclass
class TreeScan:
    classes: list[str]
    files: list[str]
    labels: list[int]
    counts: list[int]
    dirs: list[tuple[str, int]]
    loops: list[str]


def scan_tree(root: str, extensions, threads: int | None = None) -> TreeScan:
    """Scan ``root/<class>/**/<file>``; class directories are listed in parallel by a thread pool."""
    extensions = normalize_extensions(extensions)
    root_mtime = os.stat(root).st_mtime_ns
    classes = list_classes(root)
    threads = threads or min(32, (os.cpu_count() or 1) * 4)
    scans: list[ClassScan] = [ClassScan()] * len(classes)
    with (
        ThreadPoolExecutor(max_workers=max(1, min(threads, len(classes)))) as pool,
        tqdm(total=len(classes), desc=f"indexing {root}", unit="class", delay=1.0, leave=False) as bar,
    ):
        futures = {pool.submit(scan_class, root, c, extensions): i for i, c in enumerate(classes)}
        files_seen = 0
        for future in as_completed(futures):
            i = futures[future]
            scans[i] = future.result()
            files_seen += len(scans[i].files)
            bar.set_postfix(files=files_seen, refresh=False)
            bar.update()
    files: list[str] = []
    labels: list[int] = []
    counts: list[int] = []
    dirs: list[tuple[str, int]] = [("", root_mtime)]
    loops: list[str] = []
    for label, scan in enumerate(scans):
        files.extend(scan.files)
        labels.extend([label] * len(scan.files))
        counts.append(len(scan.files))
        dirs.extend(scan.dirs)
        loops.extend(scan.loops)
    for loop in loops:
        log.warning("skipping symlink loop %s (it points back at a folder above it)", os.path.join(root, loop))
    return TreeScan(classes, files, labels, counts, dirs, loops)


def stale_dirs(root: str, dirs, limit: int = 5) -> list[str]:
    """Directories whose mtime changed (or that vanished) since the scan: O(directories) stats."""
    changed = []
    for rel, mtime_ns in dirs:
        try:
            now = os.stat(os.path.join(root, rel) if rel else root).st_mtime_ns
        except OSError:
            now = None
        if now != mtime_ns:
            changed.append(rel or ".")
            if len(changed) >= limit:
                break
    return changed

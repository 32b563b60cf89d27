"""The packed folder index: build it once, map it everywhere.

One directory per indexed root, under ``<cache_dir>/folder-index/``:

    paths.npy    uint8    every relative path, UTF-8, each followed by a NUL byte
    offsets.npy  int64    N+1 offsets into paths.npy
    labels.npy   int16/32 N class indices
    dirs.json             [relative dir, mtime_ns] of every directory: the staleness signature
    meta.json             root, classes, per-class counts, extensions, format version, a checksum of each
                          file above and of itself; written last

A build writes into a temporary directory beside the final one and renames it into place, so readers
never see half an index and concurrent builders both end with a valid one. Readers map the arrays with
numpy (``mmap_mode="r"``, ``datasets/folder/packed.py``): every rank and DataLoader worker shares the same
page-cache pages. A run keeps the files it mapped when another process rebuilds the directory: forked
workers inherit its maps, and a worker that maps afresh refuses files that replaced them.

``feedline-index ROOT`` (``feedline.cli.index``) builds or shows the index of one tree.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from feedline.datasets.cache import (
    cache_path,
    check_record,
    check_refresh,
    disk_full,
    file_record,
    json_checksum,
    remove_stale,
    stale_dirs,
    temporary_prefix,
    write_array,
    write_text,
)
from feedline.datasets.folder.packed import FolderIndex
from feedline.datasets.folder.scan import TreeScan, scan_tree
from feedline.datasets.folder.scan_plan import scan_plan
from feedline.datasets.paths import IMG_EXTENSIONS, normalize_extensions, require_dir

log = logging.getLogger(__name__)

FORMAT = 3  # 3: checksums of every file in meta.json
# Filesystem timestamps are coarse (one kernel tick on local disks): a directory changed within this
# window of its listing may carry the same mtime as before the change, so such a scan is repeated once.
RACY_WINDOW_NS = 50_000_000


def index_dir(root: str, extensions, cache_dir: str | None) -> Path:
    """Where the index of ``root`` lives: one directory per (absolute root, extensions)."""
    root = os.path.abspath(os.path.expanduser(root))
    key = [root, sorted(normalize_extensions(extensions))]
    return cache_path("folder-index", os.path.basename(root), key, cache_dir)


def problem(directory: Path) -> str | None:
    """Why the index at ``directory`` cannot be trusted, or None when it is sound. O(1) in samples."""
    return _check(directory)[1]


def _check(directory: Path) -> tuple[FolderIndex | None, str | None]:
    """(the index, None) when it is sound, else (None, why not). Checks, in O(1) file reads: meta.json's
    own checksum, each file against the checksum recorded when it was written (``cache.check_record``), the
    array lengths, offsets spanning paths.npy, the first and last labels in range, and the class counts
    summing to the samples. The O(N) invariants of labels.npy (class-major order, per-class counts as
    meta.json says) are checked once, in blocks, and recorded in meta.json (``arrays_checked``): a build
    records them as it writes them, and the first process to open an index written otherwise (an older
    feedline, another tool) checks and records them for every rank after it. The records pin the files'
    contents, so a rank opens a checked index without reading its labels."""
    meta_path = directory / "meta.json"
    if not meta_path.exists():  # no directory: never built (quietly); a directory without it: damaged
        return None, "meta.json is missing" if directory.exists() else "missing"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            return None, f"format {meta.get('format')!r}, expected {FORMAT}"
        if meta.get("checksum") != json_checksum(meta):
            return None, "meta.json changed after it was written (checksum mismatch)"
        for name, record in meta["files"].items():
            reason = check_record(directory / name, record)
            if reason:
                return None, reason
        n, counts = meta["num_samples"], meta["counts"]
        index = FolderIndex(directory, meta)
        paths, offsets, labels = index.arrays
        if offsets.shape != (n + 1,) or labels.shape != (n,):
            return None, "array lengths disagree with meta.json"
        if offsets[0] != 0 or offsets[-1] != paths.shape[0] or (n and paths[-1] != 0):
            return None, "offsets do not span paths.npy"
        if sum(counts) != n or len(counts) != len(meta["classes"]):
            return None, "class counts disagree with meta.json"
        if n and (labels[0] < 0 or labels[-1] >= len(counts)):
            return None, "labels.npy is not in class-major order within the classes"
        if not meta.get("arrays_checked"):
            reason = _labels_problem(labels, counts)
            if reason:
                return None, reason
            index.meta = _record_checked(directory, meta)
        index.dirs()  # parsed here, once: a garbled signature means rebuild
    except Exception as err:  # any unreadable piece means: rebuild, never crash
        return None, f"{type(err).__name__}: {err}"
    return index, None


CHECK_BLOCK = 1 << 20  # labels per block of the O(N) check: its temporaries, 1 MB and O(classes), at any size


def _labels_problem(labels: np.ndarray, counts: list[int]) -> str | None:
    """Why ``labels`` (first and last already in range) is not class-major with these per-class counts, or
    None. Read a block at a time; the pages read leave this process's memory after (``_release``)."""
    try:
        return _blockwise(labels, counts)
    finally:
        _release(labels)


def _blockwise(labels: np.ndarray, counts: list[int]) -> str | None:
    found = np.zeros(len(counts), dtype=np.int64)
    last = labels[0] if len(labels) else 0
    for start in range(0, len(labels), CHECK_BLOCK):
        block = np.asarray(labels[start : start + CHECK_BLOCK])
        if block[0] < last or np.any(block[1:] < block[:-1]):
            return "labels.npy is not in class-major order within the classes"
        # Sorted, its first and last in range: each class's count is where its run starts and ends.
        starts = np.searchsorted(block, np.arange(len(counts), dtype=block.dtype))  # no wider copy of block
        found += np.diff(starts, append=len(block))
        last = block[-1]
    if not np.array_equal(found, counts):
        return "labels.npy disagrees with the class counts in meta.json"
    return None


def _release(array: np.ndarray) -> None:
    """Unmap the pages of ``array``'s file map from this process (they stay in the page cache, and are mapped
    again where read): a check of a 100M-row index leaves no 200 MB of labels in the checking rank's RSS."""
    mapped = getattr(array, "_mmap", None)
    if mapped is not None and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def _record_checked(directory: Path, meta: dict) -> dict:
    """``meta`` with the O(N) check recorded, written over meta.json where it is still the one checked (a
    cache this process cannot write is checked again by the next process instead)."""
    checked = dict(meta, arrays_checked=True)
    checked["checksum"] = json_checksum(checked)
    path = directory / "meta.json"
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("checksum") == meta["checksum"]:
            write_text(path, json.dumps(checked, ensure_ascii=False))
    except (OSError, ValueError) as err:
        log.info("could not record the check of %s (%s): the next process checks it again", directory, err)
        return meta
    return checked


def build(root: str, extensions, dest: Path, workers="auto", key: str = "source.root") -> FolderIndex:
    """Scan ``root`` and publish its index at ``dest`` atomically."""
    root = os.path.abspath(os.path.expanduser(root))
    extensions = normalize_extensions(extensions)
    for attempt in range(2):
        started = time.time_ns()
        scan = scan_tree(root, extensions, scan_plan(root, workers))
        racy = {d for d, mtime in scan.dirs if mtime >= started - RACY_WINDOW_NS}
        if not racy:
            break
        if attempt == 0:  # changed just now: list again once the timestamp tick has passed
            time.sleep(RACY_WINDOW_NS / 1e9)
            continue
        # Still changing: keep what we saw, but force a re-scan on the next load of these directories.
        scan.dirs = [(d, -1 if d in racy else m) for d, m in scan.dirs]
    _check_not_empty(root, scan, extensions, key)
    index = publish_scan(root, extensions, scan, dest, started)
    log.info(
        "indexed %d files in %d classes under %s in %.2fs",
        scan.num_files,
        len(scan.classes),
        root,
        index.meta["build_seconds"],
    )
    return index


def publish_scan(root: str, extensions, scan: TreeScan, dest: Path, started: int) -> FolderIndex:
    """Write ``scan`` (begun at ``started``, ns) as the index at ``dest``, atomically, and map it."""
    seconds = (time.time_ns() - started) / 1e9
    remove_stale(_ensure_dir(dest.parent), dest.name)  # what a killed build left behind
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(dest.name), dir=dest.parent))
    try:
        try:
            meta = _write(tmp, root, extensions, scan, started, seconds)
        except OSError as err:
            raise disk_full(err, dest.parent) from err
        # Mapped before it is published: the maps hold the files themselves, so they stay valid even if a
        # concurrent builder later replaces the directory (reading it lazily from dest would race that).
        ours = FolderIndex(tmp, meta)
        _ = ours.arrays, ours.dirs()
        index = _publish(tmp, dest, started, ours)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return index


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check_not_empty(root: str, scan: TreeScan, extensions, key: str = "source.root") -> None:
    hint = f"supported extensions: {', '.join(extensions)}; set source.extensions=[...] to change them"
    if not scan.classes:
        raise FileNotFoundError(
            f"{key} '{root}' has no class folders: expected {root}/<class>/<image> ({hint})"
        )
    empty = [c for c, n in zip(scan.classes, scan.counts) if n == 0]
    if len(empty) == len(scan.classes):
        raise FileNotFoundError(f"Found 0 images in the class folders of {key} '{root}' ({hint})")
    if empty:
        shown = ", ".join(os.path.join(root, c) for c in empty[:5])
        more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        raise FileNotFoundError(
            f"{len(empty)} class folder(s) of {key} '{root}' hold no images: {shown}{more} "
            f"(remove them or add images; {hint})"
        )


def _write(tmp: Path, root: str, extensions, scan: TreeScan, started: int, seconds: float) -> dict:
    # Every path is stored NUL-terminated (NUL cannot occur in a file name), so numpy finds the
    # offsets in one pass and no per-file work happens in Python.
    paths = np.frombuffer(b"".join(s.paths for s in scan.scans), dtype=np.uint8)
    offsets = np.empty(scan.num_files + 1, dtype=np.int64)
    offsets[0] = 0
    offsets[1:] = np.flatnonzero(paths == 0) + 1
    label_dtype = np.int16 if len(scan.classes) < 2**15 else np.int32
    labels = np.repeat(np.arange(len(scan.classes), dtype=label_dtype), scan.counts)
    crcs = {}
    for name, array in (("paths.npy", paths), ("offsets.npy", offsets), ("labels.npy", labels)):
        with open(tmp / name, "wb") as f:
            crcs[name] = write_array(f, array)  # checksummed as written: nothing is read back
    signature = json.dumps(scan.dirs).encode("utf-8")
    (tmp / "dirs.json").write_bytes(signature)
    crcs["dirs.json"] = zlib.crc32(signature)
    meta = {
        "format": FORMAT,
        "root": root,
        "classes": scan.classes,
        "counts": scan.counts,
        "num_samples": scan.num_files,
        "extensions": list(extensions),
        "scan_started_ns": started,
        "build_seconds": round(seconds, 3),
        "symlink_loops": scan.loops,
        "unreadable_dirs": scan.unreadable,
        "skipped_entries": scan.odd,
        "files": {name: file_record(tmp / name, crc) for name, crc in crcs.items()},  # checked on every load
        "arrays_checked": True,  # class-major with these counts: made so above (``_check``)
    }
    meta["checksum"] = json_checksum(meta)
    (tmp / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")  # last
    return meta


def _publish(tmp: Path, dest: Path, started: int, ours: FolderIndex) -> FolderIndex:
    """Rename ``tmp`` to ``dest`` and return ``ours`` (already mapped) under its new name. If another
    builder got there first with an index at least as new, keep theirs and return it (``_check`` maps it);
    an older or broken one is moved aside first (open memory maps of it stay valid)."""
    for _ in range(5):
        try:
            os.rename(tmp, dest)
            ours.directory = str(dest)
            return ours
        except OSError:
            if not dest.exists():
                continue
        theirs, reason = _check(dest)
        if reason is None and theirs.meta["scan_started_ns"] >= started:
            return theirs
        aside = dest.with_name(f".{dest.name}.old-{os.getpid()}-{time.time_ns()}")
        try:
            os.rename(dest, aside)
        except FileNotFoundError:
            continue
        shutil.rmtree(aside, ignore_errors=True)
    raise RuntimeError(f"could not publish the index at {dest}: other processes keep replacing it")


def open_index(
    root: str,
    extensions=IMG_EXTENSIONS,
    cache_dir: str | None = None,
    refresh: str = "auto",
    key: str = "source.root",
    workers="auto",
) -> FolderIndex:
    """The index of ``root``: mapped from the cache when it is sound and fresh, (re)built otherwise."""
    check_refresh(refresh)
    root = require_dir(root, key)
    dest = index_dir(root, extensions, cache_dir)
    if refresh != "always":
        index, reason = _check(dest)
        if reason is None:
            changed = [] if refresh == "never" else stale_dirs(root, index.dirs())
            if not changed:
                return index
            log.info("%s changed since it was indexed (%s); re-indexing", root, ", ".join(changed))
        elif reason != "missing":
            log.warning("index cache %s is unusable (%s); rebuilding it", dest, reason)
    return build(root, extensions, dest, workers, key)

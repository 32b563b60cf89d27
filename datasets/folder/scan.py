"""Scan a class-folder tree in torchvision ``ImageFolder``'s order, without a ``stat`` per file.

Order contract (what ``ImageFolder`` does): classes are the sorted sub-directory names of the root;
within a class, ``sorted(os.walk(class_dir, followlinks=True))`` orders directories by their full path
string, and files are sorted by name inside each directory. Hidden entries (names starting with '.')
are skipped, which ``ImageFolder`` does not do (it picks up ``.ipynb_checkpoints`` and ``._x.jpg``).

How one class folder is listed, without a ``stat`` per file, is ``listing.py``; this module orders the
classes and lists them in parallel.

Class directories are listed in parallel. Where a listing is a network round trip (NFS, Lustre, GPFS,
CIFS, FUSE, ...) a thread pool hides the latency. On a local disk the listing is CPU-bound, and because
CPython's ``scandir`` releases and re-takes the GIL for every entry, threads there are slower than one
(measured: 100k files, 0.09 s serial, 0.13 s with 2 threads, 0.17 s with 4), so local disks get a
few fresh, minimal interpreters (``python -S``, standard library only) that stream one result per class
back over a pipe. Fresh interpreters, not forks: forking a training process with torch loaded costs more
than the listing it would share (measured at 1M files: 0.9-1.0 s forked, 0.7 s without torch loaded).

Those workers run ``listing.py`` (standard library only), so they start in milliseconds.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import pickle
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from feedline.datasets.folder.listing import ClassScan, _NameFilter, scan_class
from feedline.datasets.paths import list_classes, normalize_extensions

log = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@dataclass
class TreeScan:
    classes: list[str]
    scans: list[ClassScan]
    dirs: list[tuple[str, int]]
    loops: list[str]
    unreadable: list[str] = field(default_factory=list)
    odd: list[str] = field(default_factory=list)

    @property
    def counts(self) -> list[int]:
        return [scan.count for scan in self.scans]

    @property
    def num_files(self) -> int:
        return sum(self.counts)


def scan_tree(root: str, extensions, plan: tuple[str, int] = ("serial", 1)) -> TreeScan:
    """Scan ``root/<class>/**/<file>``, one task per class directory, as ``plan`` says
    (``scan_plan.scan_plan``: threads, processes or serial, and how many)."""
    from tqdm.auto import tqdm

    extensions = normalize_extensions(extensions)
    name_filter = _NameFilter(extensions)
    root_mtime = os.stat(root).st_mtime_ns
    classes = list_classes(root)
    kind, workers = plan
    if len(classes) < 2 * workers:
        kind = "serial"
    task = functools.partial(scan_class, root=root, name_filter=name_filter)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of new strings: collections would scan them over and over, finding nothing
    try:
        with tqdm(total=len(classes), desc=f"indexing {root}", unit="class", delay=1.0, leave=False) as bar:
            if kind == "processes":
                scans = _scan_in_workers(root, classes, extensions, workers, bar)
            else:
                scans = []
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    for scan in pool.map(task, classes) if kind == "threads" else map(task, classes):
                        scans.append(scan)
                        bar.update()
    finally:
        if gc_was_enabled:
            gc.enable()
    dirs: list[tuple[str, int]] = [("", root_mtime)]
    found = TreeScan(classes, scans, dirs, [])
    for scan in scans:
        dirs.extend(scan.dirs)
        found.loops.extend(scan.loops)
        found.unreadable.extend(scan.unreadable)
        found.odd.extend(scan.odd)
    _report(root, "symlink loop(s) skipped (they point back at the root or a folder above)", found.loops)
    _report(
        root,
        "class folder(s) that are another class's folder under a second name (their samples get both labels)",
        _aliases(root, classes),
    )
    _report(
        root, "folder(s) could not be listed: left out now, listed again on the next load", found.unreadable
    )
    _report(
        root,
        "entries skipped: image names, but not regular files (FIFOs, sockets, dangling links)",
        found.odd,
    )
    return found


def _aliases(root: str, classes: list[str]) -> list[str]:
    """Class folders that resolve to a folder another class already is (a symlink ``b -> a``)."""
    seen: dict[tuple[int, int], str] = {}
    aliases = []
    for name in classes:
        st = os.stat(os.path.join(root, name))
        key = (st.st_dev, st.st_ino)
        if key in seen:
            aliases.append(f"{name} (= {seen[key]})")
        seen.setdefault(key, name)
    return aliases


def _report(root: str, what: str, items: list[str], shown: int = 5) -> None:
    if items:
        paths = ", ".join(os.path.join(root, item) for item in items[:shown])
        log.warning("%s: %d %s: %s%s", root, len(items), what, paths, " ..." if len(items) > shown else "")


def list_images(root: str, extensions) -> list[str]:
    """Every image below ``root`` (any depth, no class folders), as paths relative to it, sorted. Loops,
    unreadable directories and entries that are no regular files are left out and reported, as in
    ``scan_tree``."""
    scan = scan_class(".", root, _NameFilter(normalize_extensions(extensions)))
    for what, items in (
        ("symlink loop(s) left out", scan.loops),
        ("unreadable director(ies) left out", scan.unreadable),
        ("entries that are not regular files left out", scan.odd),
    ):
        _report(root, what, [item[2:] for item in items])
    text = scan.paths.decode("utf-8", "surrogateescape")
    return sorted(path[2:] for path in text.split("\0")[:-1])


# A worker runs listing.py as a script (it imports only the standard library), so it starts in milliseconds
# and needs neither site-packages nor the feedline package on its path.
_WORKER = [
    sys.executable,
    "-I",
    "-S",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "listing.py"),
    "--scan-worker",
]


def _scan_in_workers(root: str, classes: list[str], extensions, workers: int, bar) -> list[ClassScan]:
    """List the classes in ``workers`` fresh interpreters; each takes every ``workers``-th class (so deep
    and shallow classes spread evenly) and streams ``(index, ClassScan)`` back as it goes."""
    scans: list[ClassScan | None] = [None] * len(classes)
    procs = [
        subprocess.Popen(
            _WORKER,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(workers)
    ]
    lock = threading.Lock()

    def drain(proc: subprocess.Popen) -> None:
        while True:
            try:
                i, fields = pickle.load(proc.stdout)
            except EOFError:
                return
            scans[i] = ClassScan(*fields)
            with lock:
                bar.update()

    readers = [threading.Thread(target=drain, args=(p,), daemon=True) for p in procs]
    for k, (proc, reader) in enumerate(zip(procs, readers)):
        reader.start()
        mine = [(i, classes[i]) for i in range(k, len(classes), workers)]
        try:
            pickle.dump((root, extensions, mine), proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            proc.stdin.close()
        except BrokenPipeError:  # the worker died before reading its tasks; its stderr says why, below
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
    errors = []
    for proc, reader in zip(procs, readers):
        reader.join()
        stderr = proc.stderr.read().decode(errors="replace")
        proc.stdout.close()
        proc.stderr.close()
        if proc.wait() != 0:
            errors.append(
                stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {proc.returncode}"
            )
    if errors or any(scan is None for scan in scans):
        raise OSError(f"scanning {root} failed: {'; '.join(errors) or 'a worker stopped early'}")
    return scans

"""List one class folder of a tree, in torchvision ``ImageFolder``'s order, without a ``stat`` per file.

Every directory is listed once with ``os.scandir``; the entry type comes from the listing (``d_type``), and
Python falls back to ``stat`` only where the filesystem reports none. Directories are ``stat``-ed once each,
for the staleness signature and for symlink-loop detection. Per-file work stays in C: one ``map`` for the
entry types, one sort, and one regular expression over the joined names that applies the hidden-name and
extension filters (``name.lower().endswith(extensions)``, as ImageFolder does).

Standard library only: ``scan.py`` runs this very file as a scan worker in a fresh, minimal interpreter
(``python -I -S listing.py --scan-worker``), which starts in milliseconds and needs neither site-packages nor
the feedline package on its path.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import pickle
import re
import sys
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class _NameFilter:
    """Matches each visible name with an allowed extension in a NUL-joined list of names."""

    def __init__(self, extensions: tuple[str, ...]):
        self.extensions = extensions
        alternatives = "|".join(re.escape(e) for e in sorted(extensions, key=len, reverse=True))
        self.pattern = re.compile(rf"(?<![^\0])[^.\0][^\0]*(?:{alternatives})(?![^\0])", re.IGNORECASE)

    def findall(self, joined: str) -> list[str]:
        return self.pattern.findall(joined)


def _matching(names: list[str], name_filter: _NameFilter) -> list[str]:
    """The names the filter accepts, in order. Fast path: when every name ends with an allowed
    extension and none is hidden (the usual image folder), a few ``str.count`` calls prove it."""
    joined = "\0".join(names) + "\0"
    folded = joined.lower()
    if folded.isascii() and "\0." not in "\0" + joined:
        first = os.path.splitext(folded[: folded.find("\0")])[1]  # most folders hold one extension
        found = 0
        for ext in sorted(name_filter.extensions, key=lambda e: e != first):
            found += folded.count(ext + "\0")
            if found == len(names):
                return names
    return name_filter.findall(joined)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks; stats only for links and unknown d_type
    except OSError:  # a symlink whose target vanished
        return False


@dataclass
class ClassScan:
    """One class: its files as UTF-8 paths relative to the root, each followed by a NUL, in ImageFolder
    order (one bytes object crosses between processes at memcpy speed; a million strings do not)."""

    paths: bytes = b""
    count: int = 0
    dirs: list[tuple[str, int]] = field(default_factory=list)  # (relative dir, mtime_ns)
    loops: list[str] = field(default_factory=list)  # symlinks that point back at an ancestor (or the root)
    unreadable: list[str] = field(default_factory=list)  # directories that could not be listed
    odd: list[str] = field(default_factory=list)  # entries that are neither directories nor regular files


@functools.lru_cache(maxsize=64)
def _identities_above(root: str) -> frozenset:
    """(st_dev, st_ino) of ``root`` and of every directory above it: a link to any of them is a loop."""
    found, path = set(), os.path.realpath(root)
    while True:
        st = os.stat(path)
        found.add((st.st_dev, st.st_ino))
        parent = os.path.dirname(path)
        if parent == path:
            return frozenset(found)
        path = parent


def scan_class(name: str, root: str, name_filter: _NameFilter) -> ClassScan:
    result = ClassScan()
    groups: list[tuple[str, list[str]]] = []  # (relative dir, sorted matching names)
    top = os.path.join(root, name)
    st = os.stat(top)
    result.dirs.append((name, st.st_mtime_ns))
    # Depth-first over (absolute dir, relative dir, identities of the dirs above it, the root's included): a
    # directory whose (st_dev, st_ino) is one of those is a symlink loop, which would index samples again
    # under another class, or never end.
    stack = [(top, name, _identities_above(root) | {(st.st_dev, st.st_ino)})]
    while stack:
        path, rel, ancestors = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as err:  # left out of this index, and listed again on the next load (see dirs)
            log.warning("cannot list %s: %s", path, err)
            result.unreadable.append(rel)
            continue
        try:
            is_dir = list(map(os.DirEntry.is_dir, entries))
        except OSError:
            is_dir = list(map(_is_dir, entries))
        # FIFOs, sockets, devices and dangling links are no images (a FIFO would block a reader forever):
        # left out, and reported. The check runs in C unless the directory has something other than files.
        if not _all_files(entries):
            odd = [e for e, d in zip(entries, is_dir) if not d and not _is_file(e)]
            if odd:
                result.odd.extend(f"{rel}/{e.name}" for e in odd if _matching([e.name], name_filter))
                skip = {id(e) for e in odd}
                is_dir = [d for e, d in zip(entries, is_dir) if id(e) not in skip]
                entries = [e for e in entries if id(e) not in skip]
        if any(is_dir):
            names = [e.name for e, d in zip(entries, is_dir) if not d]
            for entry in (e for e, d in zip(entries, is_dir) if d and not e.name.startswith(".")):
                sub = entry.stat()  # follows the symlink: the identity of the real directory
                key = (sub.st_dev, sub.st_ino)
                child = f"{rel}/{entry.name}"
                if key in ancestors:
                    result.loops.append(child)
                    continue
                result.dirs.append((child, sub.st_mtime_ns))
                stack.append((entry.path, child, ancestors | {key}))
        else:
            names = [e.name for e in entries]
        names.sort()
        matched = _matching(names, name_filter)
        if matched:
            groups.append((rel, matched))
            result.count += len(matched)
    groups.sort(key=lambda group: group[0])
    text = "".join(f"{rel}/" + f"\0{rel}/".join(names) + "\0" for rel, names in groups)
    result.paths = text.encode("utf-8", "surrogateescape")
    if result.unreadable:  # an impossible mtime: the next load sees these as changed and lists them again
        unreadable = set(result.unreadable)
        result.dirs = [(d, -1 if d in unreadable else m) for d, m in result.dirs]
    return result


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()  # from d_type; stats only for links and unknown types
    except OSError:
        return False


def _all_files(entries: list[os.DirEntry]) -> bool:
    try:
        return all(map(os.DirEntry.is_file, entries))
    except OSError:
        return False


def _worker_main() -> None:
    """A scan worker: read (root, extensions, [(index, class)]) from stdin, stream results to stdout."""
    gc.disable()
    root, extensions, tasks = pickle.load(sys.stdin.buffer)
    name_filter = _NameFilter(extensions)
    out = sys.stdout.buffer
    for i, name in tasks:
        scan = scan_class(name, root, name_filter)
        # Plain fields, not the dataclass: here it is __main__.ClassScan, which the parent cannot unpickle.
        fields = (scan.paths, scan.count, scan.dirs, scan.loops, scan.unreadable, scan.odd)
        pickle.dump((i, fields), out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--scan-worker"]:
    _worker_main()

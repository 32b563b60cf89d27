"""Room in a chunk cache (``storage/chunk_cache.py``): what counts against its limit, and what may go to make room.

Every byte in the directory counts (the limit is about the disk), but only the cache's own files ever go:
regular files of this user's (``storage/cache_trust.py``) under a cache name (``NAME``), complete chunks least
recently used first, each only when no process is reading it (``LOCK_EX | LOCK_NB``), truncated to 0 bytes
(which frees its blocks at once, even where another process holds it open) and unlinked; a dead writer's
download (``<name>.part``, its lock free) before them. A symlink, a file of another name or owner, or a
folder holding one, stays where it is. A folder of the earlier per-dataset layout, all of it this user's,
ages out whole. Called under the cache's directory lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat

from feedline.storage.cache_trust import mine

NAME = re.compile(r"[0-9a-f]{16}-[^/]+")  # a chunk's cache name (cached_chunks.cache_name), never a .part
PART = ".part"


def is_chunk(name: str) -> bool:
    return bool(NAME.fullmatch(name)) and not name.endswith(PART)


def make_room(directory: str, limit: int, size: int) -> bool:
    """Evict unread complete chunks, least recently used first, until ``size`` more bytes fit ``limit``;
    whether they do."""
    used, chunks, parts = 0, [], []
    with os.scandir(directory) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                bytes_ = _size(entry)
                used += bytes_  # the cache's or not; only its own go (``evict``, ``remove_own`` check)
                if stat.S_ISDIR(st.st_mode):  # an earlier layout's cache of a dataset
                    chunks.append((st.st_mtime_ns, entry.path, bytes_))  # aged out whole
                elif not stat.S_ISREG(st.st_mode):
                    continue
                elif entry.name.endswith(PART) and is_chunk(entry.name[: -len(PART)]):
                    parts.append((entry.path, st.st_size))
                elif is_chunk(entry.name):
                    chunks.append((st.st_mtime_ns, entry.path, st.st_size))
    for path, bytes_ in parts:
        if used + size <= limit:
            break
        # its writer died (SIGKILL): its chunk may not be wanted again for a long time
        if not held(path) and remove_own(path):
            used -= bytes_
    for _, path, bytes_ in sorted(chunks):
        if used + size <= limit:
            break
        if evict(path):
            used -= bytes_
    return used + size <= limit


def foreign(directory: str) -> list[tuple[str, int]]:
    """The entries of ``directory`` that no eviction ever removes (a symlink, a file of another name or
    owner) with their bytes, largest first: what a limit they fill can never make room for."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                name = entry.name[: -len(PART)] if entry.name.endswith(PART) else entry.name
                own = stat.S_ISREG(st.st_mode) and mine(st) and is_chunk(name)
                if not own and not stat.S_ISDIR(st.st_mode):  # a folder: an earlier layout's, aged out whole
                    found.append((entry.path, _size(entry)))
    return sorted(found, key=lambda item: -item[1])


def usage(directory: str) -> int:
    """Bytes in ``directory`` now: every entry, the cache's or not."""
    total = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                total += _size(entry)
    return total


def _locked_exclusively(path: str, flags: int) -> int | None:
    """A descriptor of ``path`` (opened with ``flags``) holding its exclusive lock, or None when the file is
    gone or another process holds a lock on it (a download's writer, a reader mid-read)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise


def held(path: str) -> bool:
    """Whether a live process holds ``path``'s lock (a download's writer); a symlink has no writer."""
    try:
        fd = _locked_exclusively(path, os.O_RDONLY)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return False
        raise
    if fd is None:
        return os.path.exists(path)
    os.close(fd)
    return False


def _size(entry: os.DirEntry) -> int:
    """Bytes of a directory entry: a file's size; a directory's files (the cache of one dataset, as the cache
    was laid out before it was one per node), all of them."""
    if not entry.is_dir(follow_symlinks=False):
        return entry.stat(follow_symlinks=False).st_size
    total = 0
    for root, _, names in os.walk(entry.path):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def evict(path: str) -> bool:
    """Remove a complete chunk of the cache's that no process is reading: truncated first, so that its blocks
    are freed even where a process holds it open (that process sees 0 bytes and fetches it again). A symlink
    or a file of another owner is never truncated nor removed."""
    if os.path.islink(path):
        return False
    if os.path.isdir(path):  # an earlier layout's dataset cache: only if all of it is this user's
        if not _all_own(path):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.exists(path)
    try:
        fd = _locked_exclusively(path, os.O_RDWR)
    except OSError as err:
        if err.errno == errno.ELOOP:  # a symlink put there meanwhile
            return False
        raise
    if fd is None:
        return False  # gone, or being read now
    try:
        if not mine(os.fstat(fd)):
            return False
        os.ftruncate(fd, 0)
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _all_own(directory: str) -> bool:
    """Whether ``directory`` and everything in it belongs to this user (symlinks not followed)."""
    for root, dirs, files in os.walk(directory):
        for name in [".", *dirs, *files]:
            with contextlib.suppress(FileNotFoundError):
                if not mine(os.lstat(os.path.join(root, name))):
                    return False
    return True


def remove_own(path: str) -> bool:
    """Remove ``path`` where it is a file of this user's (or gone already); False where it is not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not (stat.S_ISREG(st.st_mode) and mine(st)):
        return False
    remove(path)
    return True


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)

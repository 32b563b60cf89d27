"""A node's cache of chunks fetched from object storage, never above its byte limit on disk.

One directory per node (``source.cache_dir``), shared by every process of the node (ranks and their
workers) and every dataset they read (the callers name chunks apart), under one limit; coordinated by
``flock`` alone, so a process killed with SIGKILL leaves no lock behind:

    <dir>/<chunk>           a complete chunk, renamed into place once its bytes are all there, on the disk
    <dir>/<chunk>.part      a download in progress: sized to the whole chunk when it starts (counted in full),
                            locked by its writer; one whose lock is free belongs to a dead writer and is removed
    <dir>/.lock             the directory lock: taken to admit a download, evict, or rename one into place
    <dir>.stats             chunks and bytes fetched (``fetched()``): beside the directory, not in it, so that
                            a limit of exactly the chunks it must hold holds them

The bound: a download is admitted, under the directory lock, only when the sizes of every file in the
directory plus its own fit ``limit``; to make room, complete chunks are evicted, least recently used first,
each only when no process is reading it (``LOCK_EX | LOCK_NB`` on it), truncated to 0 bytes (which frees its
blocks at once, even where another process holds it open) and unlinked. Readers take ``LOCK_SH`` on a chunk
for the read only (``read``: one ``pread``), after checking its size: a chunk evicted since it was opened
reads as 0 bytes and is fetched again. Nothing is memory-mapped: a map of an evicted chunk would hold its
blocks (or fault); a sample's bytes are one ``pread``, a copy of an encoded image.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import BinaryIO

OPEN_FILES = 64  # chunk descriptors kept open per process (no lock is held between reads)
WAIT = 0.02  # seconds between looks while another process downloads a chunk or holds the room
NO_ROOM_TIMEOUT = 300.0  # seconds without room before the limit is named as too small
TOUCH_EVERY = 1.0  # seconds: a chunk's use time (its mtime, the eviction order) is refreshed at most so often

Fetch = Callable[[BinaryIO], None]  # writes the chunk's bytes to the file object given


class CacheFullError(RuntimeError):
    """No room can be made: every chunk in the cache is being read or downloaded."""


class ChunkCache:
    """Chunks of one dataset in ``directory``, at most ``limit`` bytes on disk (``key`` names the setting in
    errors). ``read(name, size, offset, length, fetch)`` returns bytes of a chunk, fetching it first when it
    is not here. Pickles as its settings; descriptors are opened in the process that reads."""

    def __init__(self, directory: str, limit: int, key: str = "source.cache_limit"):
        self.directory, self.limit, self.key = str(directory), int(limit), key
        try:
            os.makedirs(self.directory, exist_ok=True)
            os.close(os.open(os.path.join(self.directory, ".lock"), os.O_CREAT | os.O_RDWR, 0o644))
        except OSError as err:  # a read-only mount, another user's directory: named before any work
            raise OSError(
                err.errno,
                f"cannot make the chunk cache {self.directory}: {err.strerror}; point source.cache_dir (or "
                f"paths.cache_dir, FEEDLINE_CACHE_DIR) at a writable directory",
            ) from None
        self._files: collections.OrderedDict | None = None
        self._pid = None

    def __getstate__(self):
        return self.directory, self.limit, self.key

    def __setstate__(self, state):
        self.__init__(*state)

    # -- reading ---------------------------------------------------------------------------------------------
    def read(self, name: str, size: int, offset: int, length: int, fetch: Fetch) -> bytearray:
        """``length`` bytes at ``offset`` of chunk ``name`` (``size`` bytes whole)."""
        if not 0 <= offset <= offset + length <= size:  # would read short every time: never an eviction
            raise ValueError(f"chunk {name}: bytes {offset}..{offset + length} asked of its {size}")
        for _ in range(100):
            fd = self._open(name, size, fetch)
            data = bytearray(length)  # writable: the image's bytes go to torch without a copy
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                got = os.preadv(fd, [data], offset)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            if got == length:
                return data
            self._close(name)  # evicted (truncated to 0) since it was opened: fetch it again
        raise CacheFullError(
            f"chunk {name} was evicted from {self.directory} 100 times while being read: {self.key}="
            f"{self.limit} is too small for the processes reading at once; raise it"
        )

    def _open(self, name: str, size: int, fetch: Fetch) -> int:
        files = self._process_files()
        if name in files:
            files.move_to_end(name)
            fd, touched = files[name]
            if time.monotonic() - touched > TOUCH_EVERY:
                self._touch(name, fd)
            return fd
        path = os.path.join(self.directory, name)
        while True:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self._download(name, size, fetch)
                continue
            found = os.fstat(fd).st_size
            if found == size:
                break
            os.close(fd)  # evicted between open and check (truncated, not yet unlinked): look again
            # a chunk of that name but another size (another dataset's), or one left at 0 bytes (its evictor
            # killed before the unlink): never read, fetched again; an eviction in progress holds the lock,
            # and what is there once we hold it may be the chunk fetched again meanwhile (of its size): kept
            with self._locked(), contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_size != size:
                    _evict(path)
            time.sleep(WAIT)
        self._touch(name, fd)
        while len(files) >= OPEN_FILES:
            os.close(files.popitem(last=False)[1][0])
        return fd

    def _touch(self, name: str, fd: int) -> None:
        with contextlib.suppress(OSError):
            os.utime(fd)
        self._process_files()[name] = (fd, time.monotonic())

    def _close(self, name: str) -> None:
        entry = self._process_files().pop(name, None)
        if entry is not None:
            os.close(entry[0])

    def _process_files(self) -> collections.OrderedDict:
        if self._pid != os.getpid():  # never a descriptor inherited through fork
            self._files, self._pid = collections.OrderedDict(), os.getpid()
        return self._files

    # -- fetching --------------------------------------------------------------------------------------------
    def _download(self, name: str, size: int, fetch: Fetch) -> None:
        """Fetch chunk ``name`` into place, or return once another process has (or it is there already)."""
        path = os.path.join(self.directory, name)
        part = path + ".part"
        waited_for_room = None
        while True:
            with self._locked():
                if os.path.exists(path):
                    return
                if os.path.exists(part) and not _held(part):
                    _remove(part)  # its writer died
                if not os.path.exists(part):
                    if size > self.limit:
                        raise CacheFullError(
                            f"chunk {name} holds {size} bytes, more than {self.key}={self.limit}: raise the limit "
                            f"to at least a few chunks"
                        )
                    if self._make_room(size):
                        fd = os.open(part, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
                        fcntl.flock(fd, fcntl.LOCK_EX)
                        os.ftruncate(fd, size)  # the whole chunk is counted from the start
                        break
                    progress = self.fetched()["chunks"]
                    if waited_for_room is None or progress != waited_for_room[1]:
                        waited_for_room = (time.monotonic(), progress)  # others still fetch: room will come
                    if time.monotonic() - waited_for_room[0] > NO_ROOM_TIMEOUT:
                        raise CacheFullError(
                            f"no room for chunk {name} ({size} bytes) in {self.directory} for "
                            f"{NO_ROOM_TIMEOUT:.0f} s while no other chunk was fetched either: every chunk there is "
                            f"being read or downloaded; raise "
                            f"{self.key} (now {self.limit} bytes)"
                        )
            time.sleep(WAIT)  # another process downloads it, or holds the room
        try:
            with os.fdopen(os.dup(fd), "r+b") as f:
                out = _Bounded(f, size, name)
                fetch(out)
                if out.written != size:
                    raise OSError(f"chunk {name}: fetched {out.written} bytes, index.json says {size}")
            # on the disk before it has its name: after a power loss the name holds these bytes, never a
            # chunk-sized run of zeros that the rename outlived (a chunk carries no checksum to catch that)
            _sync(fd)
            with self._locked():
                os.rename(part, path)
                self._count(size)
        except BaseException as err:
            _remove(part)  # never read as whole: a complete chunk only ever appears by the rename
            if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheFullError(
                    f"no space left on the disk of {self.directory} for chunk {name} ({size} bytes): {self.key}="
                    f"{self.limit} is more than that disk holds; lower it, or free space there"
                ) from None
            raise
        finally:
            os.close(fd)

    def _make_room(self, size: int) -> bool:
        """Under the directory lock: evict unread complete chunks, least recently used first, until ``size``
        more bytes fit the limit."""
        used, chunks, parts = 0, [], []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    bytes_ = _size(entry)
                    used += bytes_
                    if entry.is_dir(follow_symlinks=False):  # an earlier layout's cache of a dataset
                        chunks.append((st.st_mtime_ns, entry.path, bytes_))  # aged out whole
                    elif entry.name.endswith(".part"):
                        parts.append((entry.path, st.st_size))
                    elif not entry.name.startswith("."):
                        chunks.append((st.st_mtime_ns, entry.path, st.st_size))
        for path, bytes_ in parts:
            if used + size <= self.limit:
                break
            # its writer died (SIGKILL): its chunk may not be wanted again for a long time
            if not _held(path):
                _remove(path)
                used -= bytes_
        for _, path, bytes_ in sorted(chunks):
            if used + size <= self.limit:
                break
            if _evict(path):
                used -= bytes_
        return used + size <= self.limit

    def usage(self) -> int:
        """Bytes in the directory now (complete chunks, downloads in progress, the cache's own files)."""
        total = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    total += _size(entry)
        return total

    def _count(self, size: int) -> None:
        stats = self.fetched()
        stats["chunks"] += 1
        stats["bytes"] += int(size)
        path = self._stats_path()
        with open(path + ".new", "w") as f:
            json.dump(stats, f)
        os.replace(path + ".new", path)

    def fetched(self) -> dict:
        """Chunks and bytes fetched into this cache since it was made."""
        try:
            with open(self._stats_path()) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return {"chunks": 0, "bytes": 0}

    def _stats_path(self) -> str:
        return os.path.normpath(self.directory) + ".stats"

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(os.path.join(self.directory, ".lock"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


class _Bounded:
    """A file object that refuses to grow past the chunk's size (a server that sends more breaks no bound)."""

    def __init__(self, f, size: int, name: str):
        self.f, self.size, self.name, self.written = f, size, name, 0

    def write(self, data) -> int:
        n = len(data)
        if self.written + n > self.size:
            raise OSError(f"chunk {self.name}: more bytes than index.json's {self.size}")
        self.f.write(data)
        self.written += n
        return n


def _locked_exclusively(path: str, flags: int) -> int | None:
    """A descriptor of ``path`` (opened with ``flags``) holding its exclusive lock, or None when the file is
    gone or another process holds a lock on it (a download's writer, a reader mid-read)."""
    try:
        fd = os.open(path, flags)
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


def _held(path: str) -> bool:
    """Whether a live process holds ``path``'s lock (a download's writer)."""
    fd = _locked_exclusively(path, os.O_RDONLY)
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


def _evict(path: str) -> bool:
    """Remove a complete chunk no process is reading: truncated first, so that its blocks are freed even
    where a process holds it open (that process sees 0 bytes and fetches it again)."""
    if os.path.islink(path):  # not a chunk of ours: the link goes, never the file it points at
        _remove(path)
        return True
    if os.path.isdir(path):  # an earlier layout's dataset cache
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.exists(path)
    fd = _locked_exclusively(path, os.O_RDWR)
    if fd is None:
        return False  # gone, or being read now
    try:
        os.ftruncate(fd, 0)
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _sync(fd: int) -> None:
    """The file's bytes on the disk; a file system that keeps nothing to sync (it refuses the call) is let be."""
    try:
        getattr(os, "fdatasync", os.fsync)(fd)  # fdatasync: Linux; fsync elsewhere
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)

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

A chunk's name is its cache name (``cache_room.NAME``: a 16-digit hex digest, ``-``, its file name, as
``cached_chunks.cache_name`` makes them). Only what the cache wrote is read or removed (``storage/cache_trust.py``):
the directory and ``<cache_dir>`` above it are this user's and no one else can write to them (feedline makes
them 0o700 whatever the umask; the rule of every cache directory, ``private_dirs``), and each file is checked to be this user's as it is opened (once per chunk open, never per sample), never
through a symlink. Anything else in the directory counts against the limit and is never read or removed.

The bound: a download is admitted, under the directory lock, only when the sizes of every file in the
directory plus its own fit ``limit``; to make room, complete chunks not being read are evicted, least recently
used first (``storage/cache_room.py``). Readers take ``LOCK_SH`` on a chunk for the read only (``read``: one
``pread``), after checking its size: a chunk evicted since it was opened reads as 0 bytes and is fetched
again. Nothing is memory-mapped: a map of an evicted chunk would hold its blocks (or fault); a sample's bytes
are one ``pread``, a copy of an encoded image.

What a download holds: its size is index.json's, and where the dataset records the chunk's digest
(``feedline.json``), its bytes are hashed as they are written and a chunk whose digest differs is removed
unpublished (``DigestError``): one replaced in the bucket by another of the same size and labels, or damaged
in transit, is never read.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from typing import BinaryIO

from feedline.storage import cache_trust
from feedline.storage.cache_room import evict, foreign, held, is_chunk, make_room, remove, remove_own, usage
from feedline.storage.cache_stats import fetched, record_fetch
from feedline.storage.cache_trust import open_own, private_dirs
from feedline.storage.chunk_write import BoundedWriter, CacheFullError, DigestError, sync

OPEN_FILES = 64  # chunk descriptors kept open per process (no lock is held between reads)
WAIT = 0.02  # seconds between looks while another process downloads a chunk or holds the room
NO_ROOM_TIMEOUT = 300.0  # seconds without room before the limit is named as too small
TOUCH_EVERY = 1.0  # seconds: a chunk's use time (its mtime, the eviction order) is refreshed at most so often

Fetch = Callable[[BinaryIO], None]  # writes the chunk's bytes to the file object given
Digest = tuple[str, str] | None  # (algorithm, hex digest) a chunk's dataset records for it, if any


class ChunkCache:
    """Chunks of one dataset in ``directory``, at most ``limit`` bytes on disk (``key`` names the setting in
    errors). ``read(name, size, offset, length, fetch)`` returns bytes of a chunk, fetching it first when it
    is not here. Pickles as its settings; descriptors are opened in the process that reads."""

    def __init__(self, directory: str, limit: int, key: str = "source.cache_limit"):
        self.directory, self.limit, self.key = str(directory), int(limit), key
        self.setting = f"{key.rsplit('.', 1)[0]}.cache_dir (or paths.cache_dir, FEEDLINE_CACHE_DIR)"
        try:
            # it and <cache_dir> above it: the rule of every cache directory, before any file in it is trusted
            base, name = os.path.split(os.path.normpath(self.directory))
            private_dirs(base, [name], self.setting)
            os.close(open_own(os.path.join(self.directory, ".lock"), os.O_CREAT | os.O_RDWR, self.setting)[0])
            self.fetched()  # a stats file of another user's is named now, not mid-run
        except cache_trust.UntrustedCacheError:
            raise
        except OSError as err:  # a read-only mount, another user's directory: named before any work
            raise OSError(
                err.errno,
                f"cannot make the chunk cache {self.directory}: {err.strerror}; point {self.setting} at a "
                f"writable directory",
            ) from None
        self._files: collections.OrderedDict | None = None
        self._pid = None

    def __getstate__(self):
        return self.directory, self.limit, self.key

    def __setstate__(self, state):
        self.__init__(*state)

    # -- reading ---------------------------------------------------------------------------------------------
    def read(
        self, name: str, size: int, offset: int, length: int, fetch: Fetch, digest: Digest = None
    ) -> bytearray:
        """``length`` bytes at ``offset`` of chunk ``name`` (``size`` bytes whole). ``digest``: the (algorithm,
        hex digest) its dataset records, which a download must match before it is published (``DigestError``)."""
        if not is_chunk(name):
            raise ValueError(f"{name!r} is not a chunk cache name (a 16-digit hex digest, '-', a file name)")
        if not 0 <= offset <= offset + length <= size:  # would read short every time: never an eviction
            raise ValueError(f"chunk {name}: bytes {offset}..{offset + length} asked of its {size}")
        for _ in range(100):
            fd = self._open(name, size, fetch, digest)
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

    def _open(self, name: str, size: int, fetch: Fetch, digest: Digest) -> int:
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
                fd, st = open_own(path, os.O_RDONLY, self.setting)  # another user's file: refused
            except FileNotFoundError:
                self._download(name, size, fetch, digest)
                continue
            found = st.st_size
            if found == size:
                break
            os.close(fd)  # evicted between open and check (truncated, not yet unlinked): look again
            # a chunk of that name but another size (another dataset's), or one left at 0 bytes (its evictor
            # killed before the unlink): never read, fetched again; an eviction in progress holds the lock,
            # and what is there once we hold it may be the chunk fetched again meanwhile (of its size): kept
            with self._locked(), contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_size != size:
                    evict(path)
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
    def _download(self, name: str, size: int, fetch: Fetch, digest: Digest) -> None:
        """Fetch chunk ``name`` into place, or return once another process has (or it is there already). Its
        bytes are hashed as they are written (in order, across a resumed body too: ``stores.S3Store.fetch``
        writes each byte once), and a chunk whose digest is not ``digest`` is never published."""
        path = os.path.join(self.directory, name)
        part = path + ".part"
        waited_for_room = None
        while True:
            with self._locked():
                if os.path.lexists(path):
                    return  # opened (and its owner checked) by the caller
                if os.path.lexists(part) and not held(part):
                    self._remove_dead(part)  # its writer died
                if not os.path.lexists(part):
                    if size > self.limit:
                        raise CacheFullError(
                            f"chunk {name} holds {size} bytes, more than {self.key}={self.limit}: raise the limit "
                            f"to at least a few chunks"
                        )
                    if make_room(self.directory, self.limit, size):
                        fd, _ = open_own(part, os.O_CREAT | os.O_EXCL | os.O_RDWR, self.setting)
                        fcntl.flock(fd, fcntl.LOCK_EX)
                        os.ftruncate(fd, size)  # the whole chunk is counted from the start
                        break
                    self._check_foreign(name, size)  # room that waiting never frees: said at once
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
                out = BoundedWriter(f, size, name, digest[0] if digest else None)
                fetch(out)
                if out.written != size:
                    raise OSError(f"chunk {name}: fetched {out.written} bytes, index.json says {size}")
                if digest and out.hash.hexdigest() != digest[1]:
                    raise DigestError(name, digest[0], digest[1], out.hash.hexdigest())
            # on the disk before it has its name: after a power loss the name holds these bytes, never a
            # chunk-sized run of zeros that the rename outlived (a digest is checked only as a chunk arrives)
            sync(fd)
            with self._locked():
                os.rename(part, path)
                self._count(size)
        except BaseException as err:
            remove(part)  # never read as whole: a complete chunk only ever appears by the rename
            if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheFullError(
                    f"no space left on the disk of {self.directory} for chunk {name} ({size} bytes): {self.key}="
                    f"{self.limit} is more than that disk holds; lower it, or free space there"
                ) from None
            raise
        finally:
            os.close(fd)

    def _check_foreign(self, name: str, size: int) -> None:
        """``CacheFullError`` naming the files the cache did not write (never evicted) where they leave no
        room for ``size`` more bytes under the limit, whatever the cache's own chunks do."""
        others = foreign(self.directory)
        taken = sum(bytes_ for _, bytes_ in others)
        if taken + size > self.limit:
            shown = ", ".join(f"{path} ({bytes_} bytes)" for path, bytes_ in others[:3])
            raise CacheFullError(
                f"no room for chunk {name} ({size} bytes) in {self.directory}: files the cache did not write "
                f"take {taken} of {self.key}={self.limit} bytes ({shown}{' ...' if len(others) > 3 else ''}); "
                f"the cache never removes them: move them out, raise {self.key}, or set source.cache_dir to a "
                f"directory of the cache's own"
            )

    def usage(self) -> int:
        """Bytes in the directory now (complete chunks, downloads in progress, the cache's own files)."""
        return usage(self.directory)

    def _count(self, size: int) -> None:
        record_fetch(self.directory, size, self.setting)

    def fetched(self) -> dict:
        """Chunks and bytes fetched into this cache since it was made."""
        return fetched(self.directory, self.setting)

    def _remove_dead(self, part: str) -> None:
        """A dead writer's download, removed; one the cache did not write is named, never removed."""
        if remove_own(part):
            return
        os.close(open_own(part, os.O_RDONLY, self.setting)[0])  # another user's, or a symlink: raises
        raise cache_trust.UntrustedCacheError(
            f"the cache file {part} is not a file the cache wrote: remove it, or set {self.setting} to a "
            f"directory of your own"
        )

    @contextlib.contextmanager
    def _locked(self):
        fd, _ = open_own(os.path.join(self.directory, ".lock"), os.O_CREAT | os.O_RDWR, self.setting)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

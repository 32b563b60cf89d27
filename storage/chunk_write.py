"""Writing one chunk into the cache: never past its size, hashed as it is written, on the disk before it is
named; and the errors a download ends in."""

from __future__ import annotations

import errno
import hashlib
import os


class CacheFullError(RuntimeError):
    """No room can be made: every chunk in the cache is being read or downloaded."""


class DigestError(RuntimeError):
    """A chunk's fetched bytes are not those its dataset records (their digest differs): nothing was published.
    ``expected``, ``got``: the hex digests; the caller names the chunk by its URL."""

    def __init__(self, name: str, algorithm: str, expected: str, got: str):
        super().__init__(f"chunk {name}: its {algorithm} is {got}, its dataset records {expected}")
        self.algorithm, self.expected, self.got = algorithm, expected, got


class BoundedWriter:
    """A file object that refuses to grow past the chunk's size (a server that sends more breaks no bound),
    and hashes what is written through it with ``algorithm`` (none: no hash), in the same pass."""

    def __init__(self, f, size: int, name: str, algorithm: str | None = None):
        self.f, self.size, self.name, self.written = f, size, name, 0
        self.hash = hashlib.new(algorithm) if algorithm else None

    def write(self, data) -> int:
        n = len(data)
        if self.written + n > self.size:
            raise OSError(f"chunk {self.name}: more bytes than index.json's {self.size}")
        self.f.write(data)
        if self.hash is not None:
            self.hash.update(data)
        self.written += n
        return n


def sync(fd: int) -> None:
    """The file's bytes on the disk; a file system that keeps nothing to sync (it refuses the call) is let be."""
    try:
        getattr(os, "fdatasync", os.fsync)(fd)  # fdatasync: Linux; fsync elsewhere
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise

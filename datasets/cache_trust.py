"""Who may have written a cache's files: only the user the run is, or the cache is not read.

A cache is read as the truth about a dataset: a chunk there is read as the chunk its name digests (endpoint,
URL, conversion, ETag: names anyone who can list the bucket can compute). So a directory another user can
write to is refused, naming it and the fix, and so is a file in it of another owner:

- the directory: owned by this process's user (``os.geteuid()``, root included), and writable by no one
  else (no group or other write bit; a sticky bit does not help: others could still create the names
  first). feedline makes the directory it keeps its files in with mode 0o700 whatever the umask (a narrower
  umask narrows it further), so a directory it made passes; one made otherwise is named with
  ``chmod 700 DIR``.
- a file: its owner checked once it is open (``fstat``, once per open, never per sample); the cache never
  reads, truncates or deletes a file of another owner, nor follows a symlink (``O_NOFOLLOW``).

The folders above the directory are not checked: whoever could swap the directory for another still cannot
make its files this user's, and each file is checked as it is opened.
"""

from __future__ import annotations

import errno
import os
import stat

PRIVATE = 0o700  # the directories feedline makes for a cache
FILE_MODE = 0o600  # the files it writes there: the data of a private bucket stays private on a shared node


class UntrustedCacheError(PermissionError):
    """A cache directory or file that another user can write to, or did write."""


def owner(st: os.stat_result) -> int:
    """The owner's uid of what ``st`` describes (a seam: tests not run as root cannot chown)."""
    return st.st_uid


def mine(st: os.stat_result) -> bool:
    return owner(st) == os.geteuid()


def make_private(directory: str) -> None:
    """``directory`` (and any folder above it that is missing), the last with mode 0o700."""
    os.makedirs(directory, mode=PRIVATE, exist_ok=True)


def check_directory(directory: str, setting: str) -> None:
    """Refuse a cache directory another user owns or can write to, naming it and the fix (``setting``: the
    config key that moves the cache)."""
    st = os.stat(directory)
    elsewhere = f"set {setting} to a directory of your own"
    if not mine(st):
        raise UntrustedCacheError(
            f"the cache {directory} belongs to uid {owner(st)}, not to this run's uid {os.geteuid()}: what another "
            f"user wrote there would be read as the dataset's, so it is never used; {elsewhere}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCacheError(
            f"the cache {directory} can be written by other users (mode {stat.S_IMODE(st.st_mode):#o}): what they "
            f"put there would be read as the dataset's, so it is never used; run chmod 700 {directory}, or "
            f"{elsewhere}"
        )


def check_file(fd: int, path: str, setting: str) -> os.stat_result:
    """The ``fstat`` of the open cache file ``path``; ``UntrustedCacheError`` where another user owns it."""
    st = os.fstat(fd)
    if not mine(st):
        raise UntrustedCacheError(
            f"the cache file {path} belongs to uid {owner(st)}, not to this run's uid {os.geteuid()}: a cache "
            f"never reads or deletes a file it did not write; remove it (as its owner or root), or set {setting} to "
            f"a directory of your own"
        )
    return st


def open_own(path: str, flags: int, setting: str) -> tuple[int, os.stat_result]:
    """``path`` opened (never through a symlink; created with mode 0o600) and its ``fstat``, once its owner
    is this user."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, FILE_MODE)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UntrustedCacheError(
                f"the cache file {path} is a symlink: a cache never reads through a link it did not make; remove "
                f"it, or set {setting} to a directory of your own"
            ) from None
        raise
    try:
        return fd, check_file(fd, path, setting)
    except BaseException:
        os.close(fd)
        raise

"""Who may have written a cache's files: only the user the run is, or the cache is not read.

A cache is read as the truth about a dataset: a chunk there is read as the chunk its name digests (endpoint,
URL, conversion, ETag: names anyone who can list the bucket can compute), an index's paths and labels as the
tree's. So every cache directory feedline makes and reads (``<cache_dir>``, ``<cache_dir>/chunks``,
``<cache_dir>/<kind>/<name>-<digest>``) is checked by one function, ``private_dirs``, which both caches call
(``storage/chunk_cache.py``, ``cache.cache_path``), and a file in them of another owner is refused:

- a directory: owned by this process's user (``os.geteuid()``, root included), and writable by no one
  else: no other write bit (a sticky bit does not help: others could still create the names first), and no
  group write bit unless the group is the user's own private group (named as the user, its primary group,
  no other member: Debian's and Ubuntu's default, whose umask 002 makes every new folder group-writable;
  OpenSSH's Debian patch allows the same). feedline makes the directories it keeps its files in with mode 0o700 whatever the umask (a
  narrower umask narrows them further), so a directory it made passes; one made otherwise is named with
  ``chmod 700 DIR``. The folders feedline makes under ``<cache_dir>`` are never followed where they are a
  symlink (another user could point one at files of their choosing); ``<cache_dir>`` itself is the user's
  own choice and may be a link (to a larger disk).
- a file: the chunk cache checks its owner once it is open (``fstat``, once per open, never per sample), never
  through a symlink (``O_NOFOLLOW``); the index caches check every file of a cache directory when the
  directory is looked up (``check_entries``: one ``lstat`` each, at start-up), as no one else can add one
  to a directory that passed. A cache never reads, truncates or deletes a file of another owner.

The folders above ``<cache_dir>`` are not checked: whoever could swap it for another still cannot make its
files this user's, and each file is checked before it is read.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
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


def shared_group(gid: int) -> bool:
    """Whether users other than this one may be in group ``gid``: anything but the user's private group
    (named as the user, the user's primary group, no member listed but the user). Unknown: shared."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(os.geteuid())
    except KeyError:
        return True
    return not (group.gr_name == user.pw_name and gid == user.pw_gid and set(group.gr_mem) <= {user.pw_name})


def make_private(directory: str) -> None:
    """``directory`` (and any folder above it that is missing), the last with mode 0o700."""
    os.makedirs(directory, mode=PRIVATE, exist_ok=True)


def private_dirs(base: str, below, setting: str) -> str:
    """``base`` and the folders ``below`` it, one in the other (``base/below[0]/below[1]/...``), each made
    where it is missing (mode 0o700) and checked (``check_directory``): the one rule for every cache
    directory. ``base`` (``<cache_dir>``) may be a symlink; the folders below never are. Returns the last.
    A few ``stat`` calls: made once per source at start-up, never per sample."""
    make_private(base)
    check_directory(base, setting, follow=True)
    path = base
    for name in below:
        path = os.path.join(path, name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, PRIVATE)
        check_directory(path, setting)
    return path


def check_directory(directory: str, setting: str, follow: bool = False) -> None:
    """Refuse a cache directory another user owns or can write to, or (unless ``follow``) a symlink in its
    place, naming it and the fix (``setting``: the config key that moves the cache)."""
    st = os.stat(directory) if follow else os.lstat(directory)
    elsewhere = f"set {setting} to a directory of your own"
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedCacheError(
            f"the cache {directory} is a symlink: feedline makes its cache folders itself and never follows a "
            f"link in their place (it could lead to files of another user's choosing); remove it, or {elsewhere}"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(
            errno.ENOTDIR, f"the cache {directory} is not a directory: remove it, or {elsewhere}"
        )
    if not mine(st):
        raise UntrustedCacheError(
            f"the cache {directory} belongs to uid {owner(st)}, not to this run's uid {os.geteuid()}: what another "
            f"user wrote there would be read as the dataset's, so it is never used; {elsewhere}"
        )
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and shared_group(st.st_gid)):
        raise UntrustedCacheError(
            f"the cache {directory} can be written by other users (mode {stat.S_IMODE(st.st_mode):#o}): what they "
            f"put there would be read as the dataset's, so it is never used; run chmod 700 {directory}, or "
            f"{elsewhere}"
        )


def check_entries(directory: str, setting: str) -> None:
    """Where ``directory`` is there: the directory (``check_directory``) and every entry in it, refusing a
    symlink or an entry of another owner by name. One ``lstat`` per entry (an index cache holds a few)."""
    try:
        check_directory(directory, setting)
    except FileNotFoundError:
        return  # not made yet: it will be, by this user (its parent passed)
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # a temporary renamed into place meanwhile
            if stat.S_ISLNK(st.st_mode):
                raise _symlink(entry.path, setting)
            if not mine(st):
                raise _foreign(entry.path, st, setting)


def _foreign(path: str, st: os.stat_result, setting: str) -> UntrustedCacheError:
    return UntrustedCacheError(
        f"the cache file {path} belongs to uid {owner(st)}, not to this run's uid {os.geteuid()}: a cache "
        f"never reads or deletes a file it did not write; remove it (as its owner or root), or set {setting} to "
        f"a directory of your own"
    )


def _symlink(path: str, setting: str) -> UntrustedCacheError:
    return UntrustedCacheError(
        f"the cache file {path} is a symlink: a cache never reads through a link it did not make; remove "
        f"it, or set {setting} to a directory of your own"
    )


def check_file(fd: int, path: str, setting: str) -> os.stat_result:
    """The ``fstat`` of the open cache file ``path``; ``UntrustedCacheError`` where another user owns it."""
    st = os.fstat(fd)
    if not mine(st):
        raise _foreign(path, st, setting)
    return st


def open_own(path: str, flags: int, setting: str) -> tuple[int, os.stat_result]:
    """``path`` opened (never through a symlink; created with mode 0o600) and its ``fstat``, once its owner
    is this user."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, FILE_MODE)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _symlink(path, setting) from None
        raise
    try:
        return fd, check_file(fd, path, setting)
    except BaseException:
        os.close(fd)
        raise

"""One writer per output: a lock file beside it (``<output>.lock``), held for the whole write.

A second conversion (or layout) to the same output is refused before it touches anything, and names the
writer it found: it must not truncate the first one's scratch files, nor remove them when it fails. The
lock is ``flock`` on the lock file, so the kernel releases it when its holder dies, ``kill -9`` included,
and a lock file a dead writer left behind is simply taken over. The file records who holds it, for the
message. Sources that write their files on first use (``writers/derived.py``) wait for the writer instead,
then read what it wrote.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class OutputBusyError(OSError):
    """Another process is writing the same output."""


@contextlib.contextmanager
def writer_lock(output: str, what: str, key: str, wait: bool = False):
    """Hold ``<output>.lock`` while the body writes ``output``. Held by another process: ``OutputBusyError``
    naming it and ``key`` (``wait=False``), or wait for it (``wait=True``)."""
    path = output.rstrip(os.sep) + ".lock"
    fd = _acquire(path, output, what, key, wait)
    try:
        os.ftruncate(fd, 0)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.write(fd, json.dumps(holder).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)  # while still held: a process that opened it meanwhile sees it gone and retries
        os.close(fd)


def _acquire(path: str, output: str, what: str, key: str, wait: bool) -> int:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    while True:
        fd = _open(path, output, key)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            if not wait:
                os.close(fd)
                raise OutputBusyError(
                    f"another {what} is writing {output} ({holder}): {key}={output} is taken until it "
                    f"finishes. Wait for it, or set {key} to another path"
                ) from None
            log.info("waiting for the %s writing %s (%s) to finish", what, output, holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_file(fd, path):  # not a lock file its last holder removed as we opened it
            return fd
        os.close(fd)


def _open(path: str, output: str, key: str) -> int:
    """The lock file, never through a symlink (one planted beside a shared output would have its target
    truncated and written over)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            why = "is a symlink, never followed"
        elif err.errno in (errno.EACCES, errno.EPERM):
            why = "belongs to another user, who may be writing the same output"
        else:
            raise
        raise OutputBusyError(
            f"the lock file {path} of {output} {why}: {key}={output} cannot be locked; remove it if it is not "
            f"yours and no one writes there, or set {key} to another path",
        ) from None


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"

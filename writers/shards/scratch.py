"""This machine's side of a conversion: its lock, and for a URL the scratch folder the dataset is written in.

    <out.path>.lock                                   a local output's lock (``writers/lock.py``)
    $TMPDIR/feedline-upload-<digest of the URL>.lock  a URL's lock: one conversion to it at a time here
    $TMPDIR/feedline-upload-<digest>.scratch-<pid>-<random>/
                                                      a URL's dataset, written whole, then uploaded

A scratch folder is made afresh (``tempfile.mkdtemp``: mode 0o700, a name no one else can take first), so a
folder of that name made by another user is never written into, and it is removed once the upload ends,
however it ends. A killed conversion's scratch folder (its process gone) is removed by the next conversion to
that URL, and only where it is this user's own folder, never a symlink.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shutil
import stat
import tempfile

from feedline.storage.cache_trust import mine
from feedline.storage.stores import is_url
from feedline.writers.lock import OutputBusyError, writer_lock


@contextlib.contextmanager
def scratch_folder(url: str):
    """A new private folder under the temp dir to write ``url``'s dataset in, removed on the way out; a
    killed conversion's copy is removed first."""
    # named for the URL and this process, and made afresh (mode 0o700, a name no one else can take first: a
    # folder of that name made by another user is never written into); a killed conversion's copy (its
    # process gone) is found and removed by the next one, only where it is this user's
    stem = f"{lock_path(url)}.scratch-"
    for stale in glob.glob(f"{glob.escape(stem)}*"):
        if not _alive(stale[len(stem) :].split("-", 1)[0]) and _own_folder(stale):
            shutil.rmtree(stale, ignore_errors=True)
    scratch = tempfile.mkdtemp(prefix=f"{os.path.basename(stem)}{os.getpid()}-", dir=os.path.dirname(stem))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def lock_path(url: str) -> str:
    """The local lock file of a conversion to ``url`` (under the temp dir); its scratch copies sit beside it."""
    return os.path.join(
        tempfile.gettempdir(), f"feedline-upload-{hashlib.blake2b(url.encode(), digest_size=8).hexdigest()}"
    )


def _own_folder(path: str) -> bool:
    """Whether ``path`` is a folder of this user's (not a symlink): a scratch copy a conversion of ours made."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and mine(st)


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def locked(target: str, lock: bool):
    """One conversion at a time per output (on this machine, for a URL: a lock file under the temp dir). A
    URL that is taken is refused naming the URL the user gave, the scratch lock only as a detail."""
    url = target if is_url(target) else None
    with contextlib.ExitStack() as stack:
        if lock:
            try:
                stack.enter_context(writer_lock(lock_path(url) if url else target, "conversion", "out.path"))
            except OutputBusyError as err:
                if url is None:
                    raise
                raise OutputBusyError(_busy(url, str(err))) from None
        yield


def _busy(url: str, said: str) -> str:
    where = f"{lock_path(url)}.lock"
    found = re.search(r"\((pid [^()]*|a process that has not written its name yet)\)", said)
    if found is None:  # the lock file itself cannot be used (a symlink, another user's)
        return f"out.path={url} cannot be locked on this machine: {said}"
    return (
        f"another conversion is writing {url} ({found.group(1)}): out.path={url} is taken until it finishes. "
        f"Wait for it, or set out.path to another URL (its lock on this machine: {where}; the lock is per "
        "machine, a conversion to the same URL from another machine is not seen)"
    )

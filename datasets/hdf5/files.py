"""Opening an HDF5 file in the process that reads it, and making sure it is the file the run inspected.

What the run knows of a file (its row offsets, its labels, cached beside the split arrays) is read once, in
the main process, when the source is built. Every later open (each DataLoader worker, a new epoch's workers,
``trainer.test`` after fit) checks that the path still names that file: the same inode, size and
modification time, taken from the open descriptor itself, so nothing can swap the file between the check
and the read. A file replaced in the meantime (``convert.py`` renames its new file into place) or written
to stops the run with ``HDF5FileChanged``, naming it: reading the new rows under the old labels and offsets
would be silently wrong data. A process that already has the file open or mapped keeps reading the file it
opened, which the kernel keeps whole until it closes it.
"""

from __future__ import annotations

import errno
import os
import time

import h5py
import numpy as np


class HDF5FileError(ValueError):
    """The file as a whole cannot be read as the run first read it (replaced, changed, locked by a writer).
    Not a bad sample: every row of it would be, so the run stops with this, naming the file."""


def identity(fd: int) -> tuple[int, int, int]:
    """(inode, size, mtime in ns) of an open file: what says it is still the file the run inspected."""
    st = os.fstat(fd)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _describe(ident) -> str:
    ino, size, mtime_ns = ident
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime_ns / 1e9))
    return f"inode {ino}, {size} bytes, modified {when}"


def check_identity(path: str, key: str, expected, found) -> None:
    if expected is None or tuple(expected) == tuple(found):
        return
    how = "replaced by another file" if expected[0] != found[0] else "written to"
    raise HDF5FileError(
        f"{key} '{path}' was {how} while this run read it (when the run started: {_describe(expected)}; now: "
        f"{_describe(found)}). The run's labels and row offsets are those of the file it started with, so it "
        f"stops rather than read the new rows under them. Restart the run to read the new file from the "
        f"start; to convert while a run reads the old file, write to another out.path"
    )


def check_path(path: str, key: str, expected) -> None:
    """That ``path`` still names the file the run inspected (``expected``), before it is opened again."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _removed(path, key) from None
    check_identity(path, key, expected, (st.st_ino, st.st_size, st.st_mtime_ns))


def open_hdf5(path: str, key: str = "source.path", expected=None) -> h5py.File:
    """``path`` opened read-only, checked against ``expected`` (an ``identity``; None: not checked), or an
    error that names ``key`` and says what is wrong: missing, locked by a writer, not HDF5, changed."""
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        if expected is not None:
            raise _removed(path, key) from None
        raise FileNotFoundError(f"{key} '{path}' does not exist (set {key}=... or check the path)") from None
    except OSError as err:
        first = str(err).splitlines()[0]
        if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK) or "unable to lock file" in first:
            raise HDF5FileError(
                f"{key} '{path}' is locked: another program has it open for writing ({first}). Wait until "
                f"that program has finished and closed it, or read a copy made after it has. Only if the file "
                f"is complete and merely held open (a viewer, a notebook), set HDF5_USE_FILE_LOCKING=FALSE"
            ) from None
        raise OSError(
            f"{key} '{path}' cannot be read as HDF5 ({first}): the file is truncated, damaged or not HDF5, or "
            f"a program is still writing it without file locking. If convert.py wrote it, convert it again; "
            f"otherwise get a whole copy from where it came from"
        ) from None
    try:
        check_identity(path, key, expected, identity(f.id.get_vfd_handle()))
    except BaseException:
        f.close()
        raise
    return f


def map_array(path: str, mapped: tuple, mode: str, key: str = "source.path", expected=None) -> np.ndarray:
    """A contiguous dataset as a plain ndarray over the file's pages, checked against ``expected``. Mode
    "c": copy-on-write pages, so rows are writable views (torch takes them without a copy or a warning) that
    stay shared page cache unless something writes to them. A plain ndarray view: numpy.memmap's per-row
    subclass bookkeeping cost more than the read itself."""
    offset, shape, dtype = mapped
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the map holds the file it was made from
    except FileNotFoundError:
        raise _removed(path, key) from None
    with f:
        check_identity(path, key, expected, identity(f.fileno()))
        return np.memmap(f, dtype=np.dtype(dtype), mode=mode, offset=offset, shape=shape).view(np.ndarray)


def _removed(path: str, key: str) -> HDF5FileError:
    return HDF5FileError(
        f"{key} '{path}' was removed while this run read it: put the file back (or restart the run with "
        f"{key} set to where it is now)"
    )

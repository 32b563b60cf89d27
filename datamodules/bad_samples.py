"""The bad-sample budget: which samples of a split turned out unreadable, shared by every worker.

One bit per sample, set by whichever worker found the sample bad, and a count of the bits set. It makes each
bad file logged once per run, whichever worker or substitution met it first, and it bounds how much of a split
may be bad: ``data.max_bad_fraction`` of its samples (at least one). A few hundred truncated files among a
million train on; a split that is mostly bad stops with a summary instead of training on what is left.

Shared, the bits live in an unlinked file in /dev/shm, sized with ``ftruncate`` and never written before a
sample turns out bad: a page of it costs memory only once a bit in it is set, so the budget of a billion
samples costs a few pages, not a gigabyte per rank. Its first 8 bytes count the bits set, so the count is one
read. Writes take a lock on the file (``lockf``), so two workers never lose each other's bit or count. Forked
workers inherit the map; spawned ones receive the file's descriptor (as torch sends a shared tensor's), and
the file goes away with the last process that holds it, whatever way the run ends.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import tempfile
import threading
import weakref
from contextlib import contextmanager
from multiprocessing.reduction import DupFd, ForkingPickler

import numpy as np

log = logging.getLogger(__name__)

_COUNT = 8  # bytes before the bits: the number of bits set, little-endian
_SHM = "/dev/shm"


class BadSampleError(RuntimeError):
    """A sample could not be read or decoded (the message names its path), or too many could not."""


def check_max_bad_fraction(value) -> float:
    fraction = float(value)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"data.max_bad_fraction={value} must be in [0, 1] (0: stop at the first bad sample)")
    return fraction


class BadSamples:
    """The bad samples of a split. ``shared=True`` puts them in shared memory before the workers start (the
    datamodule does that per loader), so every worker and the main process see one set; else they are this
    process's own (a set of indices)."""

    def __init__(self, size: int, max_fraction: float, shared: bool = False):
        self.size = int(size)
        self.max_fraction = check_max_bad_fraction(max_fraction)
        self.allowed = max(1, int(self.max_fraction * self.size)) if self.max_fraction > 0 else 0
        self.seen_here: list[str] = []  # paths this process found bad, for the summary
        self._own: set[int] = set()  # unshared: the indices found bad
        self._bits: _SharedBits | None = _SharedBits.create(self.size) if shared else None

    @property
    def shared(self) -> bool:
        return self._bits is not None

    @property
    def count(self) -> int:
        return self._bits.count() if self._bits is not None else len(self._own)

    def flagged(self) -> list[int]:
        """The indices found bad, in order (shared: read where the file holds data, not bit by bit)."""
        return self._bits.flagged() if self._bits is not None else sorted(self._own)

    def found(self, i: int, path: str, err: Exception) -> None:
        """Record sample ``i`` as bad: logged the first time any process finds it; BadSampleError, with a
        summary, once the split holds more bad samples than its budget."""
        if not 0 <= i < max(self.size, 1):
            raise IndexError(f"sample {i} is outside the split's {self.size}")
        if self._bits is not None:
            new, count = self._bits.set(i)
        else:
            new = i not in self._own
            self._own.add(i)
            count = len(self._own)
        if new:
            self.seen_here.append(path)
            log.warning("skipping bad sample %s: %s", path, err)
        if count > self.allowed:
            shown = ", ".join(self.seen_here[:5])
            raise BadSampleError(
                f"{count} of {self.size} samples are unreadable, more than data.max_bad_fraction="
                f"{self.max_fraction:g} allows ({self.allowed}); found here: {shown}"
                f"{' ...' if len(self.seen_here) > 5 else ''} (each was logged as it was found, with why). Check "
                "the data; when the reasons are alike (a mask value beyond the class list, a field of the wrong "
                "kind), check the config that declares the fields first: skipping would drop every such "
                "sample. Else raise data.max_bad_fraction"
            )

    def __getstate__(self):
        """Plain pickling (``copy.deepcopy``, ``pickle.dumps``) makes this process's own copy of the bad samples
        found so far; a worker's pickling (``ForkingPickler``) shares them (``_reduce_shared``)."""
        state = dict(self.__dict__)
        if self._bits is not None:
            state["_own"], state["_bits"] = set(self._bits.flagged()), None
        return state


def _reduce_shared(bad: BadSamples):
    if bad._bits is None:
        return _rebuild_own, (bad.__getstate__(),)
    bits = bad._bits
    return _rebuild_shared, (bad.size, bad.max_fraction, DupFd(bits.fd), bits.length)


def _rebuild_own(state: dict) -> BadSamples:
    bad = BadSamples.__new__(BadSamples)
    bad.__dict__.update(state)
    return bad


def _rebuild_shared(size: int, max_fraction: float, fd, length: int) -> BadSamples:
    bad = BadSamples(size, max_fraction)
    bad._bits = _SharedBits(fd.detach(), length)
    return bad


ForkingPickler.register(BadSamples, _reduce_shared)  # what DataLoader workers and queues pickle with


class _SharedBits:
    """A count and one bit per sample in a shared, unlinked file; set under a lock on the file."""

    def __init__(self, fd: int, length: int):
        self.fd, self.length = fd, length
        self.map = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._pid, self._thread_lock = os.getpid(), threading.Lock()
        weakref.finalize(self, _close, self.map, fd)

    @classmethod
    def create(cls, size: int) -> _SharedBits:
        where = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else None
        with tempfile.TemporaryFile(dir=where, prefix="feedline-bad-") as f:  # unlinked already
            fd = os.dup(f.fileno())
        length = _COUNT + max(1, -(-size // 8))
        os.ftruncate(fd, length)  # a hole: pages cost memory once written
        return cls(fd, length)

    @contextmanager
    def _locked(self):
        """This process's threads, then the other processes: ``lockf`` on the count's first byte, which stands
        for the whole file (a file lock is per process, so the threads of one need their own)."""
        if self._pid != os.getpid():  # a forked worker: a thread lock of its own
            self._pid, self._thread_lock = os.getpid(), threading.Lock()
        with self._thread_lock:
            fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)
            try:
                yield
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)

    def count(self) -> int:
        with self._locked():
            return int.from_bytes(self.map[:_COUNT], "little")

    def set(self, i: int) -> tuple[bool, int]:
        """Set bit ``i``: (whether it was clear, the count after)."""
        at, bit = _COUNT + i // 8, 1 << (i % 8)
        with self._locked():
            count = int.from_bytes(self.map[:_COUNT], "little")
            new = not self.map[at] & bit
            if new:
                self.map[at] |= bit
                count += 1
                self.map[:_COUNT] = count.to_bytes(_COUNT, "little")
            return new, count

    def flagged(self) -> list[int]:
        """The bits set, read only where the file holds data (``SEEK_DATA``): O(bad pages), not O(samples)."""
        found, offset = [], _COUNT
        while offset < self.length:
            try:
                start = os.lseek(self.fd, offset, getattr(os, "SEEK_DATA", os.SEEK_SET))
                stop = min(os.lseek(self.fd, start, getattr(os, "SEEK_HOLE", os.SEEK_END)), self.length)
            except OSError:  # ENXIO: no data after offset
                break
            for a in range(start, stop, 1 << 20):
                block = np.frombuffer(os.pread(self.fd, min(1 << 20, stop - a), a), dtype=np.uint8)
                bits = np.flatnonzero(np.unpackbits(block, bitorder="little"))
                found.extend(int(b) + 8 * (a - _COUNT) for b in bits)
            offset = max(stop, offset + 1)
        return found


def _close(map: mmap.mmap, fd: int) -> None:
    try:
        map.close()
    finally:
        os.close(fd)

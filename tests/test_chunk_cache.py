"""The chunk cache (storage/chunk_cache.py): fetched once per node, never above its limit on disk, a chunk
being read never evicted, a killed or failed download never read as whole. Its fetch is a function here;
the object-storage tests run it against a real S3 server."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import threading
import time

import pytest

from feedline.storage import chunk_cache
from feedline.storage.chunk_cache import CacheFullError, ChunkCache

SIZE = 1000


def key(name: str) -> str:
    """A cache name (``chunk_cache.NAME``) for a short one: the digest part all zeros."""
    return f"{0:016x}-{name}"


A, B, C, D = (key(n) for n in "abcd")


def payload(name: str, size: int = SIZE) -> bytes:
    return (name.encode() * size)[:size]


def fetcher(log=None, sleep: float = 0.0, size: int = SIZE):
    """A fetch per chunk name that writes its payload in pieces (and records the fetch in ``log``)."""

    def for_chunk(name):
        def fetch(out):
            if log is not None:
                with open(log, "a") as f:
                    fcntl.flock(f, fcntl.LOCK_EX)
                    f.write(name + "\n")
            data = payload(name, size)
            for k in range(0, len(data), 256):
                out.write(data[k : k + 256])
                time.sleep(sleep / 4)

        return fetch

    return for_chunk


def read_whole(cache, name, fetch, size=SIZE):
    return cache.read(name, size, 0, size, fetch(name))


def test_a_chunk_is_fetched_once_and_read_at_any_offset(tmp_path):
    cache, fetch, log = ChunkCache(tmp_path / "c", 5 * SIZE), fetcher(tmp_path / "log"), tmp_path / "log"
    assert read_whole(cache, A, fetch) == payload(A)
    assert cache.read(A, SIZE, 10, 5, fetch(A)) == payload(A)[10:15]
    assert log.read_text().split() == [A]
    assert cache.fetched() == {"chunks": 1, "bytes": SIZE}


def test_the_cache_never_holds_more_than_its_limit_and_evicts_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(chunk_cache, "TOUCH_EVERY", 0.0)  # every read refreshes the chunk's use time
    cache, fetch = ChunkCache(tmp_path / "c", 2 * SIZE + 100), fetcher()
    for name in [A, B, A, C]:  # a used after b: b is the one evicted for c
        read_whole(cache, name, fetch)
        time.sleep(0.02)
        assert cache.usage() <= cache.limit
    assert sorted(n for n in os.listdir(tmp_path / "c") if not n.startswith(".")) == [A, C]


def test_a_chunk_being_read_is_never_evicted_and_a_full_cache_names_its_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(chunk_cache, "NO_ROOM_TIMEOUT", 0.3)
    cache, fetch = ChunkCache(tmp_path / "c", SIZE + 100), fetcher()
    read_whole(cache, A, fetch)
    with open(tmp_path / "c" / A, "rb") as reading:  # another process mid-read holds it shared
        fcntl.flock(reading, fcntl.LOCK_SH)
        with pytest.raises(CacheFullError, match=r"raise source.cache_limit \(now 1100 bytes\)"):
            read_whole(cache, B, fetch)
        assert (tmp_path / "c" / A).read_bytes() == payload(A)
    assert read_whole(cache, B, fetch) == payload(B)  # read done: a goes, b comes
    assert not (tmp_path / "c" / A).exists()


def test_a_chunk_evicted_while_open_elsewhere_frees_its_bytes_and_is_fetched_again(tmp_path):
    first, fetch = ChunkCache(tmp_path / "c", SIZE + 100), fetcher(tmp_path / "log")
    read_whole(first, A, fetch)  # first keeps a's descriptor open
    second = ChunkCache(tmp_path / "c", SIZE + 100)
    second._pid = -1  # another process: its own descriptors
    read_whole(second, B, fetch)  # evicts a (truncated: its blocks freed though first has it open)
    assert second.usage() <= SIZE + 100
    assert read_whole(first, A, fetch) == payload(A)  # sees the truncation, fetches again
    assert (tmp_path / "log").read_text().split() == [A, B, A]


def test_a_failed_or_wrong_sized_download_leaves_nothing_read_as_whole(tmp_path):
    cache = ChunkCache(tmp_path / "c", 10 * SIZE)

    def broken(out):
        out.write(b"x" * 300)
        raise ConnectionError("endpoint gone")

    with pytest.raises(ConnectionError):
        cache.read(A, SIZE, 0, 10, broken)
    with pytest.raises(OSError, match="fetched 300 bytes, index.json says 1000"):
        cache.read(A, SIZE, 0, 10, lambda out: out.write(b"x" * 300))
    with pytest.raises(OSError, match="more bytes than index.json's 1000"):
        cache.read(A, SIZE, 0, 10, lambda out: out.write(b"x" * 1200))
    assert sorted(os.listdir(tmp_path / "c")) == [".lock"]


def test_a_chunk_is_on_the_disk_before_it_takes_its_name(tmp_path, monkeypatch):
    """A power loss after the rename must not leave the name on a chunk-sized run of zeros: the download's
    bytes are synced before the rename, and a failed sync publishes nothing."""
    events = []
    real_sync, real_rename = os.fdatasync, os.rename

    def sync(fd):
        events.append(("sync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_sync(fd)

    def rename(src, dst):
        events.append(("rename", os.path.basename(src)))
        return real_rename(src, dst)

    monkeypatch.setattr(chunk_cache.os, "fdatasync", sync)
    monkeypatch.setattr(chunk_cache.os, "rename", rename)
    cache = ChunkCache(tmp_path / "c", 10 * SIZE)
    assert read_whole(cache, A, fetcher()) == payload(A)
    assert events == [("sync", A + ".part"), ("rename", A + ".part")]

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(chunk_cache.os, "fdatasync", failing)
    with pytest.raises(OSError, match="Input/output"):
        read_whole(cache, B, fetcher())
    assert sorted(os.listdir(tmp_path / "c")) == [".lock", A]

    def unsupported(fd):  # a file system with nothing to sync refuses the call: the chunk is still good
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(chunk_cache.os, "fdatasync", unsupported)
    assert read_whole(cache, B, fetcher()) == payload(B)


def test_a_download_of_a_killed_process_is_removed_and_fetched_again(tmp_path):
    (tmp_path / "c").mkdir(mode=0o700)
    (tmp_path / "c" / f"{A}.part").write_bytes(b"half")  # its writer was killed: nobody holds its lock
    cache = ChunkCache(tmp_path / "c", 10 * SIZE)
    assert read_whole(cache, A, fetcher()) == payload(A)
    assert not (tmp_path / "c" / f"{A}.part").exists()


def test_a_chunk_larger_than_the_limit_is_refused_by_key(tmp_path):
    with pytest.raises(CacheFullError, match="more than source.cache_limit=500"):
        read_whole(ChunkCache(tmp_path / "c", 500), A, fetcher())


def _reader(directory, limit, names, log, errors):
    try:
        cache, fetch = ChunkCache(directory, limit), fetcher(log, sleep=0.01)
        for name in names:
            assert read_whole(cache, name, fetch) == payload(name)
    except BaseException as err:  # reported to the test
        with open(errors, "a") as f:
            f.write(repr(err) + "\n")


@pytest.mark.parametrize("limit_chunks", [3, 12])
def test_processes_sharing_a_cache_stay_under_its_limit_and_fetch_each_chunk_once_when_it_fits(
    tmp_path, limit_chunks
):
    """Four processes read ten chunks, each from another one on. Sampled every
    millisecond, the directory never holds more than the limit, downloads in progress included; with room
    for all, every chunk is fetched exactly once."""
    directory, limit = tmp_path / "c", limit_chunks * SIZE + 200
    names = [key(f"chunk-{k}") for k in range(10)]
    ChunkCache(directory, limit)
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], ChunkCache.usage(ChunkCache(directory, limit)))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    context = multiprocessing.get_context("fork")
    args = (directory, limit, names, tmp_path / "log", tmp_path / "errors")
    procs = [  # each from another chunk on: downloads of different chunks at once
        context.Process(target=_reader, args=(directory, limit, names[k:] + names[:k], *args[3:]))
        for k in (0, 3, 5, 8)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    done.set()
    sampler.join()
    assert not (tmp_path / "errors").exists(), (tmp_path / "errors").read_text()
    assert 0 < peak[0] <= limit
    fetched = (tmp_path / "log").read_text().split()
    if limit_chunks >= len(names):
        assert sorted(fetched) == names  # each once, though four processes wanted each
    assert not [n for n in os.listdir(directory) if n.endswith(".part")]


def test_a_dead_download_of_a_chunk_no_one_wants_does_not_take_the_room(tmp_path, monkeypatch):
    """A run killed mid-download (its .part's lock is free) and resumed with another order: the dead .part
    of a chunk not wanted now is removed to make room, instead of holding the limit until a timeout."""
    monkeypatch.setattr(chunk_cache, "NO_ROOM_TIMEOUT", 1.0)
    directory = tmp_path / "c"
    cache, fetch = ChunkCache(directory, 2 * SIZE + 100), fetcher()
    for dead in (
        key("x"),
        key("y"),
    ):  # two workers killed while downloading x and y: nobody holds their locks
        with open(directory / f"{dead}.part", "wb") as f:
            f.truncate(SIZE)
    assert read_whole(cache, A, fetch) == payload(A)
    assert not (directory / f"{key('x')}.part").exists() or not (directory / f"{key('y')}.part").exists()
    assert cache.usage() <= cache.limit


def test_a_limit_of_exactly_the_chunk_size_holds_one_chunk_after_another(tmp_path, monkeypatch):
    """The bookkeeping file (.stats) must not take the room a chunk of exactly the limit needs: the second
    chunk otherwise waits NO_ROOM_TIMEOUT and fails with 'every chunk there is being read'."""
    monkeypatch.setattr(chunk_cache, "NO_ROOM_TIMEOUT", 1.0)
    cache, fetch = ChunkCache(tmp_path / "c", SIZE), fetcher()
    for name in [A, B, A]:
        assert read_whole(cache, name, fetch) == payload(name)
    assert cache.usage() <= cache.limit
    assert cache.fetched() == {"chunks": 3, "bytes": 3 * SIZE}


def test_a_cached_chunk_of_the_name_but_another_size_is_fetched_again_not_waited_on(tmp_path):
    """A chunk left by an earlier dataset of the same name and another size (converted again): it looped on
    'evicted between open and check' forever."""
    (tmp_path / "c").mkdir(mode=0o700)
    (tmp_path / "c" / A).write_bytes(b"old" * 500)  # 1500 bytes, from before
    cache, got = ChunkCache(tmp_path / "c", 10 * SIZE), []
    reader = threading.Thread(target=lambda: got.append(read_whole(cache, A, fetcher())), daemon=True)
    reader.start()
    reader.join(10)
    assert got == [payload(A)]


def test_a_cache_directory_that_cannot_be_made_names_the_setting(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OSError, match=r"chunk cache .*afile/c.*source.cache_dir"):
        ChunkCache(tmp_path / "afile" / "c", 10 * SIZE)


def test_a_process_waiting_for_room_while_others_fetch_does_not_time_out(tmp_path, monkeypatch):
    """No room for a while is not a full cache as long as other processes go on fetching (their chunks take
    the room in turn): the no-room timer counts only time in which no chunk was fetched at all."""
    monkeypatch.setattr(chunk_cache, "NO_ROOM_TIMEOUT", 0.5)
    directory = tmp_path / "c"
    cache, fetch = ChunkCache(directory, SIZE + 100), fetcher()
    read_whole(cache, A, fetch)
    reading = open(directory / A, "rb")  # noqa: SIM115 (closed mid-test, when the read ends)
    fcntl.flock(reading, fcntl.LOCK_SH)  # another process mid-read: no room for b while it reads
    stop = threading.Event()

    def others_fetch():  # meanwhile chunks of the node still come and go (counted as fetched)
        while not stop.wait(0.1):
            cache._count(1)

    busy = threading.Thread(target=others_fetch, daemon=True)
    busy.start()
    got = []
    waiter = threading.Thread(
        target=lambda: got.append(read_whole(ChunkCache(directory, SIZE + 100), B, fetch))
    )
    waiter.start()
    waiter.join(1.5)  # three timeouts' worth
    assert waiter.is_alive() or got, "gave up with room being made elsewhere"
    reading.close()  # the read ends: a goes, b comes
    waiter.join(30)
    stop.set()
    busy.join()
    assert got == [payload(B)]


def test_an_empty_file_left_under_a_chunks_name_is_fetched_again_not_waited_on(tmp_path):
    """A chunk's file left at 0 bytes (a process killed between an eviction's truncate and its unlink, or a
    node that crashed right after the rename): it was taken for 'being evicted now' and waited on forever."""
    (tmp_path / "c").mkdir(mode=0o700)
    (tmp_path / "c" / A).write_bytes(b"")
    cache, got = ChunkCache(tmp_path / "c", 10 * SIZE), []
    reader = threading.Thread(target=lambda: got.append(read_whole(cache, A, fetcher())), daemon=True)
    reader.start()
    reader.join(10)
    assert got == [payload(A)]


def test_a_cache_directory_that_is_there_but_read_only_names_the_setting(tmp_path, monkeypatch):
    """A cache_dir on a read-only mount (or another user's): the directory exists, so making it succeeded, and
    the first read failed deep in a worker with a bare 'Read-only file system: .../chunks/.lock'."""
    import errno

    (tmp_path / "c").mkdir(mode=0o700)
    real = os.open

    def read_only(path, flags, *args):
        if str(path).startswith(str(tmp_path / "c")) and flags & (os.O_CREAT | os.O_RDWR | os.O_WRONLY):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(OSError, match=r"cannot make the chunk cache .*/c: Read-only.*source.cache_dir"):
        ChunkCache(tmp_path / "c", 10 * SIZE)


def test_a_disk_full_under_the_limit_names_the_directory_and_the_setting(tmp_path):
    """A limit above what the cache's disk can hold: the download's write fails with ENOSPC, which surfaced as a
    bare 'No space left on device' with no word of source.cache_limit."""
    import errno

    def disk_full(out):
        out.write(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    cache = ChunkCache(tmp_path / "c", 10 * SIZE)
    with pytest.raises(CacheFullError, match=r"no space left on the disk of .*/c .*source.cache_limit=10000"):
        cache.read(A, SIZE, 0, SIZE, disk_full)
    assert os.listdir(tmp_path / "c") == [".lock"]


def test_an_earlier_layouts_dataset_directory_in_the_cache_counts_and_ages_out(tmp_path):
    """The cache was one directory per dataset (<cache_dir>/chunks/<url>-<digest>/) before it was one per node
    (<cache_dir>/chunks/): a node's cache from then sat in the new one uncounted, and making room reached it
    first (the oldest) and failed with IsADirectoryError on every download."""
    (tmp_path / "c").mkdir(mode=0o700)
    old = tmp_path / "c" / "bucket-train-0123456789abcdef"
    old.mkdir()
    (old / "chunk-0-0.bin").write_bytes(b"o" * (8 * SIZE))
    (old / ".lock").write_bytes(b"")
    os.utime(old, (1, 1))
    cache = ChunkCache(tmp_path / "c", 3 * SIZE)
    assert cache.usage() >= 8 * SIZE
    assert read_whole(cache, A, fetcher()) == payload(A)
    assert not old.exists() and cache.usage() <= cache.limit


def test_making_room_never_truncates_a_file_outside_the_cache_through_a_symlink(tmp_path):
    """A symlink in the cache directory (a chunk linked in from a shared copy): eviction opened it, followed
    the link, and truncated the file it points at to 0 bytes."""
    outside = tmp_path / "shared-chunk.bin"
    outside.write_bytes(b"s" * SIZE)
    (tmp_path / "c").mkdir(mode=0o700)
    (tmp_path / "c" / key("linked")).symlink_to(outside)
    os.utime(tmp_path / "c" / key("linked"), (1, 1), follow_symlinks=False)  # the oldest: evicted first
    cache = ChunkCache(tmp_path / "c", 2 * SIZE)
    for name in (A, B, D):
        assert read_whole(cache, name, fetcher()) == payload(name)
    assert outside.read_bytes() == b"s" * SIZE

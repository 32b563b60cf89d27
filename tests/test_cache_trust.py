"""The chunk cache reads and removes only what it wrote (storage/cache_trust.py, storage/cache_room.py): a
cache directory another user can write to is refused, and so is a file in it of another owner; what is not
the cache's counts against the limit and is never deleted.

Another owner is real where the tests run as root (``os.lchown`` to an unused uid) and simulated otherwise
(the owner the file system reports for that one file), so every case runs either way."""

from __future__ import annotations

import os
import stat

import pytest

from feedline.datasets.shards.cached import cache_name
from feedline.storage import cache_trust
from feedline.storage.cache_room import is_chunk
from feedline.storage.cache_trust import UntrustedCacheError
from feedline.storage.chunk_cache import ChunkCache
from tests.helpers import simple_tree
from tests.s3_server import upload_dir
from tests.test_chunk_cache import SIZE, A, B, C, fetcher, key, payload, read_whole
from tests.test_s3_shards import options

OTHER = 12345  # a uid no test user has


def owned_by_another(path, monkeypatch) -> None:
    """``path`` (a file or folder) now belongs to uid OTHER, as the cache sees it."""
    if os.geteuid() == 0:
        os.lchown(path, OTHER, OTHER)
        return
    inode, real = os.lstat(path).st_ino, cache_trust.owner
    monkeypatch.setattr(cache_trust, "owner", lambda st: OTHER if st.st_ino == inode else real(st))


def private(path):
    path.mkdir(mode=0o700)
    return path


def test_every_cache_name_the_reader_makes_is_one_the_cache_takes_for_its_own():
    assert is_chunk(cache_name("http://s3\ns3://b/ds\nv1", "part-00000-of-00002/chunk-0-12.bin", '"e1"'))
    assert not is_chunk("README.txt") and not is_chunk(f"{A}.part")


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o720])
def test_a_cache_directory_others_can_write_to_is_refused_naming_it_and_the_fix(tmp_path, mode, monkeypatch):
    """The issue's reproduction: another user made <cache_dir>/chunks world-writable and planted, under the
    run's cache names, chunks of the same size with other pixels. Group-writable: a group others are in."""
    monkeypatch.setattr(cache_trust, "shared_group", lambda gid: True)
    directory = private(tmp_path / "chunks")
    (directory / A).write_bytes(b"planted" * (SIZE // 7) + b"!" * (SIZE % 7))
    os.chmod(directory, mode)
    with pytest.raises(
        UntrustedCacheError,
        match=rf"the cache {directory} can be written by other users \(mode {mode:#o}\).*chmod 700 {directory}, "
        r"or set source.cache_dir \(or paths.cache_dir, FEEDLINE_CACHE_DIR\) to a directory of your own",
    ):
        ChunkCache(directory, 10 * SIZE)
    assert sorted(os.listdir(directory)) == [A]  # nothing read, made or removed there
    os.chmod(directory, 0o700)  # the fix the error gives
    assert read_whole(ChunkCache(directory, 10 * SIZE), B, fetcher()) == payload(B)


def test_a_cache_directory_of_another_user_is_refused_naming_its_owner(tmp_path, monkeypatch):
    directory = private(tmp_path / "chunks")
    owned_by_another(directory, monkeypatch)
    with pytest.raises(
        UntrustedCacheError, match=rf"the cache {directory} belongs to uid {OTHER}, not to this run"
    ):
        ChunkCache(directory, 10 * SIZE)


def test_a_chunk_file_of_another_owner_is_never_read_nor_removed(tmp_path, monkeypatch):
    directory = private(tmp_path / "chunks")
    cache = ChunkCache(directory, 10 * SIZE)
    (directory / A).write_bytes(b"p" * SIZE)  # the size index.json gives: it would be read as the chunk
    owned_by_another(directory / A, monkeypatch)
    with pytest.raises(
        UntrustedCacheError, match=rf"the cache file {directory / A} belongs to uid {OTHER}.*remove it"
    ):
        read_whole(cache, A, fetcher())
    assert (directory / A).read_bytes() == b"p" * SIZE
    (directory / B).write_bytes(b"p" * 10)  # another size: it was truncated and removed, to fetch it again
    owned_by_another(directory / B, monkeypatch)
    with pytest.raises(UntrustedCacheError, match=str(directory / B)):
        read_whole(cache, B, fetcher())
    assert (directory / B).read_bytes() == b"p" * 10
    assert read_whole(cache, C, fetcher()) == payload(C)  # the cache's own chunks read as ever


def test_a_dead_download_of_another_owner_is_named_not_removed(tmp_path, monkeypatch):
    directory = private(tmp_path / "chunks")
    cache = ChunkCache(directory, 10 * SIZE)
    (directory / f"{A}.part").write_bytes(b"p" * SIZE)  # no one holds its lock: a dead writer's, if ours
    owned_by_another(directory / f"{A}.part", monkeypatch)
    with pytest.raises(UntrustedCacheError, match=rf"{directory / A}.part belongs to uid {OTHER}"):
        read_whole(cache, A, fetcher())
    assert (directory / f"{A}.part").read_bytes() == b"p" * SIZE


def test_a_symlink_under_a_chunks_name_is_never_followed(tmp_path):
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"s" * SIZE)
    directory = private(tmp_path / "chunks")
    (directory / A).symlink_to(outside)
    with pytest.raises(UntrustedCacheError, match=rf"the cache file {directory / A} is a symlink"):
        read_whole(ChunkCache(directory, 10 * SIZE), A, fetcher())
    assert outside.read_bytes() == b"s" * SIZE


def test_what_the_cache_did_not_write_counts_against_the_limit_and_is_never_evicted(tmp_path, monkeypatch):
    directory = private(tmp_path / "chunks")
    cache = ChunkCache(directory, 3 * SIZE)
    (directory / "README.txt").write_bytes(b"r" * 400)  # the user's own, of no cache name
    (directory / key("theirs")).write_bytes(b"t" * 400)  # a cache name, another owner
    (directory / f"{key('dead')}.part").write_bytes(b"d" * 100)  # a dead download, another owner
    for name in ("README.txt", key("theirs"), f"{key('dead')}.part"):
        os.utime(directory / name, (1, 1))  # the oldest: first in line to go
    owned_by_another(directory / key("theirs"), monkeypatch)
    owned_by_another(directory / f"{key('dead')}.part", monkeypatch)
    for name in (A, B, C, A):
        assert read_whole(cache, name, fetcher()) == payload(name)
        assert cache.usage() <= cache.limit  # the 900 bytes not the cache's count: two chunks fit, not three
    assert (directory / "README.txt").read_bytes() == b"r" * 400
    assert (directory / key("theirs")).read_bytes() == b"t" * 400
    assert (directory / f"{key('dead')}.part").read_bytes() == b"d" * 100
    assert len([n for n in os.listdir(directory) if n in (A, B, C)]) == 2


def test_files_the_cache_did_not_write_that_leave_no_room_are_named_at_once(tmp_path, monkeypatch):
    """A file of the user's own (or another user's) that fills the limit can never be evicted: waiting for
    room (300 s, blaming chunks being read) would never end in one; the error names the file at once."""
    from feedline.storage import chunk_cache
    from feedline.storage.chunk_cache import CacheFullError

    directory = private(tmp_path / "chunks")
    cache = ChunkCache(directory, 3 * SIZE)
    (directory / "backup.tar").write_bytes(b"b" * (3 * SIZE - SIZE // 2))
    monkeypatch.setattr(chunk_cache.time, "sleep", lambda s: pytest.fail("waited for room no one frees"))
    with pytest.raises(
        CacheFullError, match=rf"files the cache did not write take .*{directory / 'backup.tar'}"
    ):
        read_whole(cache, A, fetcher())
    assert (directory / "backup.tar").stat().st_size == 3 * SIZE - SIZE // 2  # never removed


def test_an_earlier_layouts_folder_holding_another_owners_file_is_never_removed(tmp_path, monkeypatch):
    directory = private(tmp_path / "chunks")
    old = directory / "bucket-train-0123456789abcdef"
    old.mkdir()
    (old / "chunk-0-0.bin").write_bytes(b"o" * SIZE)
    owned_by_another(old / "chunk-0-0.bin", monkeypatch)
    os.utime(old, (1, 1))
    cache = ChunkCache(directory, 3 * SIZE)
    for name in (A, B, C):
        read_whole(cache, name, fetcher())
    assert (old / "chunk-0-0.bin").read_bytes() == b"o" * SIZE


def test_a_stats_file_of_another_owner_is_named_before_any_read(tmp_path, monkeypatch):
    directory = private(tmp_path / "chunks")
    ChunkCache(directory, 10 * SIZE)._count(SIZE)
    owned_by_another(tmp_path / "chunks.stats", monkeypatch)
    with pytest.raises(UntrustedCacheError, match=rf"{tmp_path / 'chunks.stats'} belongs to uid {OTHER}"):
        ChunkCache(directory, 10 * SIZE)


def test_the_cache_makes_its_directory_and_files_for_its_user_alone_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        cache = ChunkCache(tmp_path / "cache" / "chunks", 10 * SIZE)
        read_whole(cache, A, fetcher())
    finally:
        os.umask(old)
    directory = tmp_path / "cache" / "chunks"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in (A, ".lock"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache" / "chunks.stats").stat().st_mode) == 0o600


@pytest.fixture(scope="module")
def shards_url(s3_server, tmp_path_factory):
    """A small shards dataset in a bucket: its URL."""
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards import convert_source

    tmp = tmp_path_factory.mktemp("trust")
    source = FolderSource(simple_tree(tmp / "tree", per_class=3), val_fraction=0, cache_dir=tmp / "c")
    convert_source(
        source, WriteOptions(path=str(tmp / "shards"), format="shards", chunk_bytes="2KB", workers=1)
    )
    url = s3_server.new_prefix()
    upload_dir(s3_server, tmp / "shards", url)
    return url


@pytest.mark.parametrize("how", ["world-writable directory", "private directory"])
def test_chunks_another_user_planted_under_the_runs_cache_names_are_never_read(
    s3_server, shards_url, tmp_path, monkeypatch, how
):
    """The issue's reproduction, end to end: the cache names are digests anyone who can list the bucket can
    compute; another user plants a chunk of the right size under each."""
    from feedline.datasets.shards.source import ShardsSource

    def records(cache_dir):
        source = ShardsSource(
            shards_url, val_fraction=0, storage_options=options(s3_server), cache_dir=cache_dir
        )
        return source.split("train")

    chunks = records(tmp_path / "mine").chunks  # what the attacker computes
    planted = private(tmp_path / "shared").joinpath("chunks")
    planted.mkdir(mode=0o700)
    for name, size in zip(chunks.names, chunks.nbytes):
        (planted / name).write_bytes(b"\xff" * int(size))
        owned_by_another(planted / name, monkeypatch)
    if how == "world-writable directory":
        os.chmod(planted, 0o777)
        said = rf"the cache {planted} can be written by other users"
    else:  # made private since, with the planted files still in it
        said = rf"the cache file {planted}/[0-9a-f]{{16}}-chunk-0-0.bin belongs to uid {OTHER}"
    with pytest.raises(UntrustedCacheError, match=said):
        theirs = records(tmp_path / "shared")
        for i in range(len(theirs)):
            theirs[i]
    assert all((planted / n).read_bytes() == b"\xff" * int(b) for n, b in zip(chunks.names, chunks.nbytes))


def test_a_group_writable_cache_is_used_only_where_the_group_is_the_users_own(monkeypatch):
    """Debian's and Ubuntu's umask 002 makes every new folder group-writable, for the user's private group:
    that group lets no one else write; any group with another member (or not the user's) does."""
    from types import SimpleNamespace

    me = SimpleNamespace(pw_name="ann", pw_gid=1000)
    groups = {
        1000: SimpleNamespace(gr_name="ann", gr_mem=[]),
        1001: SimpleNamespace(gr_name="ann", gr_mem=["bob"]),
        1002: SimpleNamespace(gr_name="lab", gr_mem=["ann"]),
    }
    monkeypatch.setattr(cache_trust.pwd, "getpwuid", lambda uid: me)
    monkeypatch.setattr(cache_trust.grp, "getgrgid", lambda gid: groups[gid])
    assert not cache_trust.shared_group(1000)  # the private group
    assert cache_trust.shared_group(1001)  # bob is in it
    assert cache_trust.shared_group(1002)  # another group
    me.pw_gid = 1002
    assert cache_trust.shared_group(1000)  # named as the user, but not the user's primary group
    assert cache_trust.shared_group(4242)  # unknown: shared

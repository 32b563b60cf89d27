"""The index caches read only what this user wrote (datasets/cache.py through storage/cache_trust.py, the
chunk cache's rule): a cache folder another user can write to, or that is a symlink, is refused by name,
and so is a cached index, split or labels copy of another owner, before anything is read or rebuilt.

Another owner is real where the tests run as root (``os.lchown`` to an unused uid) and simulated otherwise
(the owner the file system reports for that one file), so every case runs either way."""

from __future__ import annotations

import os
import stat

import pytest

from feedline.datasets.folder.index import IMG_EXTENSIONS, index_dir, open_index
from feedline.datasets.folder.source import FolderSource
from feedline.storage.cache_trust import UntrustedCacheError
from tests.helpers import simple_tree
from tests.test_cache_trust import OTHER, owned_by_another


def built(tmp_path):
    """A tree, its index built in a cache of its own: (tree, cache_dir, the index's directory)."""
    tree = simple_tree(tmp_path / "tree")
    cache = tmp_path / "cache"
    open_index(tree, cache_dir=cache)
    return tree, cache, index_dir(tree, IMG_EXTENSIONS, cache)


def untouched(directory):
    """What is in ``directory`` (names, sizes, mtimes): to check nothing was rebuilt, read into or removed."""
    return {p.name: (p.lstat().st_size, p.lstat().st_mtime_ns) for p in directory.iterdir()}


@pytest.mark.parametrize("level", ["cache_dir", "kind"])
def test_a_cache_folder_others_can_write_to_is_refused_naming_it_and_the_fix(tmp_path, level):
    """The issue's reproduction for the index caches: whoever can write <cache_dir> or <cache_dir>/folder-index
    can put another index under the name a run will use (a digest of the root anyone can compute)."""
    tree, cache, leaf = built(tmp_path)
    folder = cache if level == "cache_dir" else cache / "folder-index"
    before = untouched(leaf)
    os.chmod(folder, 0o777)
    with pytest.raises(
        UntrustedCacheError,
        match=rf"the cache {folder} can be written by other users \(mode 0o777\).*chmod 700 {folder}, or set "
        r"source.cache_dir \(or paths.cache_dir, FEEDLINE_CACHE_DIR\) to a directory of your own",
    ):
        open_index(tree, cache_dir=cache)
    assert untouched(leaf) == before  # nothing read into, rebuilt or removed
    os.chmod(folder, 0o700)  # the fix the error gives
    assert len(open_index(tree, cache_dir=cache)) == 18


def test_a_symlink_in_place_of_a_cache_folder_is_never_followed(tmp_path):
    """Another user's link, <cache_dir>/folder-index/<name> -> an index of their choosing: refused, whatever
    the link leads to (here even an index this user built, of another tree)."""
    tree, cache, leaf = built(tmp_path)
    other = simple_tree(tmp_path / "other", classes=("x", "y"), per_class=2)
    open_index(other, cache_dir=cache)
    os.rename(leaf, tmp_path / "moved")
    os.symlink(index_dir(other, IMG_EXTENSIONS, cache), leaf)
    with pytest.raises(UntrustedCacheError, match=rf"the cache {leaf} is a symlink"):
        FolderSource(tree, cache_dir=cache).prepare()
    assert os.path.islink(leaf)  # not removed either


@pytest.mark.parametrize("name", ["paths.npy", "labels.npy", "meta.json"])
def test_an_index_file_of_another_owner_is_refused_and_left_alone(tmp_path, monkeypatch, name):
    tree, cache, leaf = built(tmp_path)
    owned_by_another(leaf / name, monkeypatch)
    before = untouched(leaf)
    with pytest.raises(
        UntrustedCacheError,
        match=rf"the cache file {leaf / name} belongs to uid {OTHER}, not to this run's uid {os.geteuid()}.*"
        r"remove it",
    ):
        open_index(tree, cache_dir=cache)
    assert untouched(leaf) == before  # never rebuilt over it: the cache deletes nothing it did not write


def test_a_cached_split_of_another_owner_is_refused(tmp_path, monkeypatch):
    tree, cache = simple_tree(tmp_path / "tree"), tmp_path / "cache"
    FolderSource(tree, val_fraction=0.25, cache_dir=cache).split("val")
    leaf = index_dir(tree, IMG_EXTENSIONS, cache)
    (split,) = [p for p in leaf.iterdir() if p.name.startswith("split-") and p.name.endswith("-val.npy")]
    owned_by_another(split, monkeypatch)
    with pytest.raises(UntrustedCacheError, match=rf"the cache file {split} belongs to uid {OTHER}"):
        FolderSource(tree, val_fraction=0.25, cache_dir=cache).split("val")


def test_a_symlink_among_the_index_files_is_refused(tmp_path):
    tree, cache, leaf = built(tmp_path)
    (tmp_path / "labels.npy").write_bytes((leaf / "labels.npy").read_bytes())
    os.replace(leaf / "labels.npy", tmp_path / "kept.npy")
    os.symlink(tmp_path / "labels.npy", leaf / "labels.npy")
    with pytest.raises(UntrustedCacheError, match=rf"the cache file {leaf / 'labels.npy'} is a symlink"):
        open_index(tree, cache_dir=cache)


def test_the_caches_folders_are_made_for_their_user_alone_whatever_the_umask_and_read_back(tmp_path):
    tree, cache = simple_tree(tmp_path / "tree"), tmp_path / "cache"
    old = os.umask(0)
    try:
        first = FolderSource(tree, val_fraction=0.25, cache_dir=cache)
        val = first.split("val")
    finally:
        os.umask(old)
    leaf = index_dir(tree, IMG_EXTENSIONS, cache)
    for folder in (cache, cache / "folder-index", leaf):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    again = FolderSource(tree, val_fraction=0.25, cache_dir=cache)  # the normal path: read from the cache
    assert again._index(tree, "source.root").directory == str(leaf)
    assert [val[i][1] for i in range(len(val))] == [again.split("val")[i][1] for i in range(len(val))]


def test_a_shards_labels_copy_of_another_owner_is_refused(s3_server, tmp_path, monkeypatch):
    """The labels a URL's samples are checked against are copied beside its split cache: another user's copy
    there would decide which labels count as right."""
    from feedline.datasets.shards.source import ShardsSource
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards import convert_source
    from tests.s3_server import upload_dir
    from tests.test_s3_shards import options

    source = FolderSource(
        simple_tree(tmp_path / "tree", per_class=3), val_fraction=0, cache_dir=tmp_path / "c"
    )
    out = WriteOptions(path=str(tmp_path / "shards"), format="shards", chunk_bytes="2KB", workers=1)
    convert_source(source, out)
    url = s3_server.new_prefix()
    upload_dir(s3_server, tmp_path / "shards", url)

    def open_shards():
        return ShardsSource(
            url, val_fraction=0, storage_options=options(s3_server), cache_dir=tmp_path / "cache"
        )

    open_shards()
    (copy,) = (tmp_path / "cache" / "shards").glob("*/labels-0.npy")
    owned_by_another(copy, monkeypatch)
    with pytest.raises(UntrustedCacheError, match=rf"the cache file {copy} belongs to uid {OTHER}"):
        open_shards()


def test_a_cache_made_under_umask_002_by_a_user_with_a_private_group_is_used(tmp_path):
    """Debian's and Ubuntu's default: umask 002 and a private group per user, so every folder another tool
    (or an earlier feedline) made is group-writable. That group lets no one else write: the cache is used,
    `make train` works out of the box; under a group others are in, it is refused."""
    from feedline.datasets.cache import cache_path
    from feedline.storage import cache_trust

    old = os.umask(0o002)
    try:
        os.makedirs(tmp_path / "cache" / "index")  # 0o775, as another tool leaves it
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o775
    if cache_trust.shared_group(os.stat(tmp_path / "cache").st_gid):
        with pytest.raises(UntrustedCacheError, match="can be written by other users"):
            cache_path("index", "tree", ["k"], tmp_path / "cache")
    else:  # root's group here, the user's own on a desktop: no one else writes there
        assert cache_path("index", "tree", ["k"], tmp_path / "cache").parent == tmp_path / "cache" / "index"

"""The index cache at scale: staleness, corruption, concurrent builders, symlink loops, rank semantics."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import sys

import numpy as np
import pytest
from torchvision.datasets import ImageFolder

import feedline.datasets.folder.index as index_module
from feedline.datasets.folder.index import index_dir, open_index, problem
from feedline.datasets.folder.source import FolderSource
from tests.helpers import backdate_tree, make_tree, simple_tree


def _samples(index):
    return [(index.relpath(i), index.label(i)) for i in range(len(index))]


def _no_scan(monkeypatch):
    monkeypatch.setattr(index_module, "scan_tree", lambda *a, **k: pytest.fail("scanned a fresh cache"))


def test_added_and_removed_files_are_picked_up_under_auto(tmp_path, tree):
    cache = tmp_path / "cache"
    assert len(open_index(tree, cache_dir=cache)) == 18
    make_tree(tree, {"dog": ["new/zz.png"]}, backdate=False)
    assert ("dog/new/zz.png", 1) in _samples(open_index(tree, cache_dir=cache))
    os.remove(os.path.join(tree, "cat", "000.png"))
    after = _samples(open_index(tree, cache_dir=cache))
    assert len(after) == 18 and ("cat/000.png", 0) not in after


def test_new_class_is_picked_up(tmp_path, tree):
    open_index(tree, cache_dir=tmp_path / "cache")
    make_tree(tree, {"ant": ["a.png"]}, backdate=False)
    assert open_index(tree, cache_dir=tmp_path / "cache").classes == ["ant", "cat", "dog", "eel"]


def test_refresh_never_trusts_and_always_rebuilds(tmp_path, tree, monkeypatch):
    cache = tmp_path / "cache"
    open_index(tree, cache_dir=cache)
    os.remove(os.path.join(tree, "cat", "000.png"))
    assert len(open_index(tree, cache_dir=cache, refresh="never")) == 18
    assert len(open_index(tree, cache_dir=cache, refresh="always")) == 17


def test_fresh_cache_is_mapped_without_a_scan_by_every_rank(tmp_path, tree, monkeypatch):
    rank0 = FolderSource(tree, cache_dir=tmp_path / "cache")
    rank0.prepare()  # prepare_data: local rank 0 only
    _no_scan(monkeypatch)
    other_rank = FolderSource(tree, cache_dir=tmp_path / "cache")  # setup on every rank
    assert len(other_rank.split("train")) + len(other_rank.split("val")) == 18


@pytest.mark.parametrize("damage", ["truncate_offsets", "garble_meta", "drop_labels", "wrong_lengths"])
def test_corrupt_cache_is_rebuilt_with_a_warning(tmp_path, tree, caplog, damage):
    cache = tmp_path / "cache"
    good = _samples(open_index(tree, cache_dir=cache))
    d = index_dir(tree, index_module.IMG_EXTENSIONS, cache)
    if damage == "truncate_offsets":
        with open(d / "offsets.npy", "r+b") as f:
            f.truncate(100)
    elif damage == "garble_meta":
        (d / "meta.json").write_text("{not json")
    elif damage == "drop_labels":
        os.remove(d / "labels.npy")
    else:
        np.save(d / "labels.npy", np.zeros(3, dtype=np.int16))
    assert problem(d) is not None
    with caplog.at_level(logging.WARNING):
        rebuilt = open_index(tree, cache_dir=cache)
    assert "unusable" in caplog.text and _samples(rebuilt) == good and problem(d) is None


def _build_in_child(root, cache, barrier, results):
    barrier.wait()  # start together: both scan, both try to publish
    index = index_module.build(
        root, index_module.IMG_EXTENSIONS, index_dir(root, index_module.IMG_EXTENSIONS, cache)
    )
    results.put(_samples(index))


def test_concurrent_builders_both_end_with_the_same_valid_index(tmp_path):
    root = make_tree(tmp_path / "t", {f"c{c:02d}": [f"{i:04d}.txt" for i in range(150)] for c in range(20)})
    for dirpath, _, files in os.walk(root):  # rename to an image extension: content does not matter here
        for f in files:
            os.rename(os.path.join(dirpath, f), os.path.join(dirpath, f[:-4] + ".jpg"))
    backdate_tree(root)
    cache = tmp_path / "cache"
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    children = [ctx.Process(target=_build_in_child, args=(root, cache, barrier, queue)) for _ in range(3)]
    for child in children:
        child.start()
    results = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert results[0] == results[1] == results[2] and len(results[0]) == 3000
    d = index_dir(root, index_module.IMG_EXTENSIONS, cache)
    assert problem(d) is None and _samples(open_index(root, cache_dir=cache)) == results[0]
    assert [p for p in os.listdir(d.parent) if p.startswith(".")] == []  # no temporary leftovers


def test_a_built_index_stays_readable_when_a_newer_build_replaces_its_directory(tmp_path, tree):
    """What a concurrent builder does after this one published: move the directory aside and delete it."""
    import shutil

    d = index_dir(tree, index_module.IMG_EXTENSIONS, tmp_path / "cache")
    index = index_module.build(tree, index_module.IMG_EXTENSIONS, d)
    shutil.rmtree(d)
    assert len(_samples(index)) == 18 and index.dirs()


def test_a_run_reads_its_own_index_when_another_process_rebuilds_the_shared_cache(tmp_path):
    """Run A has split its data; run B, sharing the cache, re-indexes the changed tree into the same
    directory. A's forked workers keep the maps they inherit; a worker that maps afresh (spawn) refuses."""
    from torch.utils.data import DataLoader

    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.arrays import CacheReplacedError

    root = simple_tree(tmp_path / "tree", per_class=4)
    mine = FolderSource(root, cache_dir=tmp_path / "cache", val_fraction=0.25)
    mine.prepare()
    records = mine.split("train")  # the main process reads no sample: its workers do
    copy = pickle.loads(pickle.dumps(records))
    expected = [(copy.describe(i), copy[i][1]) for i in range(len(copy))]
    make_tree(root, {"cat": ["000a.png"]}, backdate=False)  # sorts second: every later row shifts
    theirs = FolderSource(root, cache_dir=tmp_path / "cache", val_fraction=0.25)
    theirs.prepare()
    theirs.split("train")
    forked = DataLoader(SampleDataset(records, with_paths=True), batch_size=None, num_workers=2)
    assert sorted((path, int(label)) for _, label, path in forked) == sorted(expected)
    spawned = pickle.loads(pickle.dumps(records))
    with pytest.raises(CacheReplacedError, match=r"rebuilt by another process .* own paths\.cache_dir"):
        spawned[0]


def test_a_split_another_process_draws_again_with_the_same_rows_is_the_same_split(tmp_path, tree):
    """Ranks or runs that split at the same moment each write the (identical) split file: a worker that
    maps afresh reads the same rows, not an error."""
    import numpy as np

    from feedline.datasets.cache import save_array

    records = FolderSource(tree, cache_dir=tmp_path / "cache", val_fraction=0.25).split("train")
    rows = np.array(records.subset.array)
    save_array(records.subset.path, rows.copy())  # another inode, the same bytes
    spawned = pickle.loads(pickle.dumps(records))
    assert [spawned.row(i) for i in range(len(spawned))] == rows.tolist()


def test_symlink_loop_is_reported_and_skipped(tmp_path, caplog):
    root = make_tree(tmp_path / "t", {"a": ["1.png", "sub/2.png"], "b": ["3.png"]})
    os.symlink(os.path.join(root, "a"), os.path.join(root, "a", "sub", "back"))
    os.symlink(root, os.path.join(root, "b", "top"))
    with caplog.at_level(logging.WARNING):
        index = open_index(root, cache_dir=tmp_path / "cache")
    samples = _samples(index)
    # b/top -> the root would index class a's images again, under label b: a loop like any other
    assert samples == [("a/1.png", 0), ("a/sub/2.png", 0), ("b/3.png", 1)]
    assert "symlink loop" in caplog.text and "a/sub/back" in caplog.text and "b/top" in caplog.text


def test_a_link_to_a_folder_above_the_root_is_a_loop_too(tmp_path, caplog):
    root = make_tree(tmp_path / "data" / "t", {"a": ["1.png"], "b": ["2.png"]})
    os.symlink(tmp_path / "data", os.path.join(root, "b", "up"))
    with caplog.at_level(logging.WARNING):
        assert _samples(open_index(root, cache_dir=tmp_path / "cache")) == [("a/1.png", 0), ("b/2.png", 1)]
    assert "b/up" in caplog.text


def test_a_fifo_named_like_an_image_is_skipped_and_reported(tmp_path, caplog):
    root = make_tree(tmp_path / "t", {"a": ["1.png"], "b": ["2.png"]})
    os.mkfifo(os.path.join(root, "a", "x.jpg"))
    with caplog.at_level(logging.WARNING):
        index = open_index(root, cache_dir=tmp_path / "cache")
    assert _samples(index) == [("a/1.png", 0), ("b/2.png", 1)]
    assert "not regular files" in caplog.text and "a/x.jpg" in caplog.text


def test_reading_a_fifo_is_an_error_not_a_hang(tmp_path):
    from feedline.datasets.records import read_bytes

    os.mkfifo(tmp_path / "x.jpg")
    with pytest.raises(OSError, match="not a regular file"):
        read_bytes(str(tmp_path / "x.jpg"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists every folder, whatever its mode")
def test_a_folder_that_could_not_be_listed_is_listed_again_next_time(tmp_path, caplog):
    root = make_tree(tmp_path / "t", {"a": ["1.png"], "b": ["2.png", "sub/3.png"]})
    sub = os.path.join(root, "b", "sub")
    os.chmod(sub, 0)
    try:
        with caplog.at_level(logging.WARNING):
            assert _samples(open_index(root, cache_dir=tmp_path / "cache")) == [
                ("a/1.png", 0),
                ("b/2.png", 1),
            ]
        assert "could not be listed" in caplog.text and "b/sub" in caplog.text
    finally:
        os.chmod(sub, 0o755)  # chmod changes the ctime, not the mtime that staleness compares
    assert _samples(open_index(root, cache_dir=tmp_path / "cache"))[-1] == ("b/sub/3.png", 1)


def test_an_unreadable_folder_forces_a_rescan(tmp_path, monkeypatch):
    """The same as above, for a root user too: a listing that fails once is recorded as never seen."""
    import feedline.datasets.folder.scan as scan

    root = make_tree(tmp_path / "t", {"a": ["1.png"], "b": ["2.png", "sub/3.png"]})
    real = os.scandir

    def failing(path):
        if str(path).endswith(os.path.join("b", "sub")):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(scan.os, "scandir", failing)
    assert _samples(open_index(root, cache_dir=tmp_path / "cache", workers=1))[-1] == ("b/2.png", 1)
    monkeypatch.setattr(scan.os, "scandir", real)
    assert _samples(open_index(root, cache_dir=tmp_path / "cache", workers=1))[-1] == ("b/sub/3.png", 1)


def test_parity_with_imagefolder_holds_after_a_rebuild(tmp_path, tree):
    cache = tmp_path / "cache"
    open_index(tree, cache_dir=cache)
    make_tree(tree, {"bee": ["x.png", "y/z.png"], "dog": ["a/b.png", "0.png"]}, backdate=False)
    index = open_index(tree, cache_dir=cache)
    reference = ImageFolder(tree, loader=lambda p: p)
    assert index.classes == reference.classes
    assert _samples(index) == [(os.path.relpath(p, tree), t) for p, t in reference.samples]


def test_pickled_records_stay_small_as_the_tree_grows(tmp_path):
    sizes = []
    for n in (10, 2000):
        root = simple_tree(tmp_path / f"t{n}", classes=("a", "b"), per_class=n, ext=".txt")
        for dirpath, _, files in os.walk(root):
            for f in files:
                os.rename(os.path.join(dirpath, f), os.path.join(dirpath, f[:-4] + ".jpg"))
        source = FolderSource(root, val_fraction=0.1, cache_dir=tmp_path / "cache")
        sizes.append(len(pickle.dumps(source.split("train"))))
    assert sizes[1] - sizes[0] < 64 and sizes[1] < 8 * 1024


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_parallel_scans_equal_the_serial_scan(tmp_path, monkeypatch, kind):
    import feedline.datasets.folder.scan_plan as plan
    from tests.test_folder_index import AWKWARD

    root = make_tree(tmp_path / "t", {**AWKWARD, **{f"c{i}": [f"{i}.png"] for i in range(8)}})
    serial = open_index(root, cache_dir=tmp_path / "c1", workers=1)
    monkeypatch.setattr(plan, "filesystem_type", lambda path: "nfs" if kind == "threads" else "ext4")
    assert plan.scan_plan(root, 2) == (kind, 2)
    parallel = open_index(root, cache_dir=tmp_path / "c2", workers=2)
    assert _samples(serial) == _samples(parallel) and serial.classes == parallel.classes


def test_auto_workers_pick_threads_on_network_filesystems(monkeypatch, tmp_path):
    import feedline.datasets.folder.scan_plan as plan

    monkeypatch.setattr(plan, "filesystem_type", lambda path: "nfs4")
    assert plan.scan_plan(str(tmp_path)) == ("threads", 16)
    monkeypatch.setattr(plan, "filesystem_type", lambda path: "ext4")
    assert (
        plan.scan_plan(str(tmp_path)) == ("processes", min(8, plan.available_cpus()))
        or plan.available_cpus() == 1
    )
    assert plan.scan_plan(str(tmp_path), 1) == ("serial", 1)
    with pytest.raises(ValueError, match="source.scan_workers"):
        plan.scan_plan(str(tmp_path), 0)


def test_filesystem_type_takes_the_longest_mount_above_the_path(tmp_path):
    from feedline.datasets.folder.scan_plan import filesystem_type

    table = tmp_path / "mounts"
    table.write_text(
        "rootfs / ext4 rw 0 0\n"
        "server:/export /data nfs4 rw 0 0\n"
        "lustre@tcp:/fs /data/fast\\040lane lustre rw 0 0\n"  # a space in a mount point is written \040
        "short line\n"
    )
    assert filesystem_type("/data/train/cat", str(table)) == "nfs4"
    assert filesystem_type("/data/fast lane/x", str(table)) == "lustre"
    assert filesystem_type("/database", str(table)) == "ext4"  # /data is not a prefix of /database
    assert filesystem_type("/x", str(tmp_path / "no-such-table")) == ""


def test_a_failing_scan_worker_is_an_error_not_a_partial_index(tmp_path, monkeypatch):
    import feedline.datasets.folder.scan as scan
    import feedline.datasets.folder.scan_plan as plan

    root = make_tree(tmp_path / "t", {f"c{i}": [f"{i}.png"] for i in range(6)})
    monkeypatch.setattr(
        scan,
        "_WORKER",
        [sys.executable, "-c", "import sys; sys.stderr.write('PermissionError: denied\\n'); sys.exit(1)"],
    )
    monkeypatch.setattr(plan, "filesystem_type", lambda path: "ext4")
    with pytest.raises(OSError, match="scanning .* failed: PermissionError: denied"):
        open_index(root, cache_dir=tmp_path / "cache", workers=2)
    assert problem(index_dir(root, index_module.IMG_EXTENSIONS, tmp_path / "cache")) == "missing"


def test_a_scan_worker_that_dies_before_reading_its_tasks_is_named(tmp_path, monkeypatch):
    """The task list (here over a pipe buffer's worth) meets a closed pipe: the error still says why."""
    import feedline.datasets.folder.scan as scan

    monkeypatch.setattr(
        scan,
        "_WORKER",
        [sys.executable, "-c", "import sys; sys.stderr.write('PermissionError: denied\\n'); sys.exit(1)"],
    )
    classes = [f"class-{i:06d}-" + "x" * 100 for i in range(4000)]
    with pytest.raises(OSError, match="scanning .* failed: PermissionError: denied"):
        scan._scan_in_workers(str(tmp_path), classes, (".png",), 2, bar=None)


def test_garbled_staleness_signature_is_rebuilt(tmp_path, tree, caplog):
    cache = tmp_path / "cache"
    open_index(tree, cache_dir=cache)
    d = index_dir(tree, index_module.IMG_EXTENSIONS, cache)
    (d / "dirs.json").write_text("[[broken")
    with caplog.at_level(logging.WARNING):
        assert len(open_index(tree, cache_dir=cache)) == 18
    assert "unusable" in caplog.text and problem(d) is None


def test_a_class_folder_linked_to_another_class_is_reported(tmp_path, caplog):
    root = make_tree(tmp_path / "t", {"a": ["1.png"], "c": ["2.png"]})
    os.symlink(os.path.join(root, "a"), os.path.join(root, "b"))
    with caplog.at_level(logging.WARNING):
        open_index(root, cache_dir=tmp_path / "cache")
    assert "b (= a)" in caplog.text and "both labels" in caplog.text

"""Shards: written by convert.py out.format=shards (LitData's writer), read by source=shards."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from feedline.convert import run_convert
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.shards.chunks import Chunks, dataset_dirs
from feedline.writers.options import WriteOptions
from feedline.writers.shards.write import rows_to_write
from tests.conftest import ROOT_DIR
from tests.helpers import make_tree, simple_tree


def _convert(make_cfg, tree, out, *overrides):
    cfg = make_cfg(
        "source=folder",
        f"source.root={tree}",
        "out.format=shards",
        f"out.path={out}",
        "out.chunk_bytes=2KB",
        "out.workers=2",
        *overrides,
        config="convert",
    )
    return run_convert(cfg)


# -- writing --------------------------------------------------------------------------------------------
def test_a_tree_converts_to_shards_that_litdata_and_feedline_read_alike(make_cfg, tmp_path):
    from litdata import StreamingDataset

    tree = simple_tree(tmp_path / "tree", per_class=10)
    summary = _convert(make_cfg, tree, tmp_path / "shards")
    assert summary["images"] == 30 and summary["skipped"] == 0
    chunks = Chunks.of(dataset_dirs(str(tmp_path / "shards")))
    assert len(chunks.files) > 2  # several chunks, from both workers
    records = FolderSource(tree, val_fraction=0, cache_dir=tmp_path / "c").split("all")
    rows = rows_to_write(30, WriteOptions(path="x", format="shards"))
    theirs = StreamingDataset(str(tmp_path / "shards"), shuffle=False)
    labels = np.load(tmp_path / "shards" / "labels.npy")
    for i in range(30):
        image, label = chunks.read(i)
        payload, expected = records[int(rows[i])]
        assert bytes(image) == bytes(payload) and label == expected == labels[i]
        assert theirs[i] == (bytes(image), label)
    assert not glob.glob(str(tmp_path / ".shards.tmp-*"))  # the work directory is gone


def test_unreadable_inputs_are_skipped_and_listed_in_the_shards(make_cfg, tmp_path):
    tree = make_tree(tmp_path / "tree", {c: [f"{i}.png" for i in range(4)] + ["x.jpg"] for c in "ab"})
    for c in "ab":
        (tmp_path / "tree" / c / "x.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    summary = _convert(make_cfg, tree, tmp_path / "shards")
    assert summary["images"] == 8 and summary["skipped"] == 2
    report = (tmp_path / "shards" / "skipped.tsv").read_text()
    assert os.path.join(tree, "a", "x.jpg") in report and os.path.join(tree, "b", "x.jpg") in report
    assert len(np.load(tmp_path / "shards" / "labels.npy")) == 8


@pytest.mark.parametrize(
    "override, said",
    [
        ("out.mode=raw", "out.mode=raw is not offered with out.format=shards"),
        ("out.chunk_bytes=5TB", "out.chunk_bytes='5TB' must be a size from 1KB to 2GiB"),
        ("out.part=1", "set both"),
        # numpy's bare "expected non-negative integer" came after the scan
        ("out.seed=-1", "out.seed=-1 must be"),
    ],
)
def test_shards_options_out_of_range_are_refused_by_key(make_cfg, tmp_path, override, said):
    tree = simple_tree(tmp_path / "tree", per_class=2)
    with pytest.raises(ValueError, match=said):
        _convert(make_cfg, tree, tmp_path / "shards", override)
    assert not (tmp_path / "shards").exists()


def test_a_directory_of_other_files_is_never_overwritten(make_cfg, tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=2)
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "thesis.tex").write_text("mine")
    with pytest.raises(ValueError, match="holds files that are not a whole shards dataset.s own"):
        _convert(make_cfg, tree, tmp_path / "shards")
    assert (tmp_path / "shards" / "thesis.tex").read_text() == "mine"


def test_converting_again_replaces_the_dataset_whole(make_cfg, tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=6)
    _convert(make_cfg, tree, tmp_path / "shards")
    _convert(make_cfg, tree, tmp_path / "shards", "out.chunk_bytes=100KB")
    assert len(Chunks.of([str(tmp_path / "shards")]).files) <= 2  # one per worker: nothing of the first run


SLOW_CONVERSION = """
import os, sys, time
from feedline.datasets.folder.source import FolderSource
from feedline.writers.shards import convert
from feedline.writers.options import WriteOptions

class Slow:
    def __init__(self, records): self.records = records
    def __len__(self): return len(self.records)
    def __getitem__(self, i):
        time.sleep(float(os.environ.get("SLOW", "0")))
        return self.records[i]
    def describe(self, i): return self.records.describe(i)

tree, out, part, parts = sys.argv[1:5]
records = FolderSource(tree, val_fraction=0, cache_dir=out + ".cache").split("all")
options = WriteOptions(path=out, format="shards", workers=2, chunk_bytes="2KB")
if parts != "-":
    options.part, options.parts = int(part), int(parts)
print(os.getpid(), flush=True)
print(convert(Slow(records), ["cat", "dog", "eel"], options)["images"], flush=True)
"""


def _conversion(tree, out, part="-", parts="-", slow="0"):
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_CONVERSION, str(tree), str(out), str(part), str(parts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT_DIR,
        env={**os.environ, "SLOW": slow},
    )


@pytest.mark.slow
def test_a_killed_conversion_leaves_nothing_complete_and_a_rerun_starts_clean(tmp_path):
    psutil = pytest.importorskip("psutil")
    tree = simple_tree(tmp_path / "tree", per_class=20)
    out = tmp_path / "shards"
    main = _conversion(tree, out, slow="0.2")
    parent = psutil.Process(int(main.stdout.readline()))
    deadline = time.time() + 60
    while len(parent.children(recursive=True)) < 3 and time.time() < deadline:  # the writer and its workers
        time.sleep(0.1)
    time.sleep(1.0)  # chunks being written
    family = parent.children(recursive=True)
    assert len(family) >= 3
    os.kill(parent.pid, signal.SIGKILL)
    main.wait()
    _, alive = psutil.wait_procs(family, timeout=15)
    for proc in alive:
        proc.kill()
    assert not alive, f"{len(alive)} writer process(es) outlived the conversion"
    assert not out.exists()  # nothing reads as a dataset
    assert glob.glob(str(tmp_path / ".shards.tmp-*"))  # only the work directory, which the rerun removes
    rerun = _conversion(tree, out)
    assert rerun.communicate(timeout=120)[0].split()[-1] == "60" and rerun.returncode == 0
    assert not glob.glob(str(tmp_path / ".shards.tmp-*"))
    assert Chunks.of(dataset_dirs(str(out))).total == 60


@pytest.mark.slow
def test_two_parts_written_by_two_processes_read_as_one_dataset_in_part_order(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=7)
    out = tmp_path / "shards"
    first = _conversion(tree, out, 0, 2)
    with pytest.raises(
        FileNotFoundError, match=r"in 2 parts, and 1 is missing or unfinished: part-00001-of-00002"
    ):
        first.communicate(timeout=120)
        dataset_dirs(str(out))
    jobs = [_conversion(tree, out, 1, 2)]
    for job in jobs:
        assert job.communicate(timeout=120)[0].split()[-1] in ("10", "11") and job.returncode == 0
    dirs = dataset_dirs(str(out))
    assert [os.path.basename(d) for d in dirs] == ["part-00000-of-00002", "part-00001-of-00002"]
    chunks = Chunks.of(dirs)
    records = FolderSource(tree, val_fraction=0, cache_dir=tmp_path / "c").split("all")
    rows = rows_to_write(21, WriteOptions(path="x", format="shards"))  # the parts are slices of one order
    assert chunks.total == 21
    assert all(bytes(chunks.read(i)[0]) == bytes(records[int(rows[i])][0]) for i in range(21))


# -- reading: source=shards -------------------------------------------------------------------------------
@pytest.fixture
def shards(make_cfg, tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=10)
    _convert(make_cfg, tree, tmp_path / "shards")
    return str(tmp_path / "shards")


def test_source_shards_reads_every_sample_with_its_label_and_pickles_small(shards, tmp_path):
    import pickle

    from feedline.datasets.shards.source import ShardsSource

    source = ShardsSource(shards, val_fraction=0.2, cache_dir=tmp_path / "c")
    source.prepare()
    train, val = source.split("train"), source.split("val")
    assert source.classes == ["cat", "dog", "eel"] and (len(train), len(val)) == (24, 6)
    assert np.bincount([val[i][1] for i in range(6)]).tolist() == [2, 2, 2]  # stratified
    again = pickle.loads(pickle.dumps(train))
    assert (
        len(pickle.dumps(train)) < 2000 and again.chunks._maps is None
    )  # paths and numbers; maps opened lazily
    rows = [train.row(i) for i in range(24)] + [val.row(i) for i in range(6)]
    assert sorted(rows) == list(range(30))
    assert bytes(again[3][0]) == bytes(train[3][0]) and again[3][1] == train[3][1]


def test_a_held_out_shards_directory_is_the_val_split(make_cfg, shards, tmp_path):
    from feedline.datasets.shards.source import ShardsSource

    _convert(make_cfg, simple_tree(tmp_path / "v", per_class=2), tmp_path / "val")
    source = ShardsSource(shards, val_path=tmp_path / "val", val_fraction=0.3, cache_dir=tmp_path / "c")
    source.prepare()
    assert (len(source.split("train")), len(source.split("val"))) == (30, 6)
    _convert(make_cfg, simple_tree(tmp_path / "o", classes=("ant", "bee"), per_class=2), tmp_path / "other")
    with pytest.raises(ValueError, match="source.val_path .* has classes"):
        ShardsSource(shards, val_path=tmp_path / "other", cache_dir=tmp_path / "c").prepare()


def test_a_missing_or_truncated_chunk_is_named_with_its_path(shards, tmp_path):
    from feedline.datasets.shards.chunks import ChunkError
    from feedline.datasets.shards.source import ShardsSource

    records = ShardsSource(shards, val_fraction=0, cache_dir=tmp_path / "c").split("train")
    first, last = records.chunks.files[0], records.chunks.files[-1]
    with open(last, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ChunkError, match=rf"chunk {re.escape(last)} holds 100 bytes, index.json says"):
        records[records.total - 1]
    os.remove(first)
    with pytest.raises(ChunkError, match=rf"chunk {re.escape(first)} is missing"):
        ShardsSource(shards, val_fraction=0, cache_dir=tmp_path / "c").prepare()


def test_compressed_encrypted_or_arrow_footer_chunks_are_refused(shards, tmp_path):
    import json

    from feedline.datasets.shards.chunks import ARROW_TAIL, ChunkError
    from feedline.datasets.shards.source import ShardsSource

    index_path = os.path.join(shards, "index.json")
    index = json.loads(Path(index_path).read_text())
    for key, value in (("compression", "zstd"), ("encryption", "FernetEncryption")):
        changed = {**index, "config": {**index["config"], key: value}}
        Path(index_path).write_text(json.dumps(changed))
        with pytest.raises(ChunkError, match=f"{key}="):
            ShardsSource(shards, cache_dir=tmp_path / "c")
    chunk = os.path.join(shards, index["chunks"][0]["filename"])
    with open(chunk, "ab") as f:
        f.write(ARROW_TAIL)
    index["chunks"][0]["chunk_bytes"] += len(ARROW_TAIL)
    Path(index_path).write_text(json.dumps(index))
    with pytest.raises(ChunkError, match="Arrow footer"):
        ShardsSource(shards, val_fraction=0, cache_dir=tmp_path / "c").split("train")[0]


def test_a_bad_image_in_a_chunk_follows_on_bad_sample(shards, tmp_path):
    import struct

    from feedline.datamodules.bad_samples import BadSampleError
    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.shards.source import ShardsSource

    records = ShardsSource(shards, val_fraction=0, cache_dir=tmp_path / "c").split("train")
    path = records.chunks.files[0]
    with open(path, "r+b") as f:
        f.seek(8)
        start = struct.unpack("<I", f.read(4))[0]  # sample 1 of the chunk
        f.seek(start + 8)
        f.write(b"\0" * 16)  # its PNG signature and header
    with pytest.raises(BadSampleError, match=rf"bad sample {re.escape(path)}\[1\]"):
        SampleDataset(records, on_bad_sample="raise")[1]
    image, label = SampleDataset(records, on_bad_sample="skip", max_bad_fraction=0.5)[1]
    assert image.shape[0] == 3  # the next readable sample instead


# -- the chunk-aware order ------------------------------------------------------------------------------
def _records(sizes, window, subset=None):
    from feedline.datasets.arrays import InMemoryArray
    from feedline.datasets.shards.source import ShardsRecords

    chunks = Chunks([f"chunk-{c}.bin" for c in range(len(sizes))], sizes, [0] * len(sizes))
    return ShardsRecords(chunks, window, InMemoryArray(subset) if subset is not None else None)


@pytest.mark.parametrize("world, batch", [(1, 6), (2, 3), (3, 2)])
def test_the_chunk_order_reads_each_sample_once_and_a_batch_touches_a_bounded_number_of_chunks(world, batch):
    from feedline.datamodules.epoch.sampler import EpochSampler

    sizes, window = (
        [7, 9, 8, 7, 10, 7, 8, 9, 7, 8],
        1,
    )  # each chunk keeps >= 6 samples of the split >= batch * world
    rows = np.flatnonzero(np.arange(80) % 8 != 3)[:70]  # a split: a subset of the rows
    records = _records(sizes, window, rows)
    chunk_of = records.chunks.chunk_of(rows)
    orders = [records.epoch_order(3, epoch) for epoch in (0, 1)]
    assert not np.array_equal(*orders) and np.array_equal(orders[0], records.epoch_order(3, 0))
    for epoch in (0, 1):
        read = []
        for rank in range(world):
            sampler = EpochSampler(70, world, rank, True, 3, False, epoch_order=records.epoch_order)
            sampler.set_epoch(epoch)
            mine = [i for i, _ in sampler]
            read += mine
            for k in range(0, len(mine), batch):
                assert len(set(chunk_of[mine[k : k + batch]])) <= 2 * window
        assert sorted(set(read)) == list(range(70))  # every sample (padding repeats a few, as ever)


def test_a_global_shuffle_would_touch_every_chunk_in_a_batch():
    records = _records([4] * 16, 1)
    batch = 16
    windowed = records.epoch_order(0, 0)[:batch]
    shuffled = np.random.default_rng(0).permutation(64)[:batch]
    chunk_of = records.chunks.chunk_of(np.arange(64))
    assert len(set(chunk_of[windowed])) <= 5 < len(set(chunk_of[shuffled]))


@pytest.mark.parametrize(("world", "batch", "new_world", "new_batch"), [(2, 3, 1, 5), (1, 4, 2, 3)])
def test_a_shards_run_resumes_on_another_world_and_batch_size_reading_the_rest_once(
    make_cfg, tmp_path, world, batch, new_world, new_batch
):
    from feedline.datasets.shards.source import ShardsSource
    from tests.test_resume import digests, per_sample, world_loaders

    classes = [f"c{k:02d}" for k in range(24)]  # one image each: a label names its sample
    tree = simple_tree(tmp_path / "tree", classes=classes, per_class=1)
    _convert(make_cfg, tree, tmp_path / "shards", "out.chunk_bytes=1KB")

    def loaders(w, b):
        source = ShardsSource(tmp_path / "shards", val_fraction=0, window=2, cache_dir=tmp_path / "c")
        assert len(source.split("train").chunks.files) >= 6
        return world_loaders(source, tree, w, b)

    whole_loader = loaders(1, 4)[0]
    assert whole_loader.sampler.epoch_order is not None  # the shards' own order
    whole = per_sample(digests(whole_loader))
    first = loaders(world, batch)
    before = [b for loader in first for b in digests(loader, 2)]
    state = first[0].state_dict()
    second = loaders(new_world, new_batch)
    for loader in second:
        loader.load_state_dict(state)
    ranks = [digests(loader) for loader in second]
    assert len({len(batches) for batches in ranks}) == 1
    assert per_sample(before + [b for batches in ranks for b in batches]) == whole
    again = loaders(1, 4)[0]
    digests(again, 2)
    resumed = loaders(1, 4)[0]
    resumed.load_state_dict(again.state_dict())
    rest = digests(resumed)
    full = digests(loaders(1, 4)[0])
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[2:], rest))
    assert len(rest) == len(full) - 2


@pytest.mark.parametrize(
    "change, said",
    [
        (
            "source.window=1",
            r"'window 2 over (\d+) chunks \(\w+\)' then, 'window 1 over \1 chunks \(\w+\)' now",
        ),
        (
            "out.chunk_bytes=1KB",
            r"'window 2 over \d+ chunks \(\w+\)' then, 'window 2 over \d+ chunks \(\w+\)' now",
        ),
    ],
)
def test_a_resume_in_another_chunk_order_is_refused_by_name(make_cfg, tmp_path, change, said):
    """The order depends on source.window and the chunks too: a resume that draws another one would read
    samples twice and miss others, so it is refused like a changed seed, even with the same split."""
    from feedline.datamodules.epoch.checks import ResumeError
    from feedline.datasets.shards.source import ShardsSource
    from tests.test_resume import digests, world_loaders

    tree = simple_tree(tmp_path / "tree", per_class=8)
    _convert(make_cfg, tree, tmp_path / "shards")

    def loader(path, window):
        source = ShardsSource(path, val_fraction=0, window=window, cache_dir=tmp_path / "c")
        return world_loaders(source, tree, 1, 4)[0]

    first = loader(tmp_path / "shards", 2)
    digests(first, 2)
    state = first.state_dict()
    _convert(make_cfg, tree, tmp_path / "again")  # the same samples in the same chunks: the same order
    loader(tmp_path / "again", 2).load_state_dict(state)
    if change == "source.window=1":
        other = loader(tmp_path / "shards", 1)
    else:
        _convert(make_cfg, tree, tmp_path / "other", change)
        other = loader(tmp_path / "other", 2)
    assert other.checks["split"] == first.checks["split"]  # the same rows: only the order differs
    with pytest.raises(ResumeError, match=rf"train order \(shards: source.window over the chunks.*\) {said}"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    "written, said", [((0,), "1 is missing or unfinished"), ((), "2 are missing or unfinished")]
)
def test_missing_parts_are_counted_in_words(tmp_path, written, said):
    for k in written:  # a complete part: its index.json and sidecar (their contents are read later)
        part = tmp_path / f"part-0000{k}-of-00002"
        part.mkdir()
        (part / "index.json").write_text("{}")
        (part / "feedline.json").write_text("{}")
    for k in set(range(2)) - set(written):
        (tmp_path / f"part-0000{k}-of-00002").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"in 2 parts, and {said}: "):
        dataset_dirs(str(tmp_path))

"""Shards under hostile input: what an adversarial review found, each fault injected once."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import numpy as np
import pytest

from feedline.datasets.shards.chunks import ChunkError
from feedline.datasets.shards.source import ShardsSource
from tests.helpers import simple_tree
from tests.test_shards import _convert


def _images(records) -> list[str]:
    return [hashlib.md5(bytes(records[i][0])).hexdigest() for i in range(len(records))]


def test_parts_written_in_different_orders_are_refused_not_read_with_repeats(make_cfg, tmp_path):
    """Part 0 drawn with out.seed=0 and part 1 with out.seed=1 slice two different permutations: read together
    they held some images twice and others never (silently)."""
    tree = simple_tree(tmp_path / "tree", per_class=10)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out, "out.parts=2", "out.part=0", "out.seed=0")
    _convert(make_cfg, tree, out, "out.parts=2", "out.part=1", "out.seed=1")
    with pytest.raises(ValueError, match="out.seed"):
        ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c")


def test_parts_of_a_source_that_changed_between_them_are_refused(make_cfg, tmp_path):
    """One more image in the tree between two parts' jobs: another permutation, so the same silent repeats."""
    tree = simple_tree(tmp_path / "tree", per_class=10)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out, "out.parts=2", "out.part=0")
    simple_tree(tmp_path / "tree", per_class=11)
    _convert(make_cfg, tree, out, "out.parts=2", "out.part=1")
    with pytest.raises(ValueError, match="samples"):
        ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c")


def test_consistent_parts_still_read_as_one_dataset_each_image_once(make_cfg, tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=10)
    out = tmp_path / "shards"
    for k in range(3):
        _convert(make_cfg, tree, out, "out.parts=3", f"out.part={k}", "out.seed=4")
    records = ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c").split("train")
    assert len(records) == 30 and len(set(_images(records))) == 30


def test_more_parts_than_samples_is_refused_before_any_part_is_written(make_cfg, tmp_path):
    """out.parts=16 over 6 images: ten parts are empty, which the writer refused one by one, after the
    others were written, leaving a dataset that could never be completed."""
    tree = simple_tree(tmp_path / "tree", per_class=2)
    with pytest.raises(ValueError, match="out.parts=16"):
        _convert(make_cfg, tree, tmp_path / "shards", "out.parts=16", "out.part=1")
    assert not os.path.exists(tmp_path / "shards" / "part-00001-of-00016")


def test_a_dataset_converted_again_under_a_running_reader_is_refused_not_read(make_cfg, tmp_path):
    """A new worker (a new epoch, spawn) of a run whose out.path was converted again (another out.seed) read
    the new chunks under the old split's rows: validation images in the train split, silently."""
    tree = simple_tree(tmp_path / "tree", per_class=10)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out, "out.seed=0")
    source = ShardsSource(out, val_fraction=0.2, cache_dir=tmp_path / "c")
    source.prepare()
    train = source.split("train")
    blob = pickle.dumps(train)  # what a worker gets
    _convert(make_cfg, tree, out, "out.seed=7")
    worker = pickle.loads(blob)
    with pytest.raises(ChunkError, match="replaced"):
        worker[0]


@pytest.mark.parametrize("name", ["feedline.json", "index.json"])
def test_a_garbled_sidecar_or_index_names_its_file(make_cfg, tmp_path, name):
    tree = simple_tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out)
    (out / name).write_text('{"format": "feedline-sha')
    with pytest.raises((ValueError, ChunkError), match=str(out / name)):
        ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c")


def test_a_resume_with_another_window_is_refused_not_read_in_another_order(make_cfg, tmp_path):
    """source.window changes the epoch's order: a position counted in the old order skipped some samples and
    repeated others in the new one."""
    from feedline.datamodules.epoch.checks import ResumeError
    from tests.test_resume import digests, world_loaders

    classes = [f"c{k:02d}" for k in range(24)]
    tree = simple_tree(tmp_path / "tree", classes=classes, per_class=1)
    _convert(make_cfg, tree, tmp_path / "shards", "out.chunk_bytes=1KB")

    def loader(window):
        source = ShardsSource(tmp_path / "shards", val_fraction=0, window=window, cache_dir=tmp_path / "c")
        return world_loaders(source, tree, 1, 4)[0]

    first = loader(2)
    digests(first, 2)
    state = first.state_dict()
    again = loader(2)
    again.load_state_dict(state)  # the same window: fine
    other = loader(5)
    with pytest.raises(ResumeError, match="source.window"):
        other.load_state_dict(state)
    json.dumps(state)  # the state stays plain
    assert np.array_equal(loader(2).sampler.order(), loader(2).sampler.order())


@pytest.mark.parametrize("key", ["val_path", "test_path"])
def test_a_held_out_path_that_is_the_training_data_is_refused(make_cfg, tmp_path, key):
    """source.val_path=<source.path> (or one of its parts) validated on the very samples trained on."""
    tree = simple_tree(tmp_path / "tree", per_class=4)
    out = tmp_path / "shards"
    for k in range(2):
        _convert(make_cfg, tree, out, "out.parts=2", f"out.part={k}")
    for held_out in (f"{out}/", out / "part-00001-of-00002"):
        with pytest.raises(ValueError, match=f"source.{key}"):
            ShardsSource(out, **{key: str(held_out)}, cache_dir=tmp_path / "c").prepare()


def test_a_window_past_the_chunks_is_a_global_shuffle_not_an_overflow(make_cfg, tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=4)
    _convert(make_cfg, tree, tmp_path / "shards")
    records = ShardsSource(tmp_path / "shards", val_fraction=0, window=2**70, cache_dir=tmp_path / "c")
    order = np.asarray(records.split("train").epoch_order(0, 0))
    assert sorted(order.tolist()) == list(range(12))
    same = ShardsSource(tmp_path / "shards", val_fraction=0, window=10**6, cache_dir=tmp_path / "c")
    assert np.array_equal(order, same.split("train").epoch_order(0, 0))


def test_an_out_path_that_is_a_symlink_writes_where_it_points(make_cfg, tmp_path):
    """out.path=/data/link -> /big/disk/shards: the new dataset replaced the link with a directory beside it
    (on the link's filesystem), and the link's target kept the old dataset."""
    tree = simple_tree(tmp_path / "tree", per_class=4)
    target = tmp_path / "big" / "shards"
    _convert(make_cfg, tree, target, "out.seed=1")
    link = tmp_path / "link"
    link.symlink_to(target)
    _convert(make_cfg, tree, link, "out.seed=2")
    assert link.is_symlink()
    assert json.loads((target / "feedline.json").read_text())["seed"] == 2
    assert not [p for p in os.listdir(tmp_path / "big") if p != "shards"]  # no work dir left behind


def test_a_conversion_whose_every_input_is_unreadable_says_so(make_cfg, tmp_path):
    """Every input skipped: LitData wrote an index of no chunks, and the error blamed its layout ("samples of
    None read by None")."""
    tree = tmp_path / "tree"
    for name in ("a/x.png", "a/y.png", "b/z.png"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"all 3 inputs .* unreadable.*x\.png"):
        _convert(make_cfg, tree, tmp_path / "shards")
    assert not os.path.exists(tmp_path / "shards")


@pytest.mark.parametrize("how", ["chunk copied over another", "index.json entries swapped"])
def test_a_chunk_in_the_place_of_another_of_the_same_size_is_refused_when_read(make_cfg, tmp_path, how):
    """chunk-0-1.bin overwritten by chunk-0-2.bin (same size, same sample count), or two index.json entries
    swapped: every check passed, and the run read some images twice and others never, under a split drawn
    from labels.npy that no longer matched them."""
    classes = [f"c{k:02d}" for k in range(12)]  # one image each: each chunk's labels differ from any other's
    tree = simple_tree(tmp_path / "tree", classes=classes, per_class=1)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out, "out.chunk_bytes=1KB")
    index = json.loads((out / "index.json").read_text())
    first, second = index["chunks"][1], index["chunks"][2]
    assert first["chunk_bytes"] == second["chunk_bytes"] and first["chunk_size"] == second["chunk_size"]
    if how == "chunk copied over another":
        (out / first["filename"]).write_bytes((out / second["filename"]).read_bytes())
    else:
        index["chunks"][1], index["chunks"][2] = second, first
        (out / "index.json").write_text(json.dumps(index))
    source = ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c")
    source.prepare()
    records = pickle.loads(pickle.dumps(source.split("train")))  # as a worker reads it
    with pytest.raises(ChunkError, match="labels.npy"):
        for i in range(len(records)):
            records[i]


def test_converting_again_never_removes_files_a_user_added_to_the_dataset_directory(make_cfg, tmp_path):
    """The earlier dataset was replaced whole, with whatever else the directory held (a notes file, a folder
    of held-out data): deleted without a word."""
    tree = simple_tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out)
    (out / "val").mkdir()
    (out / "val" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="val"):
        _convert(make_cfg, tree, out, "out.seed=3")
    assert (out / "val" / "notes.txt").read_text() == "keep me"
    (out / "val" / "notes.txt").unlink()
    (out / "val").rmdir()
    _convert(make_cfg, tree, out, "out.seed=3")  # the dataset's own files alone: replaced
    assert json.loads((out / "feedline.json").read_text())["seed"] == 3


def test_what_another_job_wrote_into_out_path_during_a_conversion_is_never_removed(
    make_cfg, tmp_path, monkeypatch
):
    """A whole conversion to out.path, and meanwhile a part job (its lock is its own folder's) wrote its part
    into out.path: the whole conversion replaced the directory at its end, the finished part with it."""
    from feedline.writers.shards import write

    tree = simple_tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "shards"
    writer = write.run_writer

    def meanwhile(*args, **kwargs):
        writer(*args, **kwargs)
        (out / "part-00000-of-00002").mkdir(parents=True)
        (out / "part-00000-of-00002" / "index.json").write_text("{}")

    monkeypatch.setattr(write, "run_writer", meanwhile)
    with pytest.raises(ValueError, match="out.path"):
        _convert(make_cfg, tree, out)
    assert (out / "part-00000-of-00002" / "index.json").exists()


def _garble_labels(out, how):
    labels = np.load(out / "labels.npy")
    if how == "not npy":
        (out / "labels.npy").write_bytes(b"garbage\n")
    elif how == "2-d":
        np.save(out / "labels.npy", labels.reshape(-1, 1))
    elif how == "float":
        np.save(out / "labels.npy", labels.astype(float) + 0.5)
    else:  # a sidecar without its classes
        sidecar = json.loads((out / "feedline.json").read_text())
        del sidecar["classes"]
        (out / "feedline.json").write_text(json.dumps(sidecar))


@pytest.mark.parametrize("how", ["not npy", "2-d", "float", "no classes"])
def test_garbled_labels_or_sidecar_are_named_with_their_file(make_cfg, tmp_path, how):
    tree = simple_tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out)
    _garble_labels(out, how)
    name = "feedline.json" if how == "no classes" else "labels.npy"
    with pytest.raises(ValueError, match=name):
        source = ShardsSource(out, val_fraction=0.3, cache_dir=tmp_path / "c")
        source.prepare()
        source.split("train")


def _litdata_sample(i):
    return b"x" * (10 + i), i % 2


def test_a_dataset_written_by_plain_litdata_is_named_as_such_not_as_an_unfinished_conversion(tmp_path):
    import multiprocessing

    from litdata import optimize

    method = multiprocessing.get_start_method(allow_none=True)
    try:  # optimize() sets the whole process's start method: the later tests' DataLoaders must still fork
        optimize(
            fn=_litdata_sample,
            inputs=list(range(6)),
            output_dir=str(tmp_path / "lit"),
            chunk_bytes="1KB",
            num_workers=1,
            start_method="fork",
        )
    finally:
        multiprocessing.set_start_method(method, force=True)
    with pytest.raises(FileNotFoundError, match="LitData wrote it without"):
        ShardsSource(tmp_path / "lit", cache_dir=tmp_path / "c")


def test_a_resume_over_shards_converted_again_in_another_order_is_refused(make_cfg, tmp_path):
    """out.path converted again with another out.seed between save and resume: the same number of samples in
    chunks of the same sizes, so the split digest and the chunk layout agreed, but every row holds another
    image: the rest of the epoch repeated some and skipped others."""
    from feedline.datamodules.epoch.checks import ResumeError
    from tests.test_resume import digests, world_loaders

    tree = simple_tree(tmp_path / "tree", per_class=8)
    out = tmp_path / "shards"
    _convert(make_cfg, tree, out, "out.chunk_bytes=1KB", "out.seed=0")

    def loader():
        source = ShardsSource(out, val_fraction=0, window=2, cache_dir=tmp_path / "c")
        return world_loaders(source, tree, 1, 4)[0]

    first = loader()
    digests(first, 2)
    state = first.state_dict()
    loader().load_state_dict(state)  # the same data: fine
    sizes = json.loads((out / "index.json").read_text())["chunks"]
    _convert(make_cfg, tree, out, "out.chunk_bytes=1KB", "out.seed=1")
    assert json.loads((out / "index.json").read_text())["chunks"] == sizes  # the same layout
    with pytest.raises(ResumeError, match="source.window"):
        loader().load_state_dict(state)

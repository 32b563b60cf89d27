"""The source contract, checked the same way on every source (DESIGN.md, "Contracts").

Every source reads the same tiny class-folder tree, in its own form: the tree itself (``folder``), its
lazy layout, and its HDF5 conversions. Each must pickle small, give workers the very records the main
process sees, split train/val/test disjointly and by seed, and follow the bad-sample policy. The whole
contract, resume included, is ``feedline.testing.check_source``: a user's own source passes the same check.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

from feedline.datamodules.samples import BadSampleError, SampleDataset
from feedline.datasets import Field, Fields, Source
from feedline.datasets.folder.lazy import LazyFolderSource
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.hdf5.source import HDF5Source
from feedline.datasets.wds.source import WdsSource
from feedline.testing import check_source
from feedline.writers.hdf5 import convert_source
from feedline.writers.lazy_layout import layout
from feedline.writers.options import HDF5WriteOptions
from tests.helpers import image_bytes, make_tree, simple_tree, write_tar

KINDS = ("folder", "lazy_folder", "hdf5", "hdf5_raw", "wds")
PER_CLASS = 10


def make_source(kind: str, tmp_path, corrupt: int | None = None, counts: dict | None = None, **options):
    """``kind`` over a 3-class tree (``counts``: class -> images, else PER_CLASS each); with ``corrupt``,
    sample ``corrupt`` of the "all" split is garbage."""
    if counts:
        tree = make_tree(
            tmp_path / "tree", {c: [f"{i:03d}.png" for i in range(n)] for c, n in counts.items()}
        )
    else:
        tree = simple_tree(tmp_path / "tree", per_class=PER_CLASS)
    cache = tmp_path / "cache"
    if kind == "folder":
        source = FolderSource(tree, cache_dir=cache, **options)
    elif kind == "lazy_folder":
        layout(tree, str(tmp_path / "lazy"), cache_dir=str(cache))
        source = LazyFolderSource(tmp_path / "lazy", cache_dir=cache, **options)
    elif kind == "wds":  # the tree as one WebDataset tar, in its order: <class>/<name>.png + .json
        samples = {}
        for c in sorted(os.listdir(tree)):
            for name in sorted(os.listdir(os.path.join(tree, c))):
                with open(os.path.join(tree, c, name), "rb") as f:
                    samples[f"{c}/{name[:-4]}"] = {"png": f.read(), "json": json.dumps({"label": c}).encode()}
        if corrupt is not None:
            list(samples.values())[corrupt]["png"] = b"not an image at all"
        source = WdsSource(write_tar(tmp_path / "tree.tar", samples), cache_dir=cache, **options)
    else:
        out = HDF5WriteOptions(path=str(tmp_path / f"{kind}.h5"), workers=1)
        if kind == "hdf5_raw":
            out.mode, out.max_side = "raw", 8  # whole images at their aspect ratio: ragged rows
        convert_source(FolderSource(tree, cache_dir=cache), out)
        if corrupt is not None:
            with h5py.File(out.path, "r+") as f:  # packed bytes: the row's own bytes overwritten
                start, end = f["offsets"][corrupt : corrupt + 2]
                garbage = np.frombuffer(b"not an image at all".ljust(end - start, b"\0"), dtype=np.uint8)
                f["images"][start:end] = garbage[: end - start]
        source = HDF5Source(out.path, cache_dir=cache, **options)
    if corrupt is not None and kind in ("folder", "lazy_folder"):
        with open(source.split("all").describe(corrupt), "wb") as f:
            f.write(b"not an image at all")
    source.prepare()
    return source


def rows(records) -> list[tuple[str, int]]:
    return [(records.describe(i), records[i][1]) for i in range(len(records))]


class SquareFields(Source):
    """A tiny source of named fields: an image with a square on it, its mask, the square's area, a caption."""

    fields = Fields(
        [
            Field("image", "image"),
            Field("mask", "mask", classes=("background", "square")),
            Field("area", "number"),
            Field("caption", "text"),
        ],
        target="mask",
    )
    classes = list(fields.classes)

    def __init__(self, count: int = 16, seed: int = 0):
        self.count, self.seed = count, seed

    def prepare(self) -> None:
        pass

    def split(self, name: str) -> SquareRows:
        if name not in ("train", "val"):
            raise ValueError(f"no {name} split")
        rows = np.random.default_rng(self.seed).permutation(self.count)
        return SquareRows(rows[4:] if name == "train" else rows[:4])


class SquareRows:
    def __init__(self, rows):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = int(self.rows[i])
        mask = np.zeros((20, 24), np.uint8)
        mask[: 4 + row, : 4 + row] = 1
        image = np.frombuffer(image_bytes(size=(24, 20), seed=row), np.uint8).copy()  # writable
        return {"image": image, "mask": mask, "area": float(mask.mean()), "caption": f"square {row}"}

    def describe(self, i: int) -> str:
        return f"square {int(self.rows[i])}"


@pytest.mark.parametrize("kind", [*KINDS, "fields"])
def test_every_source_keeps_the_whole_contract_that_check_source_checks(kind, tmp_path):
    if kind == "fields":
        check_source(SquareFields())
    else:
        check_source(make_source(kind, tmp_path, val_fraction=0.3, test_fraction=0.2, seed=1))


@pytest.mark.parametrize("kind", KINDS)
def test_records_pickle_in_constant_size(kind, tmp_path):
    source = make_source(kind, tmp_path)
    for name in ("train", "val", "all"):
        records = source.split(name)
        records[0]  # maps arrays and opens handles: none of that may travel
        assert len(pickle.dumps(records)) < 2048, (name, len(pickle.dumps(records)))


@pytest.mark.parametrize("kind", KINDS)
def test_every_worker_reads_the_records_the_main_process_sees(kind, tmp_path):
    records = make_source(kind, tmp_path).split("train")
    expected = rows(records)
    assert rows(pickle.loads(pickle.dumps(records))) == expected
    dataset = SampleDataset(records, transform=None)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)  # one sample per step, workers alternate
    main = [dataset[i] for i in range(len(dataset))]
    got = list(loader)
    assert [int(label) for _, label in got] == [label for _, label in expected]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for (a, _), (b, _) in zip(got, main))


@pytest.mark.parametrize("kind", KINDS)
def test_splits_are_disjoint_stratified_and_seeded(kind, tmp_path):
    source = make_source(kind, tmp_path, val_fraction=0.3, seed=1)
    train, val, every = (set(rows(source.split(n))) for n in ("train", "val", "all"))
    assert train.isdisjoint(val) and train | val == every
    assert sorted(label for _, label in val) == [0] * 3 + [1] * 3 + [2] * 3  # 0.3 * 10 per class
    again = make_source(kind, tmp_path / "again", val_fraction=0.3, seed=1)
    other = make_source(kind, tmp_path / "other", val_fraction=0.3, seed=2)
    positions = [
        [r.row(i) for i in range(len(r))]
        for r in (source.split("val"), again.split("val"), other.split("val"))
    ]
    assert positions[0] == positions[1] and positions[0] != positions[2]


@pytest.mark.parametrize("kind", KINDS)
def test_a_test_fraction_holds_out_a_third_disjoint_stratified_split(kind, tmp_path):
    source = make_source(kind, tmp_path, val_fraction=0.3, test_fraction=0.2, seed=1)
    train, val, test, every = (set(rows(source.split(n))) for n in ("train", "val", "test", "all"))
    assert train.isdisjoint(val) and train.isdisjoint(test) and val.isdisjoint(test)
    assert train | val | test == every
    assert sorted(label for _, label in test) == [0] * 2 + [1] * 2 + [2] * 2  # 0.2 * 10 per class
    assert sorted(label for _, label in val) == [0] * 3 + [1] * 3 + [2] * 3
    # Without a test share, val is the train/val split's own: adding test_fraction=0 changes nothing.
    plain = make_source(kind, tmp_path / "plain", val_fraction=0.3, seed=1, test_fraction=0.0)
    old = make_source(kind, tmp_path / "old", val_fraction=0.3, seed=1)
    assert [plain.split("val").row(i) for i in range(9)] == [old.split("val").row(i) for i in range(9)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_source_without_a_test_split_says_which_keys_make_one(kind, tmp_path):
    source = make_source(kind, tmp_path, val_fraction=0.3)
    with pytest.raises(
        ValueError, match=r"no test split: set source\.test_(root|path)=.*source\.test_fraction"
    ):
        source.split("test")


@pytest.mark.parametrize("kind", ["folder", "lazy_folder", "hdf5", "wds"])
def test_a_class_the_held_out_shares_would_empty_keeps_a_training_sample_and_is_named(kind, tmp_path, caplog):
    counts = {"big": 10, "pair": 2, "one": 1}
    source = make_source(kind, tmp_path, counts=counts, val_fraction=0.3, test_fraction=0.3, seed=1)
    with caplog.at_level(logging.WARNING):
        train = source.split("train")
    per_class = {
        name: [sorted(label for _, label in rows(source.split(n))).count(c) for n in ("train", "val", "test")]
        for c, name in enumerate(source.classes)
    }
    # 0.3 of 2 rounds half up to 1 for val and 1 for test: test gives one back, so "pair" still trains
    assert per_class == {"big": [4, 3, 3], "one": [1, 0, 0], "pair": [1, 1, 0]} and len(train) == 6
    assert re.search(
        r"would hold out every sample of 1 class\(es\).*'pair' \(2\); each keeps one", caplog.text
    )
    assert "'one'" not in caplog.text and "'big'" not in caplog.text


def test_held_out_shares_round_half_up_per_class_on_the_fraction_as_written():
    from feedline.datasets.splits import held_out

    assert held_out([1, 3, 5, 7], 0.5)[0].tolist() == [0, 2, 3, 4]  # 1 of 1 would leave nothing to train
    assert held_out([50], 0.29)[0].tolist() == [15]  # 14.5 exactly, though 0.29 * 50 == 14.499999999999998
    assert held_out([15, 25], 0.1)[0].tolist() == [2, 3]  # 1.5 and 2.5: both up, never to the even one
    val, test = held_out([4, 3, 2, 1], 0.5, 0.4)  # test gives back first, then val
    assert val.tolist() == [2, 2, 1, 0] and test.tolist() == [1, 0, 0, 0]


@pytest.mark.parametrize("val, test", [(0.6, 0.4), (0.0, 1.0), (0.5, -0.1)])
def test_held_out_shares_must_leave_something_to_train_on(val, test, tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=2)
    with pytest.raises(ValueError, match=r"source\.(val|test)_fraction"):
        FolderSource(tree, val_fraction=val, test_fraction=test)


@pytest.mark.parametrize("kind", ["folder", "lazy_folder", "hdf5", "wds"])  # raw rows are never decoded
def test_bad_sample_is_named_and_skipped_or_raised(kind, tmp_path, caplog):
    source = make_source(kind, tmp_path, corrupt=4, val_fraction=0)
    records = source.split("train")
    bad = records.describe(4)
    with pytest.raises(BadSampleError, match=re.escape(f"bad sample {bad}")):
        SampleDataset(records, on_bad_sample="raise")[4]
    with caplog.at_level(logging.WARNING):
        image, label = SampleDataset(records, on_bad_sample="skip")[4]
    assert f"skipping bad sample {bad}" in caplog.text
    assert label == records[5][1] and image.shape[0] == 3  # the next readable sample stands in
    batch = SampleDataset(records, on_bad_sample="skip").__getitems__([3, 4, 5])
    assert [label for _, label in batch] == [records[3][1], records[5][1], records[5][1]]


def test_test_trees_and_files_are_labelled_by_the_training_classes(tmp_path):
    """source.test_root (folder, lazy_folder) and source.test_path (hdf5): read whole, labelled with the
    classes of the training data, even when the test data lacks a class."""
    tree = simple_tree(tmp_path / "tree", per_class=4)
    held = simple_tree(tmp_path / "held", classes=("dog", "eel"), per_class=2)  # no "cat": labels 1 and 2
    cache = tmp_path / "cache"
    folder = FolderSource(tree, test_root=held, test_fraction=0.5, cache_dir=cache)
    assert folder.test_fraction == 0.0  # the tree replaces the share: train keeps every sample
    layout(held, str(tmp_path / "held_lazy"), cache_dir=str(cache))
    layout(tree, str(tmp_path / "lazy"), cache_dir=str(cache))
    lazy = LazyFolderSource(tmp_path / "lazy", test_root=tmp_path / "held_lazy", cache_dir=cache)
    out = HDF5WriteOptions(path=str(tmp_path / "test.h5"), workers=1)
    convert_source(FolderSource(held, cache_dir=cache), out)
    out_train = HDF5WriteOptions(path=str(tmp_path / "train.h5"), workers=1)
    convert_source(FolderSource(tree, cache_dir=cache), out_train)
    # A file's labels index its own classes (dog=0, eel=1 here); they are read as the training file's.
    hdf5 = HDF5Source(out_train.path, test_path=out.path, cache_dir=cache)
    for source in (folder, lazy, hdf5):
        source.prepare()
        test = source.split("test")
        assert sorted(test[i][1] for i in range(len(test))) == [1, 1, 2, 2]
        assert len(source.split("train")) + len(source.split("val")) == 12
    assert hdf5.split("test").path == out.path


def test_a_test_tree_with_an_unknown_class_is_refused_by_name(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=2)
    held = simple_tree(tmp_path / "held", classes=("cat", "yak"), per_class=1)
    source = FolderSource(tree, test_root=held)
    with pytest.raises(ValueError, match=r"source\.test_root .* classes that source\.root lacks: yak"):
        source.prepare()  # before training, not when trainer.test comes
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^source\.test_root .* has no class folders"):
        FolderSource(tree, test_root=tmp_path / "empty").prepare()

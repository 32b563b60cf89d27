"""Seeded splits at scale: drawn once (a block at a time), then read back by every rank in O(1): no sort of the
labels, no read of a row file to check or digest it, no read of labels.npy, no search of the rows per chunk."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pytest

from feedline.datasets import splits
from feedline.datasets.arrays import InMemoryArray
from feedline.datasets.shards import labels as shard_labels
from feedline.datasets.shards import source as shards_source
from feedline.datasets.shards.source import ShardsSource
from tests.helpers import SplitRows

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import order_scale_data  # noqa: E402 - a simulated shards dataset (sparse chunks, real labels)


def _split_as_drawn_before(counts, fraction, seed, order=None, test_fraction=0.0):
    """``stratified_split`` as it was before the blockwise draw (whole arrays): the reference its output keeps,
    bit for bit, since cached splits and checkpoints name those rows."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    val, test = [], []
    for start, n, k, t in zip(starts, counts, *splits.held_out(counts, fraction, test_fraction)):
        k, t = int(k), int(t)
        if k + t:
            drawn = start + rng.choice(n, size=k + t, replace=False)
            val.append(drawn[:k])
            test.append(drawn[k:])
    total = int(counts.sum())
    held = []
    for part in (val, test):
        idx = np.concatenate(part) if part else np.zeros(0, dtype=np.int64)
        if order is not None:
            idx = np.asarray(order, dtype=np.int64)[idx]
        held.append(np.sort(idx).astype(np.int64))
    mask = np.ones(total, dtype=bool)
    for idx in held:
        mask[idx] = False
    return np.flatnonzero(mask).astype(np.int64), held[0], held[1]


def _labels(n=3000, classes=7, seed=3):
    return np.random.default_rng(seed).integers(0, classes, n)


@pytest.mark.parametrize("test_fraction", [0.0, 0.15])
def test_the_split_drawn_a_block_at_a_time_is_the_split_drawn_before(monkeypatch, tmp_path, test_fraction):
    monkeypatch.setattr(splits, "BLOCK", 97)  # many blocks, one ending inside a run of held rows
    monkeypatch.setattr(shard_labels, "BLOCK", 89)
    labels = _labels()
    counts = np.bincount(labels, minlength=9)  # two classes with no sample
    order = np.argsort(labels, kind="stable")
    for given in (None, order):
        before = _split_as_drawn_before(counts, 0.2, 5, given, test_fraction)
        now = splits.stratified_split(counts, 0.2, 5, given, test_fraction)
        assert all(np.array_equal(a, b) and b.dtype == np.int64 for a, b in zip(before, now))
    before = _split_as_drawn_before(counts, 0.2, 5, order, test_fraction)
    for k, name in enumerate(splits.PARTS if test_fraction else splits.PARTS[:2]):
        lazy = lambda idx: shard_labels.class_order_at([labels[:1000], labels[1000:]], counts, idx)  # noqa: E731
        rows = splits.split_rows(name, counts, 0.2, 5, tmp_path, lazy, test_fraction)
        assert np.array_equal(rows.array, before[k])
        plain = SplitRows(len(labels), InMemoryArray(before[k]))
        assert (
            SplitRows(len(labels), rows).digest() == plain.digest()
        )  # the digest recorded as the file was written


def test_a_cached_split_is_read_back_without_sorting_checking_or_digesting_its_rows(monkeypatch, tmp_path):
    labels = _labels()
    counts = np.bincount(labels)
    drawn = splits.split_rows(
        "train", counts, 0.25, 1, tmp_path, lambda idx: np.argsort(labels, kind="stable")[idx]
    )
    digest = SplitRows(len(labels), drawn).digest()

    def never(*args, **kwargs):
        raise AssertionError("a cached split was sorted, drawn or read whole")

    monkeypatch.setattr(splits, "_held", never)
    monkeypatch.setattr(splits, "_ascending", never)
    monkeypatch.setattr(splits, "split_digest", never)
    for name in ("train", "val"):
        rows = splits.split_rows(name, counts, 0.25, 1, tmp_path, never)
        assert len(rows.array) == len(drawn.array) if name == "train" else len(rows.array) > 0

    class Unread:  # the cached file, whose rows must not be read to digest them
        path = drawn.path

        @property
        def array(self):
            raise AssertionError("the digest read the rows")

    assert SplitRows(len(labels), Unread()).digest() == digest


def test_a_split_cached_before_its_record_held_a_digest_is_checked_once_and_keeps_its_digest(tmp_path):
    labels = _labels()
    counts = np.bincount(labels)
    order = np.argsort(labels, kind="stable")
    paths = splits.split_paths(counts, 0.25, 1, tmp_path)
    for path, rows in zip(paths.values(), _split_as_drawn_before(counts, 0.25, 1, order)):
        splits.save_array(path, rows)  # as the earlier version wrote it: a checksum, no digest
    assert "rows" not in json.loads(paths["train"].with_name(paths["train"].name + ".sum").read_text())
    rows = splits.split_rows("train", counts, 0.25, 1, tmp_path, lambda idx: 1 / 0)  # read back, never drawn
    record = json.loads(paths["train"].with_name(paths["train"].name + ".sum").read_text())
    assert record["rows"]["total"] == len(labels)
    assert (
        SplitRows(len(labels), rows).digest()
        == SplitRows(len(labels), InMemoryArray(np.load(paths["train"]))).digest()
    )


def test_a_cached_split_out_of_order_is_drawn_again(tmp_path, caplog):
    labels = _labels()
    counts = np.bincount(labels)
    paths = splits.split_paths(counts, 0.25, 1, tmp_path)
    train, val, _ = splits.stratified_split(counts, 0.25, 1)
    splits.save_array(paths["train"], train[::-1].copy())  # an earlier file with no record of its checks
    splits.save_array(paths["val"], val)
    assert np.array_equal(splits.split_rows("train", counts, 0.25, 1, tmp_path).array, train)
    assert "out of order" in caplog.text


@pytest.fixture
def simulated(tmp_path, monkeypatch):
    monkeypatch.setattr(order_scale_data, "CLASSES", 5)
    return order_scale_data.ensure_shards(str(tmp_path / "data"), 2000, per_chunk=64)


def test_a_rank_on_a_prepared_shards_dataset_reads_no_label_sorts_nothing_and_searches_no_chunk(
    simulated, tmp_path, monkeypatch
):
    cache = tmp_path / "cache"
    first = ShardsSource(simulated, val_fraction=0.1, test_fraction=0.1, cache_dir=cache)
    first.prepare()  # local rank 0: draws the splits, records the labels and each split's chunk bounds
    drawn = {name: first.split(name) for name in ("train", "val", "test")}
    expected = {
        name: (np.asarray(r.subset.array), r.digest(), r.order_identity()) for name, r in drawn.items()
    }

    def never(*args, **kwargs):
        raise AssertionError("a rank did O(samples) work that prepare did")

    monkeypatch.setattr(shards_source, "label_facts", never)  # the labels' digest, range and counts
    monkeypatch.setattr(splits, "_held", never)  # a draw, and the argsort of the labels it would call
    rank = ShardsSource(simulated, val_fraction=0.1, test_fraction=0.1, cache_dir=cache)
    for name, (rows, digest, identity) in expected.items():
        records = rank.split(name)
        assert np.array_equal(records.subset.array, rows)
        assert records.digest() == digest and records.order_identity() == identity
        assert isinstance(records._bounds(), np.memmap)  # saved by prepare and mapped: no search per chunk
        assert len(records.epoch_order(0, 0)) == len(rows)
    labels = np.load(os.path.join(simulated, "labels.npy"))
    with open(os.path.join(simulated, "index.json"), "rb") as f:
        key = hashlib.blake2b(f.read(), digest_size=8)
    key.update(labels.astype(np.int64).data)
    assert (
        rank._dataset(simulated, "source.path")["identity"][0] == key.hexdigest()
    )  # the split cache's key kept
    order = np.argsort(labels, kind="stable")
    val = _split_as_drawn_before(np.bincount(labels, minlength=5), 0.1, 0, order, 0.1)[1]
    assert np.array_equal(expected["val"][0], val)  # the rows a split of these labels always had


def test_labels_changed_after_they_were_recorded_are_read_again(simulated, tmp_path):
    cache = tmp_path / "cache"
    ShardsSource(simulated, val_fraction=0.1, cache_dir=cache).prepare()
    path = os.path.join(simulated, "labels.npy")
    labels = np.load(path)
    labels[7] = 5  # one past the last of 5 classes
    np.save(path, labels)
    with pytest.raises(ValueError, match=r"holds labels 0\.\.5 for 5 classes"):
        ShardsSource(simulated, val_fraction=0.1, cache_dir=cache)


def test_bounds_found_in_a_rank_without_prepare_are_saved_for_the_next_start(simulated, tmp_path):
    cache = tmp_path / "cache"
    train = ShardsSource(simulated, val_fraction=0.1, cache_dir=cache).split(
        "train"
    )  # no prepare: drawn here
    found = train._bounds()
    assert not isinstance(found, np.memmap)
    assert np.array_equal(found, np.searchsorted(train.subset.array, train.chunks.starts))
    again = ShardsSource(simulated, val_fraction=0.1, cache_dir=cache).split("train")._bounds()
    assert isinstance(again, np.memmap) and np.array_equal(again, found)

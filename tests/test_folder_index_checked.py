"""The folder index's O(N) invariants (class-major labels, per-class counts) are checked once per index, in
blocks, and recorded in its checksummed meta.json: every rank after that opens it without reading its labels."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import feedline.datasets.folder.index as index_module
from feedline.datasets.cache import file_record, json_checksum, write_array
from feedline.datasets.folder.index import IMG_EXTENSIONS, index_dir, open_index, problem
from feedline.datasets.folder.source import FolderSource
from tests.helpers import simple_tree


def _never_read(monkeypatch):
    def fail(*args, **kwargs):
        pytest.fail("read the labels of a checked index")

    monkeypatch.setattr(index_module, "_labels_problem", fail)


def _as_written_elsewhere(directory, labels=None) -> None:
    """The index as another writer (an older feedline, a tool) leaves it: no record of the check, and, where
    ``labels`` is given, those labels with records and checksums that match them."""
    meta = json.loads((directory / "meta.json").read_text())
    meta.pop("arrays_checked", None)
    if labels is not None:
        with open(directory / "new.npy", "wb") as f:
            crc = write_array(f, np.asarray(labels, dtype=np.int16))
        os.replace(directory / "new.npy", directory / "labels.npy")  # as a writer publishes a file
        meta["files"]["labels.npy"] = file_record(directory / "labels.npy", crc)
    meta["checksum"] = json_checksum(meta)
    (directory / "meta.json").write_text(json.dumps(meta))


def test_every_rank_opens_a_built_index_without_reading_its_labels(tmp_path, monkeypatch):
    tree, cache = simple_tree(tmp_path / "tree"), tmp_path / "cache"
    FolderSource(tree, val_fraction=0.25, cache_dir=cache).prepare()  # local rank 0
    _never_read(monkeypatch)
    rank = FolderSource(tree, val_fraction=0.25, cache_dir=cache)
    assert len(rank.split("train")) + len(rank.split("val")) == 18


def test_an_index_written_elsewhere_is_checked_once_and_recorded(tmp_path, monkeypatch):
    tree, cache = simple_tree(tmp_path / "tree"), tmp_path / "cache"
    open_index(tree, cache_dir=cache)
    directory = index_dir(tree, IMG_EXTENSIONS, cache)
    _as_written_elsewhere(directory)
    checks = []
    real = index_module._labels_problem
    monkeypatch.setattr(index_module, "_labels_problem", lambda *a: checks.append(1) or real(*a))
    monkeypatch.setattr(index_module, "CHECK_BLOCK", 4)  # several blocks: 18 labels
    first = open_index(tree, cache_dir=cache)
    assert checks == [1] and first.meta["arrays_checked"] and problem(directory) is None
    again = open_index(tree, cache_dir=cache)  # the next rank trusts the record
    assert checks == [1] and len(again) == 18 and again.label(17) == 2


@pytest.mark.parametrize(
    "labels, reason",
    [
        # out of order across a block boundary (blocks of 4), first and last labels in range
        (
            [0] * 6 + [1, 1, 2, 2] + [1] * 4 + [2] * 4,
            "labels.npy is not in class-major order within the classes",
        ),
        ([0] * 5 + [1] * 7 + [2] * 6, "labels.npy disagrees with the class counts in meta.json"),
        ([0] * 6 + [1] * 6 + [2] * 5 + [3], "labels.npy is not in class-major order within the classes"),
    ],
)
def test_labels_that_break_the_invariants_are_refused_blockwise(tmp_path, monkeypatch, labels, reason):
    tree, cache = simple_tree(tmp_path / "tree"), tmp_path / "cache"
    good = open_index(tree, cache_dir=cache)
    directory = index_dir(tree, IMG_EXTENSIONS, cache)
    _as_written_elsewhere(directory, labels)
    monkeypatch.setattr(index_module, "CHECK_BLOCK", 4)
    assert problem(directory) == reason
    assert "arrays_checked" not in json.loads((directory / "meta.json").read_text())  # nothing recorded
    assert [good.label(i) for i in range(18)] == [0] * 6 + [1] * 6 + [2] * 6
    assert open_index(tree, cache_dir=cache).meta["arrays_checked"]  # rebuilt

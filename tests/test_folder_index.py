"""The folder index: ImageFolder's classes, order and labels, in a packed, mapped, picklable form."""

from __future__ import annotations

import os
import pickle
import subprocess

import numpy as np
import pytest
from torchvision.datasets import ImageFolder

from feedline.datasets.folder.index import open_index
from feedline.datasets.folder.source import FolderSource
from tests.helpers import backdate_tree, console_script, make_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

AWKWARD = {
    "beta": [
        "b.png",
        "a.JPG",
        "notes.txt",
        "z/1.png",
        "z/0.jpeg",
        "z-/x.png",
        "z.d/y.png",
        "z /w.png",
        "Z/q.PNG",
    ],
    "alpha": ["02.png", "10.png", "1.png", "deep/er/x.png", "deep/a.png", "deep.png", "README"],
    "Gamma": ["img.webp", "img.bmp", "img.tif"],
    "ünï": ["café.png", "日本.png", "e\u0301.png"],
}


def _imagefolder_rel(root):
    ds = ImageFolder(root, loader=lambda p: p)
    return ds.classes, [(os.path.relpath(p, root), t) for p, t in ds.samples]


def _index_rel(root, cache):
    index = open_index(root, cache_dir=cache)
    return index.classes, [(index.relpath(i), index.label(i)) for i in range(len(index))]


def test_folder_index_matches_imagefolder_order(tmp_path):
    root = make_tree(tmp_path / "tree", AWKWARD)
    assert _index_rel(root, tmp_path / "cache") == _imagefolder_rel(root)


def test_symlinked_class_and_folder_are_followed_like_imagefolder(tmp_path):
    root = make_tree(tmp_path / "tree", {"a": ["1.png"], "b": ["2.png"]})
    outside = make_tree(tmp_path / "outside", {"more": ["x.png", "y.jpg"]})
    os.symlink(os.path.join(outside, "more"), os.path.join(root, "a", "linked"))
    os.symlink(os.path.join(outside, "more"), os.path.join(root, "c"))
    backdate_tree(root)
    classes, samples = _index_rel(root, tmp_path / "cache")
    assert (classes, samples) == _imagefolder_rel(root)
    assert ("a/linked/x.png", 0) in samples and ("c/y.jpg", 2) in samples


def test_hidden_entries_are_skipped(tmp_path):
    root = make_tree(
        tmp_path / "tree", {"a": ["1.png", ".hidden.png", ".ipynb_checkpoints/x.png"], "b": ["2.png"]}
    )
    os.makedirs(os.path.join(root, ".cache"))
    classes, samples = _index_rel(root, tmp_path / "cache")
    assert classes == ["a", "b"]
    assert samples == [("a/1.png", 0), ("b/2.png", 1)]


def test_index_files_are_packed_arrays_and_meta(tmp_path, tree):
    index = open_index(tree, cache_dir=tmp_path / "cache")
    names = sorted(os.listdir(index.directory))
    assert names == ["dirs.json", "labels.npy", "meta.json", "offsets.npy", "paths.npy"]
    paths, offsets, labels = index.arrays
    assert isinstance(paths, np.memmap) and paths.dtype == np.uint8
    assert offsets.dtype == np.int64 and len(offsets) == len(index) + 1
    assert labels.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    assert index.meta["counts"] == [6, 6, 6] and index.meta["root"] == tree


def test_second_open_maps_the_cache_without_scanning(tmp_path, tree, monkeypatch):
    first = open_index(tree, cache_dir=tmp_path / "cache")
    import feedline.datasets.folder.index as index_module

    monkeypatch.setattr(index_module, "scan_tree", lambda *a, **k: pytest.fail("rescanned a fresh cache"))
    assert open_index(tree, cache_dir=tmp_path / "cache").directory == first.directory


def test_val_fraction_split_is_seeded_stratified_and_disjoint(tree):
    source = FolderSource(tree, val_fraction=0.34, seed=3)
    source.prepare()
    train, val = source.split("train"), source.split("val")
    t = {train.describe(i) for i in range(len(train))}
    v = {val.describe(i) for i in range(len(val))}
    assert len(t) + len(v) == 18 and not t & v
    assert sorted(val[i][1] for i in range(len(val))) == [0, 0, 1, 1, 2, 2]
    again = FolderSource(tree, val_fraction=0.34, seed=3).split("val")
    assert [again.describe(i) for i in range(len(again))] == [val.describe(i) for i in range(len(val))]
    other = FolderSource(tree, val_fraction=0.34, seed=4).split("val")
    assert {other.describe(i) for i in range(len(other))} != v


def test_val_fraction_zero_puts_everything_in_train(tree):
    source = FolderSource(tree, val_fraction=0)
    assert len(source.split("train")) == 18 and len(source.split("val")) == 0


def test_val_root_uses_train_class_indices(tmp_path):
    train_root = make_tree(tmp_path / "train", {"a": ["1.png"], "b": ["1.png"], "c": ["1.png"]})
    val_root = make_tree(tmp_path / "val", {"b": ["v.png"], "c": ["v.png", "w.png"]})
    source = FolderSource(train_root, val_root=val_root)
    val = source.split("val")
    assert len(source.split("train")) == 3
    assert [val[i][1] for i in range(len(val))] == [1, 2, 2]


def test_records_pickle_as_paths_not_samples(tree):
    records = FolderSource(tree, val_fraction=0.2).split("train")
    blob = pickle.dumps(records)
    assert len(blob) < 1024
    clone = pickle.loads(blob)
    assert len(clone) == len(records) and clone.describe(3) == records.describe(3)
    assert bytes(clone[0][0]) == bytes(records[0][0])


def test_index_cli_prints_summary_and_list(tmp_path, tree):
    cmd = [console_script("feedline-index"), tree, "--cache-dir", str(tmp_path / "c")]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "classes: 3" in out and "samples: 18" in out and str(tmp_path / "c") in out
    assert "dog" in out
    listed = subprocess.run([*cmd, "--list"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert listed.splitlines()[:2] == ["cat/000.png\t0", "cat/001.png\t0"]
    assert len(listed.splitlines()) == 18


def test_index_cli_names_a_missing_root(tmp_path):
    cmd = [console_script("feedline-index"), str(tmp_path / "nope")]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2 and str(tmp_path / "nope") in result.stderr

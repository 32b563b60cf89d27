"""Fault injection on every kind of cache file: garbled, truncated or deleted, the next run rebuilds it with
a warning (or fails naming it), and never reads wrong samples or labels.

Each case builds a source, records its train and val samples, damages one cache file, then builds the source
again in a fresh object, as the next run would, and compares.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from feedline.datasets.folder.lazy import LazyFolderSource
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.hdf5.source import HDF5Source
from feedline.writers.hdf5 import convert_source
from feedline.writers.lazy_layout import layout
from feedline.writers.options import HDF5WriteOptions
from tests.helpers import simple_tree

# source kind -> the cache files it writes (globs under the cache directory)
CACHE_FILES = {
    "folder": [
        "folder-index/*/paths.npy",
        "folder-index/*/offsets.npy",
        "folder-index/*/labels.npy",
        "folder-index/*/dirs.json",
        "folder-index/*/meta.json",
        "folder-index/*/split-*-train.npy",
        "folder-index/*/split-*-val.npy",
        "folder-index/*/split-*-val.npy.sum",
    ],
    "lazy_folder": ["lazy-folder/*/manifest.json", "lazy-folder/*/split-*-train.npy"],
    "hdf5": ["hdf5/*/labels.npy", "hdf5/*/labels.npy.sum", "hdf5/*/split-*-val.npy"],
}
CASES = [(kind, pattern) for kind, patterns in CACHE_FILES.items() for pattern in patterns]
DAMAGE = ("garbled", "truncated", "deleted")


def build(kind: str, tmp_path: Path):
    """A fresh source object over the same data and cache, prepared as a run would."""
    cache = tmp_path / "cache"
    tree = tmp_path / "tree"
    if not tree.exists():
        simple_tree(tree, classes=("a", "b", "c", "d"), per_class=12)
    if kind == "folder":
        source = FolderSource(tree, val_fraction=0.25, cache_dir=cache)
    elif kind == "lazy_folder":
        if not (tmp_path / "lazy").exists():
            layout(str(tree), str(tmp_path / "lazy"), cache_dir=str(tmp_path / "layout-cache"))
        source = LazyFolderSource(tmp_path / "lazy", val_fraction=0.25, cache_dir=cache)
    else:
        path = tmp_path / "data.h5"
        if not path.exists():
            convert_source(
                FolderSource(tree, cache_dir=tmp_path / "h5-cache"),
                HDF5WriteOptions(path=str(path), workers=1),
            )
        source = HDF5Source(path, val_fraction=0.25, cache_dir=cache)
    source.prepare()
    return source


def samples(source) -> dict:
    out = {}
    for name in ("train", "val"):
        records = source.split(name)
        out[name] = [(records.describe(i), records[i][1]) for i in range(len(records))]
    return out


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # the same length, the last bytes flipped: where a .npy keeps its data, a JSON file its end
        path.write_bytes(data[:-4] + bytes(b ^ 0x5A for b in data[-4:]))


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize(("kind", "pattern"), CASES, ids=[f"{k}:{p.split('/')[-1]}" for k, p in CASES])
def test_a_damaged_cache_file_is_rebuilt_with_a_warning(tmp_path, caplog, kind, pattern, how):
    expected = samples(build(kind, tmp_path))
    (target,) = sorted((tmp_path / "cache").glob(pattern))
    damage(target, how)
    with caplog.at_level(logging.WARNING):
        try:
            got = samples(build(kind, tmp_path))
        except (OSError, ValueError) as err:  # the other honest outcome: an error that names the file
            assert target.name in str(err)
            return
    assert got == expected
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("rebuild" in m for m in warned), warned


def test_an_index_file_edited_in_place_is_caught_by_its_checksum(tmp_path, caplog):
    """Bytes overwritten with others, header, length and invariants intact: only the checksum can tell."""
    source = build("folder", tmp_path)
    expected = samples(source)
    (paths,) = (tmp_path / "cache").glob("folder-index/*/paths.npy")
    data = bytearray(paths.read_bytes())
    at = data.index(b"a/000.png")
    data[at : at + 9] = b"b/000.png"  # a path of another class, same length, NULs untouched
    paths.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert samples(build("folder", tmp_path)) == expected
    assert "checksum mismatch" in caplog.text


@pytest.mark.parametrize("kind", ["folder", "lazy_folder"])
def test_a_count_edited_in_valid_json_is_caught(tmp_path, caplog, kind):
    expected = samples(build(kind, tmp_path))
    pattern = "folder-index/*/meta.json" if kind == "folder" else "lazy-folder/*/manifest.json"
    (target,) = (tmp_path / "cache").glob(pattern)
    document = json.loads(target.read_text())
    document["counts"][0] -= 1
    document["counts"][1] += 1
    target.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING):
        assert samples(build(kind, tmp_path)) == expected
    assert "checksum mismatch" in caplog.text

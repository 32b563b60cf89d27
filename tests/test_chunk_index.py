"""A shards dataset's per-chunk metadata is parsed and checked once per node, then mapped: a rank's start and a
worker's records cost O(parts), not a Python object per chunk (``datasets/shards/meta.py`` ``chunk_index``)."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from feedline.datasets.shards import meta
from feedline.datasets.shards.chunks import ChunkError, Chunks
from feedline.datasets.shards.source import ShardsSource

CHUNKS = 20_000
CONFIG = {  # index.json's config as LitData's writer records (image bytes, int label) samples
    "chunk_bytes": 64_000_000,
    "chunk_size": None,
    "compression": None,
    "data_format": ["bytes", "int"],
    "data_spec": '[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": '
    'null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]',
    "encryption": None,
    "item_loader": "PyTreeLoader",
}


def _index(out, sizes) -> None:
    entries = [
        {"chunk_bytes": int(4 * (n + 2) + 16 * n), "chunk_size": int(n), "filename": f"chunk-0-{c}.bin"}
        for c, n in enumerate(sizes)
    ]
    (out / "index.json").write_text(json.dumps({"chunks": entries, "config": CONFIG}))


def simulated(tmp_path, chunks: int = CHUNKS):
    """A shards dataset's three small files for ``chunks`` chunks of one or two samples (no chunk file: none is
    read here)."""
    out = tmp_path / "shards"
    out.mkdir()
    sizes = 1 + np.arange(chunks) % 2
    np.save(out / "labels.npy", np.arange(int(sizes.sum()), dtype=np.int64) % 2)
    names = [f"chunk-0-{c}.bin" for c in range(chunks)]
    sidecar = {
        "format": meta.FORMAT,
        "classes": ["a", "b"],
        "samples": int(sizes.sum()),
        "chunks": int(chunks),
        "chunk_digests": {"algorithm": "sha256", "chunks": {n: f"{c:064x}" for c, n in enumerate(names)}},
    }
    (out / "feedline.json").write_text(json.dumps(sidecar))
    _index(out, sizes)
    return out, sizes


def _no_parsing(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("a chunk entry or digest was parsed")

    monkeypatch.setattr(meta, "load_index", refused)
    monkeypatch.setattr(meta, "_check_digests", refused)


def test_a_rank_on_a_prepared_dataset_parses_no_chunk_entry_and_pickles_small(tmp_path, monkeypatch):
    out, sizes = simulated(tmp_path)
    ShardsSource(str(out), val_fraction=0)  # the first process of the node: parses and caches
    _no_parsing(monkeypatch)  # the node has read it once: every later process maps what that one cached
    source = ShardsSource(str(out), val_fraction=0)
    records = source.split("train")
    chunks = records.chunks
    assert len(chunks.files) == CHUNKS and chunks.total == sizes.sum() == len(records)
    assert chunks.files[-1] == os.path.join(str(out), f"chunk-0-{CHUNKS - 1}.bin")
    assert chunks.where(int(sizes.sum()) - 1) == f"{chunks.files[-1]}[1]"
    assert isinstance(chunks.sizes, np.ndarray) and not chunks.sizes.flags.owndata  # mapped, not a copy
    blob = pickle.dumps(records)
    assert len(blob) < 8 * 1024  # the cache's path, not a string per chunk (the earlier form: ~1.5 MB)
    again = pickle.loads(blob).chunks
    assert list(again.files[:3]) == list(chunks.files[:3]) and again.files[-1] == chunks.files[-1]
    assert np.array_equal(again.starts, chunks.starts) and np.array_equal(again.nbytes, chunks.nbytes)
    assert again.identity == chunks.identity
    sidecar = meta.read_sidecar(str(out))
    assert len(sidecar["chunk_digests"]["chunks"]) == CHUNKS  # counted without reading a digest


def test_a_changed_index_or_a_damaged_cache_is_parsed_again(tmp_path, monkeypatch):
    out, sizes = simulated(tmp_path, 40)
    first = Chunks.of([str(out)])
    assert first._index is not None and first.total == sizes.sum()
    _index(out, sizes[::-1])  # rewritten: another size, mtime or inode
    os.utime(out / "index.json", ns=(1, 1))
    assert np.array_equal(Chunks.of([str(out)]).sizes, sizes[::-1])
    cached = Chunks.of([str(out)])._index
    with open(os.path.join(cached, "sizes.npy"), "r+b") as f:  # damaged after it was written
        f.seek(-8, os.SEEK_END)
        f.write(b"\xff" * 8)
    assert np.array_equal(Chunks.of([str(out)]).sizes, sizes[::-1])
    calls = []
    parse = meta.parse_index
    monkeypatch.setattr(meta, "parse_index", lambda *a: calls.append(a) or parse(*a))
    Chunks.of([str(out)])
    assert not calls  # the damaged copy was written again


def test_digests_are_read_where_a_download_needs_them(tmp_path):
    out, _ = simulated(tmp_path, 5)
    meta.read_sidecar(str(out))
    digests = meta.read_sidecar(str(out))["chunk_digests"]
    assert digests["algorithm"] == "sha256" and len(digests["chunks"]) == 5
    assert digests["chunks"]["chunk-0-4.bin"] == f"{4:064x}"  # read whole on first look
    recorded = json.loads((out / "feedline.json").read_text())
    recorded["chunk_digests"]["chunks"]["chunk-0-1.bin"] = "Z" * 64
    (out / "feedline.json").write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match=r"\['chunk-0-1.bin'\] = 'ZZZ.*' is not a sha256 digest"):
        meta.read_sidecar(str(out))  # an edited sidecar is checked whole again


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"filename": "chunk-0-0.bin\nchunk-0-1.bin"}, r"chunks\[1\]: filename .* is not a chunk's name"),
        ({"chunk_size": True}, r"chunks\[1\] \(chunk-0-1.bin\): chunk_size True is not a whole number"),
        (
            {"chunk_bytes": 2**32},
            r"chunks\[1\] \(chunk-0-1.bin\): chunk_bytes 4294967296 is not a whole number",
        ),
        (
            {"filename": "chunk-0-0.bin"},
            r"chunks\[1\] \(chunk-0-0.bin\): filename 'chunk-0-0.bin' is listed twice",
        ),
    ],
)
def test_an_entry_the_column_checks_refuse_is_named_as_before(tmp_path, entry, words):
    out, _ = simulated(tmp_path, 3)
    index = json.loads((out / "index.json").read_text())
    index["chunks"][1].update(entry)
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(meta.ChunkError, match=words):
        Chunks.of([str(out)])


def test_a_passed_check_of_the_chunk_files_is_not_repeated_until_a_chunk_is_removed(tmp_path, monkeypatch):
    out, sizes = simulated(tmp_path, 40)
    for c, n in enumerate(sizes.tolist()):
        with open(out / f"chunk-0-{c}.bin", "wb") as f:
            f.truncate(4 * (n + 2) + 16 * n)
    os.utime(out, ns=(1, 1))  # the folder's mtime as of long ago: a removal below moves it for sure
    Chunks.of([str(out)]).check_files()  # the node's first prepare: one stat per chunk, the pass recorded
    stats = []
    size_now = Chunks._size_now
    monkeypatch.setattr(Chunks, "_size_now", lambda self, c: stats.append(c) or size_now(self, c))
    Chunks.of([str(out)]).check_files()
    assert not stats  # the next start: no chunk stat'ed
    os.remove(out / "chunk-0-7.bin")
    with pytest.raises(ChunkError, match=r"chunk-0-7\.bin is missing"):
        Chunks.of([str(out)]).check_files()
    assert len(stats) == 8  # checked again, in order, up to the missing chunk

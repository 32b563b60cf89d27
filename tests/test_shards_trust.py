"""Nothing a shards dataset's own files say is trusted unchecked, and a dataset in object storage is checked
exactly as one on a disk: each fault injected once, read locally and from a real S3 server alike."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import struct
import threading

import numpy as np
import pytest

from feedline.datasets.shards.chunks import ChunkError
from feedline.datasets.shards.source import ShardsSource
from tests.helpers import simple_tree
from tests.s3_server import upload_dir
from tests.test_s3_shards import options
from tests.test_shards import _convert

WHERE = ["local", "s3"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """12 classes of one image each in chunks of one or two samples: every chunk's labels differ from any
    other's, and several chunks have the same size and sample count."""
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards import convert_source

    tmp = tmp_path_factory.mktemp("trust")
    classes = [f"c{k:02d}" for k in range(12)]
    tree = simple_tree(tmp / "tree", classes=classes, per_class=1)
    source = FolderSource(tree, val_fraction=0, cache_dir=tmp / "c")
    convert_source(
        source, WriteOptions(path=str(tmp / "shards"), format="shards", chunk_bytes="1KB", workers=1)
    )
    return tmp / "shards"


@pytest.fixture
def copy(written, tmp_path):
    """A copy of the dataset to damage."""
    return shutil.copytree(written, tmp_path / "ds")


def opened(where: str, path, tmp_path, request) -> tuple[ShardsSource, str]:
    """The dataset at ``path`` read from where it is, or after an upload to a bucket: (source, its place)."""
    if where == "local":
        return ShardsSource(path, val_fraction=0, cache_dir=tmp_path / "cache"), str(path)
    server = request.getfixturevalue("s3_server")
    url = server.new_prefix() + "/ds"
    upload_dir(server, path, url)
    source = ShardsSource(
        url, val_fraction=0, window=2, cache_dir=tmp_path / "cache", storage_options=options(server)
    )
    return source, url


def read_all(source: ShardsSource) -> None:
    records = pickle.loads(pickle.dumps(source.split("train")))  # as a worker reads it
    for i in range(len(records)):
        records[i]


def index_of(path) -> dict:
    return json.loads((path / "index.json").read_text())


def write_json(file, value) -> None:
    file.write_text(json.dumps(value))


def without_digests(path) -> None:
    """The dataset as an earlier feedline wrote it: no chunk digests in its sidecar, so that only the read
    path's own checks can tell a changed chunk from S3 (with them, the download is refused first:
    test_chunk_digests.py)."""
    sidecar = json.loads((path / "feedline.json").read_text())
    del sidecar["chunk_digests"]
    write_json(path / "feedline.json", sidecar)


def same_size_pair(index: dict) -> tuple[dict, dict]:
    first, second = index["chunks"][1], index["chunks"][2]
    assert (first["chunk_bytes"], first["chunk_size"]) == (second["chunk_bytes"], second["chunk_size"])
    return first, second


# -- one read path: the label check and every chunk check hold for S3 as for a disk ------------------------
@pytest.mark.parametrize("where", WHERE)
def test_a_reordered_index_is_refused_naming_the_chunk(copy, tmp_path, request, where):
    index = index_of(copy)
    first, second = same_size_pair(index)
    index["chunks"][1], index["chunks"][2] = second, first
    write_json(copy / "index.json", index)
    source, place = opened(where, copy, tmp_path, request)
    source.prepare()  # every size agrees: only the samples tell
    with pytest.raises(
        ChunkError, match=rf"chunk {re.escape(place)}/{second['filename']}: sample 0 holds label"
    ):
        read_all(source)


@pytest.mark.parametrize("where", WHERE)
def test_a_chunk_swapped_for_another_of_the_same_size_is_refused_naming_it(copy, tmp_path, request, where):
    first, second = same_size_pair(index_of(copy))
    (copy / first["filename"]).write_bytes((copy / second["filename"]).read_bytes())
    without_digests(copy)
    source, place = opened(where, copy, tmp_path, request)
    source.prepare()
    with pytest.raises(
        ChunkError, match=rf"chunk {re.escape(place)}/{first['filename']}: .*labels\.npy records"
    ):
        read_all(source)


def _damage_chunk(copy, how: str) -> str:
    """Damage chunk 1 as ``how`` says; what the error must say."""
    chunk = copy / index_of(copy)["chunks"][1]["filename"]
    data = bytearray(chunk.read_bytes())
    if how == "missing":
        chunk.unlink()
        return "is missing"
    if how == "truncated":
        chunk.write_bytes(data[:-10])
        return "holds .* bytes, index.json says"
    if how == "sample count":
        data[0] += 1
    else:  # sample 0 said to end one byte after it starts: shorter than any sample
        struct.pack_into("<I", data, 8, struct.unpack_from("<I", data, 4)[0] + 1)
    chunk.write_bytes(data)
    return (
        "does not hold the .* samples"
        if how == "sample count"
        else "its table of sample offsets does not tile"
    )


@pytest.mark.parametrize("how", ["missing", "truncated", "sample count", "offsets"])
@pytest.mark.parametrize("where", WHERE)
def test_a_damaged_chunk_is_refused_by_name_when_read(copy, tmp_path, request, where, how):
    said = _damage_chunk(copy, how)
    without_digests(copy)
    source, place = opened(where, copy, tmp_path, request)
    name = index_of(copy)["chunks"][1]["filename"]
    with pytest.raises(ChunkError, match=rf"chunk {re.escape(place)}/{name}:? {said}"):
        read_all(source)


# -- labels.npy ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["npz", "empty"])
@pytest.mark.parametrize("where", WHERE)
def test_labels_that_are_an_npz_archive_or_empty_are_named(copy, tmp_path, request, where, how):
    labels = np.load(copy / "labels.npy")
    with open(copy / "labels.npy", "wb") as f:
        if how == "npz":
            np.savez(f, labels=labels)
    said = "is an .npz archive" if how == "npz" else "is not readable"
    with pytest.raises(ValueError, match=r"/ds/labels\.npy " + said):
        opened(where, copy, tmp_path, request)


def test_a_sidecar_index_and_labels_that_disagree_on_the_count_are_refused(copy, tmp_path):
    sidecar = json.loads((copy / "feedline.json").read_text())
    write_json(copy / "feedline.json", {**sidecar, "samples": sidecar["samples"] + 1})
    with pytest.raises(
        ValueError, match=rf"{re.escape(str(copy))}: feedline.json says 13 samples .* lists 12"
    ):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")


# -- index.json: every entry checked where it is loaded --------------------------------------------------------
ENTRIES = [
    ("filename", None, "filename is missing"),
    ("chunk_bytes", None, "chunk_bytes is missing"),
    ("chunk_size", None, "chunk_size is missing"),
    ("chunk_size", "ten", "chunk_size 'ten' is not a whole number"),
    ("chunk_size", -1, "chunk_size -1 is not a whole number in 0"),
    ("chunk_size", True, "chunk_size True is not"),
    ("chunk_bytes", 1.5, "chunk_bytes 1.5 is not"),
    ("chunk_bytes", 2**32, "chunk_bytes 4294967296 is not a whole number in 8..4294967295"),
    ("filename", "../chunk-0-0.bin", "filename '../chunk-0-0.bin' is not a chunk's name"),
    ("filename", "part/chunk-0-0.bin", "filename 'part/chunk-0-0.bin' is not a chunk's name"),
    ("filename", "labels.npy", "filename 'labels.npy' is not a chunk's name"),
    ("filename", 7, "filename 7 is not a chunk's name"),
    ("filename", "chunk-0-0.bin", "filename 'chunk-0-0.bin' is listed twice"),
]


@pytest.mark.parametrize(("key", "value", "said"), ENTRIES, ids=[f"{k}={v!r}" for k, v, _ in ENTRIES])
def test_a_bad_index_entry_names_index_json_the_entry_and_the_key(copy, tmp_path, key, value, said):
    index = index_of(copy)
    if value is None:
        del index["chunks"][1][key]
    else:
        index["chunks"][1][key] = value
    write_json(copy / "index.json", index)
    with pytest.raises(
        ChunkError, match=rf"{re.escape(str(copy))}/index.json: chunks\[1\].*: {re.escape(said)}"
    ):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")


@pytest.mark.parametrize("change", [{"chunks": ["chunk-0-0.bin"]}, {"config": ["PyTreeLoader"]}])
def test_an_index_of_the_wrong_shape_is_named_not_a_type_error(copy, tmp_path, request, change):
    write_json(copy / "index.json", {**index_of(copy), **change})
    with pytest.raises(ChunkError, match=r"/ds/index.json: .*(not an object); copy the dataset again"):
        opened("s3", copy, tmp_path, request)


def test_a_bad_index_entry_from_s3_names_its_url(copy, tmp_path, request):
    index = index_of(copy)
    index["chunks"][0]["chunk_size"] = "ten"
    write_json(copy / "index.json", index)
    with pytest.raises(
        ChunkError, match=r"s3://.*/ds/index.json: chunks\[0\] \(chunk-0-0.bin\): chunk_size 'ten'"
    ):
        opened("s3", copy, tmp_path, request)


# -- feedline.json: every field it holds is type-checked -------------------------------------------------------
FIELDS = [
    ("samples", "ten"),
    ("samples", True),
    ("classes", [1, 2]),
    ("classes", []),
    ("quality", 0),
    ("max_side", 1.5),
    ("shuffle", "yes"),
    ("seed", -1),
    ("rows", None),
    ("part", "0"),
    ("parts", 0),
    ("source", 3),
    ("source_kind", ["FolderRecords"]),
    ("chunk_bytes", "1KB"),
]


@pytest.mark.parametrize(("field", "value"), FIELDS, ids=[f"{k}={v!r}" for k, v in FIELDS])
def test_a_mistyped_sidecar_field_is_named_with_its_file(copy, tmp_path, field, value):
    sidecar = json.loads((copy / "feedline.json").read_text())
    write_json(copy / "feedline.json", {**sidecar, field: value})
    with pytest.raises(ValueError, match=rf"feedline.json: {field}={re.escape(repr(value))} is not"):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")


def test_the_sidecar_records_every_setting_that_decides_what_a_sample_holds(written):
    sidecar = json.loads((written / "feedline.json").read_text())
    assert {k: sidecar[k] for k in ("max_side", "quality", "mode", "source_kind", "chunk_bytes", "rows")} == {
        "max_side": 0,
        "quality": 90,
        "mode": "encoded",
        "source_kind": "FolderRecords",
        "chunk_bytes": 1000,
        "rows": 12,
    }


# -- parts: one conversion's, in the folders of their numbers --------------------------------------------------
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("setting", ["out.max_side=8", "out.quality=50"])
def test_parts_written_with_other_settings_are_refused_naming_both_and_the_setting(
    make_cfg, tmp_path, request, where, setting
):
    """Part 0 with out.max_side=8, part 1 without: 8-px and 32-px images read as one dataset."""
    tree = simple_tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "shards"
    resize = [setting] if setting.startswith("out.max_side") else ["out.max_side=4", setting]
    _convert(make_cfg, tree, out, "out.parts=2", "out.part=0", *resize)
    _convert(make_cfg, tree, out, "out.parts=2", "out.part=1", *resize[:-1])
    key = setting.split("=")[0]
    with pytest.raises(
        ValueError, match=rf"{key} \S+ in part-00000-of-00002, \S+ in part-00001-of-00002.*the same settings"
    ):
        opened(where, out, tmp_path, request)


def _strip(sidecar_file, *keys) -> None:
    sidecar = json.loads(sidecar_file.read_text())
    write_json(sidecar_file, {k: v for k, v in sidecar.items() if k not in keys})


def test_parts_of_older_conversions_are_read_when_none_records_a_setting_and_refused_when_one_does(
    make_cfg, tmp_path
):
    tree = simple_tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "shards"
    for k in range(2):
        _convert(make_cfg, tree, out, "out.parts=2", f"out.part={k}")
    parts = sorted(out.glob("part-*"))
    _strip(parts[0] / "feedline.json", "source_kind", "mode", "chunk_bytes")
    with pytest.raises(
        ValueError, match="the source's kind not recorded in part-00000-of-00002, 'FolderRecords'"
    ):
        ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c")
    _strip(
        parts[1] / "feedline.json", "source_kind", "mode", "chunk_bytes"
    )  # both as an older feedline wrote
    assert len(ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c").split("train")) == 9


@pytest.mark.parametrize("name", ["part-00002-of-00002", "part-00000-of-00000"])
def test_a_part_folder_numbered_past_its_count_is_named(make_cfg, tmp_path, name):
    tree = simple_tree(tmp_path / "tree", per_class=2)
    out = tmp_path / "shards"
    for k in range(2):
        _convert(make_cfg, tree, out, "out.parts=2", f"out.part={k}")
    shutil.copytree(out / "part-00001-of-00002", out / name)
    with pytest.raises(ValueError, match=rf"holds {name}, which no conversion writes"):
        ShardsSource(out, val_fraction=0, cache_dir=tmp_path / "c")


def test_a_part_copied_out_as_a_whole_dataset_is_refused_but_read_in_its_own_folder(make_cfg, tmp_path):
    """One part's files copied to a folder of their own read as the whole dataset: half of it, silently."""
    tree = simple_tree(tmp_path / "tree", per_class=2)
    out = tmp_path / "shards"
    for k in range(2):
        _convert(make_cfg, tree, out, "out.parts=2", f"out.part={k}")
    part = out / "part-00001-of-00002"
    assert len(ShardsSource(part, val_fraction=0, cache_dir=tmp_path / "c").split("train")) == 3
    shutil.copytree(part, tmp_path / "half")
    with pytest.raises(ValueError, match=r"half holds part 1 of 2 \(feedline.json\), not a whole dataset"):
        ShardsSource(tmp_path / "half", val_fraction=0, cache_dir=tmp_path / "c")


def test_a_chunk_that_is_a_folder_is_refused_by_name(copy, tmp_path):
    name = index_of(copy)["chunks"][0]["filename"]
    (copy / name).unlink()
    (copy / name).mkdir()
    with pytest.raises(ChunkError, match=rf"chunk {re.escape(str(copy / name))} is not a regular file"):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c").prepare()


def test_labels_that_are_a_fifo_are_named_not_waited_on(copy, tmp_path):
    """np.load opened a FIFO in the place of labels.npy and waited for a writer, for ever."""
    (copy / "labels.npy").unlink()
    os.mkfifo(copy / "labels.npy")
    failed = []

    def build():
        try:
            ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")
        except ValueError as err:
            failed.append(str(err))

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # release it before failing
        os.close(os.open(copy / "labels.npy", os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert failed and "labels.npy is not a regular file" in failed[0]


@pytest.mark.parametrize("name", ["feedline.json", "index.json"])
def test_json_nested_past_any_use_is_named_not_a_recursion_error(copy, tmp_path, name):
    (copy / name).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises((ValueError, ChunkError), match=rf"{name} is not readable JSON \(RecursionError"):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")


def test_a_dataset_of_no_samples_is_refused_by_name(copy, tmp_path):
    """An index of no chunks (and a sidecar and labels that agree): no conversion writes one."""
    write_json(copy / "index.json", {**index_of(copy), "chunks": []})
    sidecar = json.loads((copy / "feedline.json").read_text())
    write_json(copy / "feedline.json", {**sidecar, "samples": 0, "chunks": 0})
    np.save(copy / "labels.npy", np.zeros(0, dtype=np.int64))
    with pytest.raises(ValueError, match=rf"{re.escape(str(copy))} holds no samples"):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")


@pytest.mark.slow
def test_a_damaged_dataset_stops_train_py_with_one_line_naming_its_file(copy, tmp_path):
    """A pickled labels.npy (numpy's own error advises unpickling it) and a truncated chunk, through
    ``python train.py``: one ``Error:`` line naming the key and the file, no traceback, no advice to unpickle."""
    import subprocess
    import sys

    from tests.conftest import ROOT_DIR

    def train_py(path, run):
        args = [sys.executable, "train.py", "source=shards", f"source.path={path}", "source.val_fraction=0"]
        args += ["trainer.fast_dev_run=true", "data.num_workers=0", f"hydra.run.dir={tmp_path / run}"]
        args += [f"paths.output_dir={tmp_path / run}", f"paths.cache_dir={tmp_path / 'cache'}", "logger=none"]
        env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
        return subprocess.run(args, cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=300)

    pickled = shutil.copytree(copy, tmp_path / "pickled")
    np.save(pickled / "labels.npy", np.array([{"a": 1}] * 12, dtype=object), allow_pickle=True)
    out = train_py(pickled, "a")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert (
        f"Error: source.path '{pickled}'" in out.stderr and "labels.npy holds pickled objects" in out.stderr
    )
    assert "allow_pickle" not in out.stderr

    chunk = sorted(copy.glob("chunk-*.bin"))[0]
    with open(chunk, "r+b") as f:
        f.truncate(os.path.getsize(chunk) - 3)
    out = train_py(copy, "b")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "Error: " in out.stderr and chunk.name in out.stderr

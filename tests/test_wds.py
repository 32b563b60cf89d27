"""source=wds: WebDataset tars (``<key>.jpg`` + ``<key>.cls`` / ``<key>.json``), indexed once, read in place,
and converted by convert.py like any other source."""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from feedline.cli.instantiate import instantiate
from feedline.convert import run_convert
from feedline.datasets.shards.chunks import Chunks, dataset_dirs
from feedline.datasets.wds.source import WdsSource
from feedline.datasets.wds.tars import TarError, expand_braces
from feedline.writers.options import WriteOptions
from feedline.writers.shards.write import rows_to_write
from tests.conftest import ROOT_DIR
from tests.helpers import image_bytes, wds_tars, write_tar

PNG = image_bytes(".png", seed=7)


# -- convert.py source=wds ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("label", ["cls", "json"])
def test_tars_convert_to_shards_from_the_command_line_and_every_sample_reads_back(tmp_path, label):
    written = wds_tars(tmp_path / "tars", tars=2, per_tar=6, label=label)
    out = tmp_path / "shards"
    cmd = [
        sys.executable,
        "convert.py",
        "source=wds",
        f"source.path='{tmp_path / 'tars'}/shards-{{000000..000001}}.tar'",  # quoted: Hydra's grammar has braces
        "out.format=shards",
        f"out.path={out}",
        "out.workers=1",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(cmd, cwd=ROOT_DIR, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    classes = json.loads((out / "feedline.json").read_text())["classes"]
    assert classes == (["0", "1", "2"] if label == "cls" else ["c0", "c1", "c2"])
    chunks = Chunks.of(dataset_dirs(str(out)))
    rows = rows_to_write(12, WriteOptions(path="x", format="shards"))  # the writer's seeded order
    assert chunks.total == 12
    for i in range(12):
        image, stored = chunks.read(i)
        sample = written[int(rows[i])]
        assert bytes(image) == sample["image"] and stored == sample["label"]


def test_tars_convert_to_hdf5_with_the_same_bytes_and_labels(make_cfg, tmp_path):
    from feedline.datasets.hdf5.source import HDF5Source

    written = wds_tars(tmp_path / "tars", label="json")
    cfg = make_cfg(
        "source=wds",
        f"source.path={tmp_path / 'tars'}",
        f"out.path={tmp_path / 'x.h5'}",
        "out.workers=1",
        config="convert",
    )
    assert run_convert(cfg)["images"] == 12
    records = HDF5Source(tmp_path / "x.h5", val_fraction=0).split("all")
    assert HDF5Source(tmp_path / "x.h5").classes == ["c0", "c1", "c2"]
    for i, sample in enumerate(written):
        payload, label = records[i]
        assert bytes(payload) == sample["image"] and label == sample["label"]


# -- reading ---------------------------------------------------------------------------------------------
def test_every_sample_reads_with_its_label_splits_stratify_and_records_pickle_small(tmp_path):
    written = wds_tars(tmp_path / "tars", tars=3, per_tar=10)
    source = WdsSource(str(tmp_path / "tars"), val_fraction=0.2, cache_dir=str(tmp_path / "c"))
    source.prepare()
    every = source.split("all")
    assert source.classes == ["0", "1", "2"] and len(every) == 30
    for i, sample in enumerate(written):
        payload, label = every[i]
        assert bytes(payload) == sample["image"] and label == sample["label"]
        assert every.describe(i) == f"{sample['tar']}:{sample['key']}.{('png', 'jpg')[i % 10 % 2]}"
    train, val = source.split("train"), source.split("val")
    assert (len(train), len(val)) == (24, 6) and np.bincount([val[i][1] for i in range(6)]).tolist() == [
        2,
        2,
        2,
    ]
    assert sorted([train.row(i) for i in range(24)] + [val.row(i) for i in range(6)]) == list(range(30))
    train[0]  # noqa: B018 - a tar now open in this process
    again = pickle.loads(pickle.dumps(train))
    assert len(pickle.dumps(train)) < 2000 and again._fds == {}  # paths and numbers; tars opened where read
    assert bytes(again[5][0]) == bytes(train[5][0]) and again[5][1] == train[5][1]


def test_the_tars_are_indexed_once_and_a_read_never_scans_a_tar(tmp_path, monkeypatch):
    import tarfile

    wds_tars(tmp_path / "tars")
    WdsSource(str(tmp_path / "tars"), cache_dir=str(tmp_path / "c")).prepare()

    def no_scan(*args, **kwargs):
        raise AssertionError("a tar was scanned again")

    monkeypatch.setattr(tarfile, "open", no_scan)
    source = WdsSource(str(tmp_path / "tars"), cache_dir=str(tmp_path / "c"))  # another run: the cached index
    source.prepare()
    records = source.split("all")
    assert len({bytes(records[i][0]) for i in range(len(records))}) == 12


@pytest.mark.parametrize(
    "path, tars",
    [
        ("shards-{000000..000002}.tar", 3),
        ("shards-00000[01].tar", 2),
        ("shards-000002.tar", 1),
        ("", 3),  # the directory
    ],
)
def test_source_path_is_a_directory_a_tar_or_a_pattern(tmp_path, path, tars):
    wds_tars(tmp_path / "tars", tars=3, per_tar=2)
    source = WdsSource(os.path.join(tmp_path / "tars", path), val_fraction=0, cache_dir=str(tmp_path / "c"))
    assert len(source.split("all")) == 2 * tars


def test_brace_patterns_expand_as_webdataset_spells_them():
    assert expand_braces("s-{000008..000010}.tar") == ["s-000008.tar", "s-000009.tar", "s-000010.tar"]
    assert expand_braces("{a,b}/s-{1..2}.tar") == ["a/s-1.tar", "a/s-2.tar", "b/s-1.tar", "b/s-2.tar"]


def test_held_out_tars_are_the_val_split_labelled_by_class_name(tmp_path):
    write_tar(
        tmp_path / "train.tar",
        {f"k{i}": {"png": PNG, "json": b'{"label": "%s"}' % b"abc"[i % 3 : i % 3 + 1]} for i in range(6)},
    )
    write_tar(tmp_path / "val.tar", {"v0": {"png": PNG, "json": b'{"label": "c"}'}})
    source = WdsSource(
        str(tmp_path / "train.tar"), val_path=str(tmp_path / "val.tar"), cache_dir=str(tmp_path / "c")
    )
    source.prepare()
    assert source.classes == ["a", "b", "c"] and len(source.split("train")) == 6
    assert source.split("val")[0][1] == 2  # its own class list is ["c"]: mapped by name


# -- bad input -------------------------------------------------------------------------------------------
def test_samples_without_an_image_or_a_label_are_left_out_and_named(tmp_path, caplog):
    tar = write_tar(
        tmp_path / "s.tar",
        {
            "good": {"jpg": image_bytes(".jpg"), "cls": b"1"},
            "nolabel": {"png": PNG},
            "noimage": {"cls": b"0", "txt": b"a caption"},
            "badcls": {"png": PNG, "cls": b"cat"},
            "nofield": {"png": PNG, "json": b'{"caption": "x"}'},
            "negative": {"png": PNG, "cls": b"-1"},
            "also": {"png": PNG, "json": b'{"label": 0}'},
        },
    )
    with caplog.at_level(logging.WARNING):
        records = WdsSource(tar, val_fraction=0, cache_dir=str(tmp_path / "c")).split("all")
    assert [records.describe(i) for i in range(len(records))] == [f"{tar}:good.jpg", f"{tar}:also.png"]
    assert [records[i][1] for i in range(2)] == [1, 0]
    assert "5 sample(s) left out" in caplog.text
    for key, why in [
        ("nolabel", "no label: no .cls or .json"),
        ("noimage", "no image"),
        ("badcls", ".cls holds 'cat', not a class number"),
        ("nofield", ".json has no 'label' (source.label_key)"),
        ("negative", "negative label -1"),
    ]:
        assert f"{tar}: {key} ({why}" in caplog.text


def test_source_label_key_reads_another_json_field(tmp_path):
    tar = write_tar(
        tmp_path / "s.tar",
        {f"k{i}": {"png": PNG, "json": json.dumps({"y": i % 2}).encode()} for i in range(4)},
    )
    source = WdsSource(tar, label_key="y", val_fraction=0, cache_dir=str(tmp_path / "c"))
    assert source.classes == ["0", "1"] and [source.split("all")[i][1] for i in range(4)] == [0, 1, 0, 1]


def _last_header(raw: bytes) -> int:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return tar.getmembers()[-1].offset


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda raw: raw[: len(raw) // 2], "not a complete tar"),  # cut in an image
        (lambda raw: raw[: _last_header(raw) + 100], "not a complete tar"),  # cut in a header
        (lambda raw: raw[:1024] + os.urandom(512) + raw[1536:], "not a complete tar"),  # a garbled header
        (gzip.compress, "gzip-compressed"),
    ],
)
def test_a_truncated_corrupt_or_compressed_tar_is_refused_naming_it(tmp_path, damage, said):
    wds_tars(tmp_path / "tars", tars=2, per_tar=4)
    bad = tmp_path / "tars" / "shards-000001.tar"
    bad.write_bytes(damage(bad.read_bytes()))
    with pytest.raises(TarError, match=said) as err:
        WdsSource(str(tmp_path / "tars"), cache_dir=str(tmp_path / "c")).prepare()
    assert str(bad) in str(err.value)


def test_a_tar_cut_between_samples_is_read_with_a_warning(tmp_path, caplog):
    written = wds_tars(tmp_path / "tars", tars=1, per_tar=4)
    tar = tmp_path / "tars" / "shards-000000.tar"
    tar.write_bytes(tar.read_bytes()[: _last_header(tar.read_bytes())])  # the last sample's label is gone
    with caplog.at_level(logging.WARNING):
        records = WdsSource(str(tar), val_fraction=0, cache_dir=str(tmp_path / "c")).split("all")
    assert len(records) == 3 and bytes(records[2][0]) == written[2]["image"]
    assert f"{tar} ends without tar's end-of-archive marker" in caplog.text
    assert f"{tar}: {written[3]['key']} (no label" in caplog.text


def test_a_tar_changed_after_it_was_indexed_stops_the_reader(tmp_path):
    wds_tars(tmp_path / "tars", tars=1)
    records = WdsSource(str(tmp_path / "tars"), val_fraction=0, cache_dir=str(tmp_path / "c")).split("all")
    with open(tmp_path / "tars" / "shards-000000.tar", "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(TarError, match="changed under this run"):
        records[0]


def test_labels_by_number_and_by_name_at_once_are_refused(tmp_path):
    tar = write_tar(
        tmp_path / "s.tar", {"a": {"png": PNG, "cls": b"0"}, "b": {"png": PNG, "json": b'{"label": "dog"}'}}
    )
    with pytest.raises(TarError, match=r"by class number .*s.tar: a.png.* by class name .*s.tar: b.png"):
        WdsSource(tar, cache_dir=str(tmp_path / "c")).prepare()


@pytest.mark.parametrize(
    "override, said",
    [
        ("source.path={tars}/nowhere", r"source.path '.*nowhere' does not exist"),
        (
            "source.path='{tars}/shards-{{000000..000003}}.tar'",
            r"source.path '.*shards-000002.tar' does not exist",
        ),
        ("source.val_fraction=1.5", r"source.val_fraction=1.5 must be in \[0, 1\)"),
        ("source.label_key=''", "source.label_key='' must name the field"),
        ("source.seed=-1", "source.seed=-1"),
    ],
)
def test_bad_config_values_are_refused_by_key(make_cfg, tmp_path, override, said):
    wds_tars(tmp_path / "tars", tars=2)
    cfg = make_cfg("source=wds", f"source.path={tmp_path / 'tars'}", override.format(tars=tmp_path / "tars"))
    with pytest.raises((ValueError, OSError), match=said):
        instantiate(cfg.source, "source")


def test_a_misspelt_key_fails_at_composition(make_cfg, tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        make_cfg("source=wds", "source.path=x", "source.labelkey=y")
    assert "labelkey" in str(err.value) + str(err.value.__cause__)


# -- training ---------------------------------------------------------------------------------------------
def test_a_wds_source_trains_through_the_datamodule(make_cfg, tmp_path):
    wds_tars(tmp_path / "tars", tars=2, per_tar=8)
    cfg = make_cfg(
        "source=wds", f"source.path={tmp_path / 'tars'}", "data.batch_size=4", "data.num_workers=0"
    )
    datamodule = instantiate(cfg.data, "data")
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    assert datamodule.classes == ["0", "1", "2"] and len(batch.label) == 4


def test_a_bad_tar_names_the_key_so_train_py_prints_it_alone(tmp_path):
    """train.py prints a ValueError without its traceback only when it names its config key."""
    from feedline.cli.instantiate import _NAMES_A_KEY

    wds_tars(tmp_path / "tars", tars=1, per_tar=4)
    bad = tmp_path / "tars" / "shards-000000.tar"
    bad.write_bytes(gzip.compress(bad.read_bytes()))
    with pytest.raises(TarError, match="gzip-compressed") as err:
        WdsSource(str(bad), cache_dir=str(tmp_path / "c")).prepare()
    assert str(err.value).startswith(f"source.path '{bad}': ") and _NAMES_A_KEY.search(str(err.value))

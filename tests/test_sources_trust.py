"""What each source's own files say is checked, and two sources of one run are compared by the data they
read: WebDataset tars and their conversions, shards datasets nested under another's prefix, HDF5 attributes,
repeated keys in a tar, URLs given to sources that read local paths, val trees of links."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import h5py
import numpy as np
import pytest

from feedline.datasets.folder.lazy import LazyFolderSource
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.hdf5.source import HDF5Source
from feedline.datasets.mix.source import MixSource
from feedline.datasets.overlap import same_data
from feedline.datasets.shards.source import ShardsSource
from feedline.datasets.wds.source import WdsSource
from feedline.datasets.wds.tars import TarError
from tests.helpers import image_bytes, simple_tree, wds_tars, write_tar
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, upload_dir


def part(source, **spec) -> dict:
    return {"source": source, **spec}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """WebDataset tars and their shards and HDF5 conversions; a shards dataset with another converted inside
    its folder (``ds/val``), and one in two parts; a tree and its HDF5 conversion."""
    from feedline.writers.hdf5 import convert_source as to_hdf5
    from feedline.writers.options import HDF5WriteOptions, WriteOptions
    from feedline.writers.shards import convert_source as to_shards

    tmp = tmp_path_factory.mktemp("trust")
    shards = dict(format="shards", workers=1)
    wds_tars(tmp / "wds")
    tars = WdsSource(str(tmp / "wds" / "shards-{000000..000001}.tar"), val_fraction=0, cache_dir=tmp / "c")
    to_shards(tars, WriteOptions(path=str(tmp / "wds-shards"), **shards))
    to_hdf5(tars, HDF5WriteOptions(path=str(tmp / "wds.h5"), workers=1))
    tree, other = simple_tree(tmp / "tree", per_class=3), simple_tree(tmp / "other", per_class=2)
    to_shards(
        FolderSource(other, val_fraction=0, cache_dir=tmp / "c"), WriteOptions(path=str(tmp / "ds"), **shards)
    )
    folder = FolderSource(tree, val_fraction=0, cache_dir=tmp / "c")
    to_shards(folder, WriteOptions(path=str(tmp / "ds" / "val"), **shards))
    for k in range(2):
        to_shards(folder, WriteOptions(path=str(tmp / "parts"), part=k, parts=2, **shards))
    to_hdf5(folder, HDF5WriteOptions(path=str(tmp / "tree.h5"), workers=1))
    return tmp


# -- a WebDataset source and its own conversions -------------------------------------------------------------
@pytest.mark.parametrize(
    "spelling",
    ["", "shards-{000000..000001}.tar", "*.tar", "shards-000001.tar"],
    ids=["dir", "braces", "glob", "tar"],
)
@pytest.mark.parametrize("conversion", ["wds-shards", "wds.h5"])
def test_webdataset_tars_and_their_own_conversion_are_one_dataset(data, spelling, conversion):
    """The conversion records the tars as a pattern; the wds part names them as a directory, a pattern, a glob
    or one tar: both are expanded into their tars, as the wds source expands them."""
    made = data / conversion
    other = HDF5Source(made) if conversion.endswith(".h5") else ShardsSource(made, cache_dir=data / "c")
    tars = WdsSource(os.path.join(data / "wds", spelling), cache_dir=data / "c")
    with pytest.raises(
        ValueError, match=rf"source.parts.conv.source.path .* was made from {data / 'wds'}/shards-00000\d.tar"
    ):
        MixSource({"tars": part(tars), "conv": part(other)})


def test_a_webdataset_conversion_records_its_tars_by_absolute_path(data, monkeypatch):
    monkeypatch.chdir(data)
    assert repr(WdsSource("wds", cache_dir=data / "c")).startswith(f"WdsSource(path={str(data / 'wds')!r}")


# -- a shards dataset is its own files, not every dataset under its prefix -------------------------------------
def test_a_dataset_converted_inside_another_is_its_own_data_and_a_part_folder_is_not(data):
    source = ShardsSource(data / "ds", val_path=str(data / "ds" / "val"), cache_dir=data / "c")
    assert len(source.split("train")) == 6 and len(source.split("val")) == 9
    MixSource(
        {
            "a": part(ShardsSource(data / "ds", cache_dir=data / "c")),
            "b": part(ShardsSource(data / "ds" / "val", cache_dir=data / "c")),
        }
    )
    # what they record aside, a part folder is still part of its dataset, and a tree of every tree in it
    whole, one = (
        replace(same_data.data_of(ShardsSource(path, cache_dir=data / "c"))[0], origins=[])
        for path in (data / "parts", data / "parts" / "part-00001-of-00002")
    )
    assert "part-00001-of-00002 lies inside" in same_data.meet(whole, one)
    with pytest.raises(ValueError, match=r"source.val_root .* lies inside"):
        FolderSource(data / "tree", val_root=str(data / "tree" / "cat"), cache_dir=data / "c")


def options(server) -> dict:
    return {
        "endpoint_url": server.endpoint,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "region_name": REGION,
    }


def test_a_dataset_converted_under_another_prefix_is_its_own_data_in_a_bucket(s3_server, data, tmp_path):
    base = s3_server.new_prefix()
    upload_dir(s3_server, data / "ds", f"{base}/ds")  # ds/val goes up with it, as a user's sync takes it
    upload_dir(s3_server, data / "parts", f"{base}/parts")
    reach = dict(storage_options=options(s3_server), cache_dir=tmp_path / "cache", window=1)
    source = ShardsSource(f"{base}/ds", val_path=f"{base}/ds/val", **reach)
    assert len(source.split("val")) == 9
    with pytest.raises(ValueError, match=r"source.val_path .* is the training data of source.path"):
        ShardsSource(f"{base}/parts", val_path=f"{base}/parts/part-00001-of-00002/", **reach)


# -- HDF5 attributes ---------------------------------------------------------------------------------------------
def edited(data, tmp_path, **attrs) -> str:
    """A copy of the tree's HDF5 conversion with ``attrs`` set (None: removed)."""
    path = str(tmp_path / "edited.h5")
    shutil.copy(data / "tree.h5", path)
    with h5py.File(path, "a") as f:
        for name, value in attrs.items():
            if value is None:
                del f.attrs[name]
            else:
                f.attrs[name] = value
    return path


BAD_CLASSES = {
    "twice": ('["cat", "cat", "eel"]', r"names class\(es\) 'cat' more than once"),
    "a string": ('"abc"', r"is the JSON str '\"abc\"', not a list"),
    "numbers": ("[1, 2, 3]", r"holds 1, not a class name"),
    "nested": ('[["a"], ["b"], ["c"]]', r"holds \['a'\], not a class name"),
    "a dict": ('{"cat": 0}', r"is the JSON dict"),
    "empty": ("[]", r"names no class"),
    "not JSON": ("not json", r"is not JSON \(Expecting value"),
    "ints": (np.arange(3), r"is an array of int64 \(3,\), not a JSON list"),
}


@pytest.mark.parametrize("written_by", ["feedline", "another tool"])
@pytest.mark.parametrize("value, said", BAD_CLASSES.values(), ids=BAD_CLASSES)
def test_an_hdf5_classes_attribute_that_is_no_list_of_names_is_named_with_its_file(
    data, tmp_path, value, said, written_by
):
    foreign = {"feedline_format": None} if written_by != "feedline" else {}
    path = edited(data, tmp_path, classes=value, **foreign)
    with pytest.raises(
        ValueError, match=rf"source.path '{path}': its 'classes' attribute {said}.* source.classes"
    ):
        HDF5Source(path)
    assert HDF5Source(path, classes=["a", "b", "c"]).classes == ["a", "b", "c"]  # the fix it names


def test_an_hdf5_file_with_one_class_name_twice_is_refused_in_a_mix_too(data, tmp_path):
    path = edited(data, tmp_path, classes='["cat", "cat", "eel"]')
    with pytest.raises(ValueError, match=r"'classes' attribute names class\(es\) 'cat' more than once"):
        MixSource(
            {"h5": part(HDF5Source(path)), "tree": part(FolderSource(data / "other", cache_dir=data / "c"))}
        )


@pytest.mark.parametrize(
    "value", [np.array([b"cat", b"dog", b"eel"]), ["cat", "dog", "eel"]], ids=["bytes", "str"]
)
def test_hdf5_class_names_as_an_array_of_strings_are_read(data, tmp_path, value):
    assert HDF5Source(edited(data, tmp_path, classes=value)).classes == ["cat", "dog", "eel"]


BAD_ATTRS = {
    "mode": ("raw", r"its 'mode' attribute is 'raw', but it holds encoded image files"),
    "feedline_format": (2, r"is of feedline_format 2, newer than this feedline reads"),
    "max_side": (-3, r"its 'max_side' attribute \(-3\) is not a whole number >= 0"),
    "size": (1.5, r"its 'size' attribute \(1.5\) is not a whole number"),
    "quality": (0, r"its 'quality' attribute \(0\) is not a whole number in 1..100"),
    "source": (5, r"its 'source' attribute \(5\) is not a description"),
    "classes": (None, r"written by feedline but has no 'classes' attribute"),
}


@pytest.mark.parametrize("name, value, said", [(k, *v) for k, v in BAD_ATTRS.items()], ids=BAD_ATTRS)
def test_a_mistyped_feedline_hdf5_attribute_is_named_with_its_file(data, tmp_path, name, value, said):
    path = edited(data, tmp_path, **{name: value})
    with pytest.raises(ValueError, match=rf"source.path '{path}'.* {said}"):
        HDF5Source(path)


def test_an_images_layout_attribute_that_contradicts_the_shape_is_named(tmp_path):
    """(N, 8, 8, 3) pixels marked chw would be read as 8 channels of 8 x 3 pixels."""
    path = str(tmp_path / "foreign.h5")
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((4, 8, 8, 3), dtype=np.uint8)
        f["images"].attrs["layout"] = "chw"
        f["labels"] = np.arange(4) % 2
    with pytest.raises(
        ValueError, match=rf"'{path}': its images' 'layout' attribute says chw, but .* source.layout"
    ):
        HDF5Source(path)
    assert HDF5Source(path, layout="hwc").split("train")[0][0].shape == (3, 8, 8)


# -- WebDataset: a key repeated in a tar ------------------------------------------------------------------------
def sample(k: int) -> dict[str, bytes]:
    return {"png": image_bytes(".png", seed=k), "cls": str(k % 3).encode()}


def test_a_sample_key_repeated_in_a_tar_is_refused_naming_the_tar_and_the_key(tmp_path):
    """Two runs of one key (tars concatenated): WebDataset reads two samples of one name, most often one
    sample twice; the first alone was kept before, silently dropping the rest."""
    path = str(tmp_path / "dup.tar")
    keys = [f"s{k:03d}" for k in range(6)]
    members = [
        (f"{key}.{ext}", data)
        for _ in range(2)
        for k, key in enumerate(keys)
        for ext, data in sample(k).items()
    ]
    _write_members(path, members)
    with pytest.raises(
        TarError, match=rf"source.path '{path}': {path} holds sample 's000' twice: s000.png and"
    ):
        WdsSource(path, val_fraction=0, cache_dir=tmp_path / "c").prepare()
    write_tar(path, {key: sample(k) for k, key in enumerate(keys)})  # each key once: read whole
    assert len(WdsSource(path, val_fraction=0, cache_dir=tmp_path / "c").split("all")) == 6


def test_a_member_written_twice_in_one_sample_is_refused(tmp_path):
    path = str(tmp_path / "twice.tar")
    one = sample(0)
    _write_members(path, [("a.png", one["png"]), ("a.png", one["png"]), ("a.cls", one["cls"])])
    with pytest.raises(TarError, match=rf"{path} holds a.png twice in sample 'a'"):
        WdsSource(path, cache_dir=tmp_path / "c").prepare()


def _write_members(path: str, members: list[tuple[str, bytes]]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# -- URLs given to sources that read local paths ----------------------------------------------------------------
@pytest.mark.parametrize(
    "build, key",
    [
        (lambda: HDF5Source("s3://bkt/x.h5"), "source.path"),
        (lambda: HDF5Source(os.devnull, val_path="s3://bkt/v.h5"), "source.val_path"),
        (lambda: FolderSource("s3://bkt/tree"), "source.root"),
        (lambda: LazyFolderSource("s3://bkt/tree"), "source.root"),
        (lambda: WdsSource("s3://bkt/shards-{000000..000009}.tar"), "source.path"),
    ],
    ids=["hdf5", "hdf5-val", "folder", "lazy_folder", "wds"],
)
def test_a_url_given_to_a_source_of_local_paths_says_object_storage_is_read_by_shards(build, key):
    with pytest.raises(
        ValueError,
        match=rf"{key}=s3://bkt/\S+ is a URL, and this source reads local paths only.* source=shards",
    ):
        build()


# -- feedline.json's mode -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["raw", "zzz", 1])
def test_a_shards_sidecar_mode_other_than_encoded_is_named_with_its_file(data, tmp_path, mode):
    copy = shutil.copytree(data / "ds", tmp_path / "ds", ignore=shutil.ignore_patterns("val"))
    sidecar = json.loads((copy / "feedline.json").read_text())
    (copy / "feedline.json").write_text(json.dumps({**sidecar, "mode": mode}))
    with pytest.raises(ValueError, match=rf"feedline.json: mode={mode!r} is not \"encoded\""):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")

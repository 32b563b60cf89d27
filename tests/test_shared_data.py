"""Two sources of one run (a mix's parts; one source's train, val and test) share no data, no chunk cache under
two limits and no class spelt two ways unless told (datasets/overlap/same_data.py, datasets/mix/checks.py)."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from feedline.datasets.folder.lazy import LazyFolderSource
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.hdf5.source import HDF5Source
from feedline.datasets.mix.source import MixSource
from feedline.datasets.shards.source import ShardsSource
from feedline.datasets.wds.source import WdsSource
from feedline.train import train
from tests.conftest import FAST
from tests.helpers import simple_tree, wds_tars
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, upload_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tree, its HDF5 conversion, its shards conversion whole and in two parts, and another tree."""
    from feedline.writers.hdf5 import convert_source as to_hdf5
    from feedline.writers.options import HDF5WriteOptions, WriteOptions
    from feedline.writers.shards import convert_source as to_shards

    tmp = tmp_path_factory.mktemp("shared")
    tree = simple_tree(tmp / "tree", per_class=4)
    source = FolderSource(tree, val_fraction=0, cache_dir=tmp / "c")
    to_hdf5(source, HDF5WriteOptions(path=str(tmp / "tree.h5"), workers=1))
    to_hdf5(source, HDF5WriteOptions(path=str(tmp / "tree-8.h5"), max_side=8, workers=1))
    shards = dict(format="shards", chunk_bytes="2KB", workers=1)
    to_shards(source, WriteOptions(path=str(tmp / "shards"), **shards))
    for k in range(2):
        to_shards(source, WriteOptions(path=str(tmp / "parts"), part=k, parts=2, **shards))
    simple_tree(tmp / "other", per_class=4)
    return tmp


def part(source, **spec) -> dict:
    return {"source": source, **spec}


# -- a mix's parts -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["{}/", "link", "other/../tree"])
def test_two_mix_parts_on_one_tree_however_spelt_are_refused_naming_both(make_cfg, data, tmp_path, spelling):
    link = tmp_path / "link"
    link.symlink_to(data / "tree")
    other = (
        spelling.format(data / "tree")
        if "{" in spelling
        else (link if spelling == "link" else data / spelling)
    )
    cfg = make_cfg(
        *FAST,
        "transforms=digits",
        "source=mix",
        "+source/parts@source.parts.base=folder",
        f"source.parts.base.source.root={data / 'tree'}",
        "+source/parts@source.parts.again=folder",
        f"source.parts.again.source.root={other}",
    )
    with pytest.raises(
        ValueError,
        match=r"source.parts.base.source.root .* source.parts.again.source.root .* the "
        r"same data .* raise source.parts.base.weight",
    ):
        train(cfg)


def test_two_mix_parts_on_one_hdf5_file_are_refused_but_two_datasets_of_one_file_are_not(data, tmp_path):
    os.link(data / "tree.h5", tmp_path / "linked.h5")
    with pytest.raises(ValueError, match=r"source.parts.b.source.path .* linked or mounted twice"):
        MixSource({"a": part(HDF5Source(data / "tree.h5")), "b": part(HDF5Source(tmp_path / "linked.h5"))})
    two = tmp_path / "two.h5"  # a file of two datasets (a train and a test array, as many downloads are)
    with h5py.File(two, "w") as f:
        for name in ("a", "b"):
            f[f"x_{name}"] = np.zeros((6, 8, 8, 3), dtype=np.uint8)
            f[f"y_{name}"] = np.arange(6) % 2
    mix = MixSource(
        {name: part(HDF5Source(two, images_key=f"x_{name}", labels_key=f"y_{name}")) for name in ("a", "b")}
    )
    assert mix.part_names == ["a", "b"]


def test_a_file_kept_inside_a_tree_is_not_that_trees_data(data, tmp_path):
    """An HDF5 file of other images beside a tree's class folders (or in one) is none of its samples."""
    tree = simple_tree(tmp_path / "tree", per_class=2)
    for where in (tmp_path / "tree" / "extra.h5", tmp_path / "tree" / "cat" / "extra.h5"):
        where.write_bytes((data / "tree.h5").read_bytes())  # a copy: its record names another tree
        MixSource({"tree": part(FolderSource(tree, cache_dir=data / "c")), "h5": part(HDF5Source(where))})


@pytest.mark.parametrize("conversion", ["tree.h5", "tree-8.h5", "shards", "parts/part-00001-of-00002"])
def test_a_tree_and_its_own_conversion_are_one_dataset_by_what_the_conversion_records(data, conversion):
    made = data / conversion
    other = HDF5Source(made) if conversion.endswith(".h5") else ShardsSource(made, cache_dir=data / "c")
    with pytest.raises(ValueError, match=rf"source.parts.conv.source.path .* was made from {data / 'tree'}"):
        MixSource({"tree": part(FolderSource(data / "tree", cache_dir=data / "c")), "conv": part(other)})


def test_a_conversion_of_a_mix_is_the_data_of_each_of_its_parts(data, tmp_path):
    from feedline.writers.hdf5 import convert_source
    from feedline.writers.options import HDF5WriteOptions

    tree, other = (
        FolderSource(data / name, val_fraction=0, cache_dir=data / "c") for name in ("tree", "other")
    )
    convert_source(
        MixSource({"a": part(tree), "b": part(other)}), HDF5WriteOptions(path=str(tmp_path / "mix.h5"))
    )
    with pytest.raises(ValueError, match=rf"{tmp_path / 'mix.h5'} was made from {data / 'other'}"):
        MixSource({"other": part(other), "mixed": part(HDF5Source(tmp_path / "mix.h5"))})


def test_a_path_that_held_other_data_when_it_was_converted_is_not_taken_for_that_data(data, tmp_path):
    """A conversion names the path it was made from; that path may hold other data now (or on the machine
    that converted: /data/train is everyone's). The class names must agree too."""
    from feedline.writers.hdf5 import convert_source
    from feedline.writers.options import HDF5WriteOptions

    def convert(out):
        source = FolderSource(tmp_path / "train", val_fraction=0, cache_dir=tmp_path / "c")
        convert_source(source, HDF5WriteOptions(path=str(tmp_path / out), workers=1))
        return HDF5Source(tmp_path / out)

    simple_tree(tmp_path / "train", classes=("cat", "dog"), per_class=2)
    first = convert("first.h5")
    os.rename(tmp_path / "train", tmp_path / "moved")
    simple_tree(tmp_path / "train", classes=("ant", "bee"), per_class=2)  # other data at the same path
    second = convert("second.h5")
    MixSource({"first": part(first), "second": part(second)})
    tree = FolderSource(tmp_path / "train", cache_dir=tmp_path / "c")
    MixSource({"tree": part(tree), "first": part(first)})
    with pytest.raises(ValueError, match=r"second.h5 was made from"):
        MixSource({"tree": part(tree), "second": part(second)})


def test_parts_of_one_conversion_are_disjoint_slices_and_the_whole_is_not(data):
    parts = data / "parts"
    first, second = parts / "part-00000-of-00002", parts / "part-00001-of-00002"
    source = ShardsSource(first, val_path=second, cache_dir=data / "c")  # train on one, validate on the other
    assert len(source.split("train")) + len(source.split("val")) == 12
    MixSource(
        {
            "a": part(ShardsSource(first, cache_dir=data / "c")),
            "b": part(ShardsSource(second, cache_dir=data / "c")),
        }
    )
    with pytest.raises(ValueError, match=r"source.val_path .* \(both were made from"):
        ShardsSource(first, val_path=data / "shards", cache_dir=data / "c")


def test_a_part_held_out_on_another_parts_training_data_is_refused(data):
    base = FolderSource(data / "tree", cache_dir=data / "c")
    extra = FolderSource(data / "other", val_root=str(data / "tree"), cache_dir=data / "c")
    with pytest.raises(
        ValueError,
        match=r"source.parts.extra.source.val_root .* is the training data of "
        r"source.parts.base.source.root .* extra's val samples would be ones base trains on",
    ):
        MixSource({"base": part(base), "extra": part(extra)})


def test_the_same_source_config_with_a_stack_of_its_own_is_the_one_sharing_allowed(data):
    """experiment=mix_demo: the digits twice, one part with a stronger stack; the same config holds the same
    samples out in both, so neither trains on what the other validates on."""
    same = lambda **kw: FolderSource(data / "tree", cache_dir=data / "c", **kw)  # noqa: E731
    mix = MixSource({"base": part(same()), "hard": part(same(), transforms=[])})
    assert mix.part_names == ["base", "hard"]
    with pytest.raises(ValueError, match=r"the parts' source configs differ, so one part could hold out"):
        MixSource({"base": part(same()), "hard": part(same(val_fraction=0.5), transforms=[])})
    with pytest.raises(ValueError, match=r"the same data"):
        MixSource({"base": part(same()), "hard": part(same())})  # no stack of its own: that is a weight


def test_a_tree_and_its_lazy_layout_are_one_dataset(data, tmp_path):
    from feedline.datasets.overlap import places
    from feedline.writers.lazy_layout import MARKER, layout

    assert places.LAYOUT_MARKER == MARKER
    layout(str(data / "tree"), str(tmp_path / "lazy"), cache_dir=str(data / "c"))
    lazy = LazyFolderSource(tmp_path / "lazy", cache_dir=data / "c")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'lazy'} was made from {data / 'tree'}"):
        MixSource({"tree": part(FolderSource(data / "tree", cache_dir=data / "c")), "lazy": part(lazy)})
    with pytest.raises(ValueError, match=r"source.test_root .* is the training data of source.root"):
        LazyFolderSource(tmp_path / "lazy", test_root=str(data / "tree"), cache_dir=data / "c")


# -- one source's train, val and test ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, key",
    [
        (lambda d: FolderSource(d / "tree", val_root=f"{d / 'tree'}/"), "source.val_root"),
        (lambda d: FolderSource(d / "tree", test_root=str(d / "other" / ".." / "tree")), "source.test_root"),
        (lambda d: LazyFolderSource(d / "tree", test_root=str(d / "tree")), "source.test_root"),
        (lambda d: HDF5Source(d / "tree.h5", val_path=str(d / "tree.h5")), "source.val_path"),
        (
            lambda d: HDF5Source(d / "tree.h5", test_path=str(d / "tree-8.h5")),
            "source.test_path",
        ),  # one origin
        (lambda d: ShardsSource(d / "shards", val_path=f"{d / 'shards'}/"), "source.val_path"),
        (
            lambda d: ShardsSource(d / "parts", test_path=str(d / "parts" / "part-00001-of-00002")),
            "source.test_path",
        ),
        (
            lambda d: WdsSource(str(d / "tars"), val_path=str(d / "tars" / "shards-000001.tar")),
            "source.val_path",
        ),
    ],
    ids=[
        "folder-val",
        "folder-test",
        "lazy-test",
        "hdf5-val",
        "hdf5-test-converted",
        "shards-val",
        "shards-part",
        "wds",
    ],
)
def test_a_held_out_split_that_is_the_training_data_is_refused(data, monkeypatch, build, key):
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(data / "c"))
    if not (data / "tars").exists():
        wds_tars(data / "tars")
    with pytest.raises(
        ValueError,
        match=rf"{key} '.*' is the training data of source\.(root|path) .* every "
        rf"(val|test) sample would be one the model trains on",
    ):
        build(data)


@pytest.mark.parametrize(
    "build",
    [
        lambda d: FolderSource(d / "tree", val_root=str(d / "other"), test_root=f"{d / 'other'}/"),
        lambda d: HDF5Source(d / "tree.h5", val_path=str(d / "other.h5"), test_path=str(d / "other.h5")),
        lambda d: ShardsSource(
            d / "parts/part-00000-of-00002",
            val_path=str(d / "parts/part-00001-of-00002"),
            test_path=str(d / "parts/part-00001-of-00002"),
        ),
    ],
    ids=["folder", "hdf5", "shards"],
)
def test_val_and_test_on_one_dataset_are_refused(data, monkeypatch, build):
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(data / "c"))
    if not (data / "other.h5").exists():
        from feedline.writers.hdf5 import convert_source
        from feedline.writers.options import HDF5WriteOptions

        convert_source(
            FolderSource(data / "other", val_fraction=0),
            HDF5WriteOptions(path=str(data / "other.h5"), workers=1),
        )
    with pytest.raises(
        ValueError,
        match=r"source.test_(root|path) .* is the data of source.val_(root|path) .* "
        r"validation chose the model by",
    ):
        build(data)


# -- class names ---------------------------------------------------------------------------------------------------
def test_classes_that_differ_only_in_case_or_spaces_are_refused_naming_both_parts(data, tmp_path):
    other = simple_tree(tmp_path / "caps", classes=("Cat", "dog", "eel"), per_class=2)
    mix = MixSource(
        {
            "a": part(FolderSource(data / "tree", cache_dir=data / "c")),
            "b": part(FolderSource(other, cache_dir=data / "c")),
        }
    )
    with pytest.raises(ValueError, match=r"source.parts.a has class 'cat' and source.parts.b class 'Cat'"):
        mix.classes  # noqa: B018
    mapped = MixSource(
        {
            "a": part(FolderSource(data / "tree", cache_dir=data / "c")),
            "b": part(FolderSource(other, cache_dir=data / "c"), class_map={"Cat": "cat "}),
        }
    )
    with pytest.raises(ValueError, match=r"class 'cat' and source.parts.b class 'cat '"):
        mapped.classes  # noqa: B018
    fixed = MixSource(
        {
            "a": part(FolderSource(data / "tree", cache_dir=data / "c")),
            "b": part(FolderSource(other, cache_dir=data / "c"), class_map={"Cat": "cat"}),
        }
    )
    assert fixed.classes == ["cat", "dog", "eel"]
    both = simple_tree(
        tmp_path / "both", classes=("Cat", "cat"), per_class=2
    )  # one source's own: its to name
    assert MixSource({"a": part(FolderSource(both, cache_dir=data / "c"))}).classes == ["Cat", "cat"]


# -- object storage ------------------------------------------------------------------------------------------------
def options(server, **changes) -> dict:
    return {
        "endpoint_url": server.endpoint,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "region_name": REGION,
        **changes,
    }


@pytest.fixture(scope="module")
def bucket(s3_server, data):
    """The shards dataset (whole, and in parts) uploaded: their URLs."""
    base = s3_server.new_prefix()
    for name in ("shards", "parts"):
        upload_dir(s3_server, data / name, f"{base}/{name}")
    return base


def remote(server, url, tmp_path, **kwargs) -> ShardsSource:
    kwargs.setdefault("storage_options", options(server))
    return ShardsSource(url, cache_dir=tmp_path / "cache", window=1, **kwargs)


@pytest.mark.parametrize(
    "held_out", ["{b}/shards/", "{b}/parts/part-00000-of-00002", "{b}/parts"], ids=["slash", "part", "copy"]
)
def test_a_held_out_url_that_is_the_training_data_is_refused(s3_server, bucket, tmp_path, held_out):
    with pytest.raises(ValueError, match=r"source.val_path .* is the training data of source.path"):
        remote(s3_server, f"{bucket}/shards", tmp_path, val_path=held_out.format(b=bucket))


def test_val_and_test_on_one_url_are_refused(s3_server, bucket, tmp_path):
    first, second = f"{bucket}/parts/part-00000-of-00002", f"{bucket}/parts/part-00001-of-00002"
    with pytest.raises(ValueError, match=r"source.test_path .* is the data of source.val_path"):
        remote(s3_server, first, tmp_path, val_path=second, test_path=f"{second}/")


def test_mix_parts_on_one_url_at_two_spellings_of_its_endpoint_are_refused(s3_server, bucket, tmp_path):
    """The same URL with other storage_options: another endpoint is another store, but what the dataset
    records of its origin still says it is the same data."""
    alias = options(s3_server, endpoint_url=s3_server.endpoint.replace("127.0.0.1", "localhost"))
    a = remote(s3_server, f"{bucket}/shards", tmp_path)
    b = remote(s3_server, f"{bucket}/shards/", tmp_path, storage_options=alias)
    with pytest.raises(ValueError, match=r"source.parts.b.source.path .* the same data"):
        MixSource({"a": part(a), "b": part(b)})
    with pytest.raises(ValueError, match=r"the same data \(the same prefix"):
        MixSource({"a": part(a), "b": part(remote(s3_server, f"{bucket}/shards/", tmp_path))})


def test_mix_parts_sharing_a_chunk_cache_must_give_it_one_limit(s3_server, bucket, tmp_path):
    first, second = f"{bucket}/parts/part-00000-of-00002", f"{bucket}/parts/part-00001-of-00002"
    a = remote(s3_server, first, tmp_path, cache_limit="10MB")
    with pytest.raises(
        ValueError,
        match=r"source.parts.a.source.cache_limit=10MB and "
        r"source.parts.b.source.cache_limit=20MB share one chunk cache",
    ):
        MixSource({"a": part(a), "b": part(remote(s3_server, second, tmp_path, cache_limit="20MB"))})
    MixSource({"a": part(a), "b": part(remote(s3_server, second, tmp_path, cache_limit="10MB"))})
    elsewhere = ShardsSource(
        second, cache_dir=tmp_path / "own", cache_limit="20MB", storage_options=options(s3_server)
    )
    MixSource({"a": part(a), "b": part(elsewhere)})

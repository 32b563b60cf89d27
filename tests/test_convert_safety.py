"""A conversion loses nothing and records what it read: an HDF5 output replaces only an HDF5 file feedline
wrote (``writers/target.py``); an output that is its own input, or a dataset's folder inside the tree it reads,
is refused (``writers/origin.py``); a conversion of a conversion records the first origin too; the parts of one
conversion agree on the source's rows (``datasets/shards/parts.py``); a conversion to a URL names it."""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np
import pytest

from feedline.datasets.folder.source import FolderSource
from feedline.datasets.hdf5.source import HDF5Source
from feedline.datasets.mix.source import MixSource
from feedline.datasets.shards.source import ShardsSource
from feedline.writers import hdf5, shards
from feedline.writers.options import WriteOptions
from tests.helpers import image_bytes, simple_tree
from tests.test_s3_shards import options as s3_options


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("convert-safety")


@pytest.fixture(scope="module")
def tree(tmp) -> str:
    return simple_tree(tmp / "tree", per_class=3)


def folder(root, tmp) -> FolderSource:
    return FolderSource(root, val_fraction=0, cache_dir=tmp / "c")


def to_h5(path, **changes) -> WriteOptions:
    return WriteOptions(path=str(path), workers=1, **changes)


def to_shards(path, **changes) -> WriteOptions:
    return WriteOptions(path=str(path), format="shards", chunk_bytes="2KB", workers=1, **changes)


def files_under(path) -> dict[str, bytes]:
    path = str(path)
    if os.path.isfile(path):
        return {"": open(path, "rb").read()}
    return {
        os.path.relpath(os.path.join(d, f), path): open(os.path.join(d, f), "rb").read()
        for d, _, names in os.walk(path)
        for f in names
    }


# -- an HDF5 output replaces only an HDF5 file feedline wrote ---------------------------------------------------
def _text_file(path) -> None:
    path.write_text("my thesis\n")


def _foreign_hdf5(path) -> None:
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(5)


@pytest.mark.parametrize(
    ("make", "said"),
    [(_text_file, "a file that is not HDF5"), (_foreign_hdf5, "an HDF5 file feedline did not write")],
)
def test_an_hdf5_output_over_a_file_feedline_did_not_write_is_refused_and_the_file_kept(
    tree, tmp, tmp_path, make, said
):
    out = tmp_path / "notes.h5"
    make(out)
    before = out.read_bytes()
    with pytest.raises(
        ValueError, match=rf"out.path={out} holds {said}.*remove it first, or choose another out.path"
    ):
        hdf5.convert_source(folder(tree, tmp), to_h5(out))
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["notes.h5"]  # nothing written beside it: no .partial, no lock


def test_an_hdf5_output_replaces_an_earlier_hdf5_file_feedline_wrote(tree, tmp, tmp_path):
    out = tmp_path / "tree.h5"
    hdf5.convert_source(folder(tree, tmp), to_h5(out))
    hdf5.convert_source(folder(tree, tmp), to_h5(out, max_side=4))
    with h5py.File(out) as f:
        assert f.attrs["max_side"] == 4


# -- an output that is its own input ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def converted(tree, tmp) -> dict[str, str]:
    """The tree as HDF5 and as shards."""
    made = {"hdf5": str(tmp / "tree.h5"), "shards": str(tmp / "shards")}
    hdf5.convert_source(folder(tree, tmp), to_h5(made["hdf5"]))
    shards.convert_source(folder(tree, tmp), to_shards(made["shards"]))
    return made


@pytest.mark.parametrize(
    (
        "kind",
        "spelling",
    ),  # an HDF5 out.path ending in / names a directory, refused as one by out.path's check
    [
        (kind, s)
        for kind in ("hdf5", "shards")
        for s in ("{}", "{}/", "link", "{}/../{}")
        if (kind, s) != ("hdf5", "{}/")
    ],
)
def test_converting_a_dataset_onto_itself_is_refused_however_spelt_and_keeps_it(
    converted, tmp, tmp_path, kind, spelling
):
    path = converted[kind]
    if spelling == "link":
        out = str(tmp_path / "link")
        os.symlink(path, out)
    else:
        out = spelling.format(path, os.path.basename(path))
    source = (
        HDF5Source(path, val_fraction=0)
        if kind == "hdf5"
        else ShardsSource(path, val_fraction=0, cache_dir=tmp / "c")
    )
    write = hdf5.convert_source if kind == "hdf5" else shards.convert_source
    options = to_h5(out, max_side=4) if kind == "hdf5" else to_shards(out, max_side=4)
    before = files_under(path)
    with pytest.raises(
        ValueError,
        match=r"out.path=.* is the data source.path '.*' reads \(the same .*\): "
        r"converting it onto itself .* Write to another out.path, then move the result over",
    ):
        write(source, options)
    assert files_under(path) == before


def test_a_dataset_in_a_bucket_is_never_converted_onto_its_own_prefix_and_its_conversions_name_the_tree(
    s3_server, tree, tmp, tmp_path
):
    url = s3_server.new_prefix()
    shards.convert_source(folder(tree, tmp), to_shards(url, storage_options=s3_options(s3_server)))
    source = ShardsSource(url, val_fraction=0, storage_options=s3_options(s3_server), cache_dir=tmp_path)
    with pytest.raises(
        ValueError, match=rf"out.path={url} is the data source.path '{url}' reads \(the same prefix"
    ):
        shards.convert_source(source, to_shards(url + "/", max_side=4, storage_options=s3_options(s3_server)))
    hdf5.convert_source(source, to_h5(tmp_path / "x.h5"))  # its sidecar read with the source's own options
    with h5py.File(tmp_path / "x.h5") as f:
        assert f.attrs["source"] == f"{source!r}, made from FolderSource(root={tree!r})"


def test_a_shards_output_inside_the_tree_it_reads_is_refused_and_the_tree_reads_as_before(tree, tmp):
    out = os.path.join(tree, "zz-shards")
    with pytest.raises(
        ValueError,
        match=rf"out.path={out} lies inside source.root '{tree}', the tree of class folders this conversion "
        rf"reads: .* choose an out.path outside {tree}",
    ):
        shards.convert_source(folder(tree, tmp), to_shards(out))
    assert sorted(os.listdir(tree)) == ["cat", "dog", "eel"]


def test_a_conversion_of_a_conversion_records_the_first_origin_so_the_chain_is_the_trees_data(
    tree, tmp, tmp_path
):
    between = tmp_path / "between"
    shards.convert_source(folder(tree, tmp), to_shards(between))
    hdf5.convert_source(
        ShardsSource(between, val_fraction=0, cache_dir=tmp_path / "c"), to_h5(tmp_path / "x.h5")
    )
    shutil.rmtree(between)  # the data between is gone: the HDF5 file's own record still names the tree
    with pytest.raises(ValueError, match=rf"{tmp_path / 'x.h5'} was made from {tree}, as it records"):
        MixSource({"tree": {"source": folder(tree, tmp)}, "h5": {"source": HDF5Source(tmp_path / "x.h5")}})


# -- the parts of one conversion agree on the source's rows ------------------------------------------------------
def _rename(root) -> None:
    os.rename(os.path.join(root, "cat", "000.png"), os.path.join(root, "cat", "zzz.png"))


def _move(root) -> None:
    os.rename(os.path.join(root, "cat", "000.png"), os.path.join(root, "dog", "cat-000.png"))


def _other_images(root) -> None:
    for name in ("cat", "dog", "eel"):
        for file in os.listdir(os.path.join(root, name)):
            with open(os.path.join(root, name, file), "wb") as f:
                f.write(image_bytes(seed=7))


@pytest.mark.parametrize("change", [_rename, _move, _other_images])
def test_parts_cut_from_a_tree_that_changed_between_the_part_jobs_are_refused(tmp, tmp_path, change):
    root = simple_tree(tmp_path / "tree", per_class=3)
    shards.convert_source(folder(root, tmp_path), to_shards(tmp_path / "ds", part=0, parts=2))
    change(root)
    shards.convert_source(folder(root, tmp_path), to_shards(tmp_path / "ds", part=1, parts=2))
    with pytest.raises(
        ValueError,
        match=r"the source changed between the part jobs: part-00000-of-00002 and part-00001-of-00002 were cut "
        r"from different lists of its files .* Convert every part again",
    ):
        ShardsSource(tmp_path / "ds", val_fraction=0, cache_dir=tmp_path / "c")


def test_parts_cut_from_one_tree_mounted_at_two_paths_read_as_one_dataset(tree, tmp_path):
    mounted = shutil.copytree(tree, tmp_path / "elsewhere")
    for k, root in enumerate((tree, mounted)):
        shards.convert_source(folder(root, tmp_path), to_shards(tmp_path / "ds", part=k, parts=2))
    source = ShardsSource(tmp_path / "ds", val_fraction=0, cache_dir=tmp_path / "c")
    assert len(source.split("train")) == 9


@pytest.mark.parametrize("kind", ["folder", "lazy_folder", "hdf5", "shards", "wds", "mix"])
def test_every_source_kind_gives_its_rows_one_digest_wherever_a_part_job_reads_them(
    converted, tree, tmp, kind
):
    """A part job of any source records the digest of its rows (``rows_digest``), before the work: the same
    data read by two jobs (two source objects) gives the same one."""
    from feedline.datasets.folder.lazy import LazyFolderSource
    from feedline.datasets.wds.source import WdsSource
    from feedline.writers.lazy_layout import layout
    from feedline.writers.origin import rows_digest
    from tests.helpers import wds_tars

    if kind == "lazy_folder" and not os.path.isdir(tmp / "lazy"):
        layout(tree, str(tmp / "lazy"), cache_dir=str(tmp / "c"))
    if kind == "wds" and not os.path.isdir(tmp / "wds"):
        wds_tars(tmp / "wds")
    if kind == "mix" and not os.path.isdir(tmp / "other"):
        simple_tree(tmp / "other", per_class=2)
    made = {
        "folder": lambda: folder(tree, tmp),
        "lazy_folder": lambda: LazyFolderSource(tmp / "lazy", val_fraction=0),
        "hdf5": lambda: HDF5Source(converted["hdf5"], val_fraction=0),
        "shards": lambda: ShardsSource(converted["shards"], val_fraction=0, cache_dir=tmp / "c"),
        "wds": lambda: WdsSource(tmp / "wds", val_fraction=0, cache_dir=tmp / "c"),
        "mix": lambda: MixSource(
            {"a": {"source": folder(tree, tmp)}, "b": {"source": folder(tmp / "other", tmp)}}
        ),
    }[kind]
    digests = []
    for source in (made(), made()):
        source.prepare()
        digests.append(rows_digest(source.split("train" if kind == "mix" else "all")))
    assert digests[0] == digests[1] and len(digests[0]) == 32


# -- progress ------------------------------------------------------------------------------------------------------
def test_a_conversion_to_a_url_names_the_url_in_its_progress(s3_server, tree, tmp, capsys):
    url = s3_server.new_prefix()
    shards.convert_source(folder(tree, tmp), to_shards(url, storage_options=s3_options(s3_server)))
    err = capsys.readouterr().err
    assert f"converting to {url}: 9/9 img" in err
    assert "converting to dataset" not in err

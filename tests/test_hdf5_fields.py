"""hdf5 with named fields: every kind reads back as written, convert.py writes them (from any source with fields,
a manifest included) with their kinds and class lists, a mask stays on its image, bad columns are named."""

from __future__ import annotations

import json
import pickle

import h5py
import numpy as np
import pytest
import torch

from feedline.convert import run_convert
from feedline.datasets import BadInput, HDF5Source
from feedline.transforms.decode import decode
from feedline.transforms.masks import decode_mask
from feedline.writers.hdf5 import convert_source
from feedline.writers.options import HDF5WriteOptions
from tests.field_data import FIELDS, PixelSource, misaligned, pixels, png
from tests.test_fields import check_batch, loaders

N = 8
TAGS = ("p", "q", "r")
KINDS = {  # every kind, in each way a file may store it
    "image": {"column": "images", "kind": "image"},
    "mask": {"column": "masks", "kind": "mask", "classes": ["a", "b", "c", "d"]},
    "mask_array": {"column": "mask_pixels", "kind": "mask", "classes": ["a", "b", "c", "d"]},
    "score": {"kind": "number"},
    "embedding": {"kind": "vector"},
    "label": {"column": "labels", "kind": "class", "classes": ["x", "y", "z"]},
    "tags": {"kind": "classes", "classes": list(TAGS)},
    "tags_hot": {"kind": "classes", "classes": list(TAGS)},
    "caption": {"kind": "text"},
    "meta": {"kind": "json"},
}


def expected(row: int) -> dict:
    image, mask = pixels(row)
    return {
        "image": image,
        "mask": mask,
        "mask_array": mask[:8, :8],
        "score": row / 4,
        "embedding": np.arange(3, dtype=np.float32) + row,
        "label": row % 3,
        "tags": np.arange(row % 3, dtype=np.int64),
        "tags_hot": np.flatnonzero(np.arange(3) <= row % 3),
        "caption": f"sample {row} é",
        "meta": json.dumps({"n": row}),
    }


class Pixels(PixelSource):
    """Every split (the conversion's "all" too) reads rows 0..n-1."""

    def split(self, name: str):
        return super().split("train")


def kinds(fields) -> list:
    return [(f.name, f.kind, f.classes, f.ignore_index) for f in fields.values()] + [fields.target]


def write_file(path, bad_label: int | None = None) -> str:
    rows = [expected(r) for r in range(N)]
    with h5py.File(path, "w") as f:
        for column, key in (("images", "image"), ("masks", "mask")):
            data = f.create_dataset(column, (N,), dtype=h5py.vlen_dtype(np.uint8))
            for r, row in enumerate(rows):
                data[r] = png(row[key], "RGB" if key == "image" else "L")
        f["mask_pixels"] = np.stack([r["mask_array"] for r in rows])
        f["score"] = np.array([r["score"] for r in rows], dtype=np.float64)
        f["embedding"] = np.stack([r["embedding"] for r in rows])
        f["labels"] = np.array([r["label"] for r in rows]) if bad_label is None else np.full(N, bad_label)
        tags = f.create_dataset("tags", (N,), dtype=h5py.vlen_dtype(np.int64))
        for r, row in enumerate(rows):
            tags[r] = row["tags"]
        f["tags_hot"] = np.stack([np.arange(3) <= r % 3 for r in range(N)]).astype(np.uint8)
        for name in ("caption", "meta"):
            f.create_dataset(name, data=[r[name] for r in rows], dtype=h5py.string_dtype())
    return str(path)


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


def decoded(name: str, value):
    if name == "image":
        return decode(value).permute(1, 2, 0).numpy()
    if name == "mask":
        return decode_mask(value)[0].numpy()
    return value


def test_every_kind_reads_back_as_written_one_by_one_and_in_bulk(tmp_path):
    source = HDF5Source(write_file(tmp_path / "f.h5"), fields=KINDS, target="mask", val_fraction=0)
    assert list(source.fields) == list(KINDS) and source.classes == ["a", "b", "c", "d"]
    records = source.split("train")
    bulk = records.getitems([5, 0, 3, 5])
    for i, record in [(i, records[i]) for i in range(N)] + list(zip([5, 0, 3, 5], bulk)):
        want = expected(i)
        for name in KINDS:
            assert same(decoded(name, record[name]), want[name]), (i, name, record[name])
    assert isinstance(bulk[0]["score"], float) and isinstance(bulk[0]["label"], int)


def test_a_split_pickles_small_and_reads_the_same_rows_after(tmp_path):
    source = HDF5Source(write_file(tmp_path / "f.h5"), fields=KINDS, target="label", val_fraction=0.25)
    train, val = source.split("train"), source.split("val")
    # stratified on the class field: one of each class's 3, 3 and 2 rows held out
    assert len(train) + len(val) == N and sorted(r["label"] for r in val.getitems(range(len(val)))) == [
        0,
        1,
        2,
    ]
    first = train[0]  # its file open in this process: a pickle carries the path, never the handle
    data = pickle.dumps(train)
    assert len(data) < 3000  # paths and settings, never the rows
    again = pickle.loads(data)
    captions = [r["caption"] for r in again.getitems(range(len(train)))]
    assert captions == [train[i]["caption"] for i in range(len(train))] and captions[0] == first["caption"]


def test_bad_columns_are_named_by_file_dataset_and_row(tmp_path):
    path = write_file(tmp_path / "f.h5")
    with pytest.raises(ValueError, match=r"g\.h5.*dataset 'labels'.*holds 7 at row 0.*0\.\.2"):
        HDF5Source(write_file(tmp_path / "g.h5", bad_label=7), fields=KINDS, target="mask")
    with pytest.raises(KeyError, match=r"dataset 'nothere'.*source\.fields\.score\.column.*masks"):
        HDF5Source(path, fields={**KINDS, "score": {"column": "nothere", "kind": "number"}}, target="mask")
    with pytest.raises(ValueError, match=r"dataset 'masks'.*no class list.*source\.fields\.mask\.classes"):
        HDF5Source(path, fields={"image": "image", "mask": {"column": "masks", "kind": "mask"}})
    with pytest.raises(ValueError, match=r"dataset 'caption'.*holds.*not numbers"):
        HDF5Source(path, fields={"image": "image", "caption": {"kind": "number"}})
    with h5py.File(path, "a") as f:  # a multi-label row out of range: seen at read time, as bad input
        f["tags"][2] = np.array([0, 5])
    records = HDF5Source(path, fields=KINDS, target="mask", val_fraction=0).split("train")
    with pytest.raises(BadInput, match=r"f\.h5: dataset 'tags' row 2 \(field 'tags'\).*5 is not in 0\.\.2"):
        records[2]


def test_convert_writes_the_fields_and_a_mask_stays_on_its_image(tmp_path):
    out = tmp_path / "pixels.h5"
    convert_source(Pixels(12), HDF5WriteOptions(path=str(out), workers=1))
    with h5py.File(out) as f:
        assert f["mask"].attrs["kind"] == "mask" and json.loads(f["tags"].attrs["classes"]) == ["x", "y", "z"]
    source = HDF5Source(str(out), val_fraction=0)  # no source.fields: the file's own
    assert kinds(source.fields) == kinds(FIELDS) and source.classes == ["a", "b", "c", "d"]
    records, original = source.split("train"), Pixels(12).split("train")
    for i in range(12):
        got, want = records[i], original[i]
        for name in FIELDS:
            assert same(decoded(name, got[name]), decoded(name, want[name])), (i, name)
    ids = [n for batch in loaders(source, num_workers=2).train_dataloader() for n in check_batch(batch)]
    assert sorted(ids) == list(range(12))


@pytest.mark.parametrize(
    "out", [{"mode": "raw", "max_side": 24}, {"mode": "raw", "size": 16}]
)  # raw: no JPEG noise
def test_convert_resizes_a_mask_exactly_as_its_image(tmp_path, out):
    path = tmp_path / "small.h5"
    convert_source(Pixels(4), HDF5WriteOptions(path=str(path), workers=1, **out))
    records = HDF5Source(str(path), val_fraction=0).split("train")
    for i in range(4):
        image, mask = records[i]["image"], decode_mask(records[i]["mask"])[0]
        image = decode(image) if image.ndim == 1 else torch.from_numpy(image)
        assert image.shape[-2:] == mask.shape and max(mask.shape) <= 24
        pure, wrong = misaligned(image, mask)
        assert pure > 20 and wrong == 0


def test_convert_py_writes_a_manifest_of_masks(make_cfg, tmp_path):
    rows = []
    for n in range(6):
        image, mask = pixels(n)
        (tmp_path / f"{n}.png").write_bytes(png(image, "RGB").tobytes())
        (tmp_path / f"{n}_mask.png").write_bytes(png(mask, "L").tobytes())
        rows.append(f"{n}.png,{n}_mask.png,{n}")
    table = tmp_path / "train.csv"
    table.write_text("image,mask,id\n" + "\n".join(rows) + "\n")
    out = tmp_path / "m.h5"
    cfg = make_cfg(
        "source=manifest",
        f"source.path={table}",
        "source.target=mask",
        f"out.path={out}",
        "out.workers=1",
        config="convert",
    )
    cfg.source.fields = {  # as a user's experiment YAML gives them
        "image": {"column": "image", "kind": "image"},
        "mask": {"column": "mask", "kind": "mask", "classes": ["a", "b", "c", "d"]},
        "id": {"column": "id", "kind": "number"},
    }
    assert run_convert(cfg)["images"] == 6
    source = HDF5Source(str(out), val_fraction=0)
    assert source.fields.target == "mask" and source.classes == ["a", "b", "c", "d"]
    records = source.split("all")
    assert sorted(records[i]["id"] for i in range(6)) == [float(n) for n in range(6)]
    for i in range(6):
        n = int(records[i]["id"])
        assert np.array_equal(decode_mask(records[i]["mask"])[0].numpy(), pixels(n)[1])


def test_convert_skips_and_lists_a_sample_whose_mask_is_not_its_images_size(tmp_path):
    out = tmp_path / "cut.h5"
    summary = convert_source(Pixels(6, bad=(4,)), HDF5WriteOptions(path=str(out), workers=1))
    assert summary["images"] == 5 and summary["skipped"] == 1
    listed = (tmp_path / "cut.h5.skipped.tsv").read_text()
    assert "pixels row 4\tfield 'mask' (mask): its size 48x40 differs from the image's, 48x48" in listed
    records = HDF5Source(str(out), val_fraction=0).split("train")
    assert [records[i]["id"] for i in range(5)] == [0.0, 1.0, 2.0, 3.0, 5.0]  # every field of a row together


def test_a_val_file_of_other_fields_is_refused_by_key(tmp_path):
    train = tmp_path / "train.h5"
    convert_source(Pixels(4), HDF5WriteOptions(path=str(train), workers=1))
    val = write_file(tmp_path / "val.h5")
    with h5py.File(val, "a") as f:  # a file of other fields, named by its own attributes
        specs = {"image": {"column": "images", "kind": "image"}, "mask": {"column": "masks", "kind": "mask"}}
        specs["mask"]["classes"] = ["a", "b", "c", "e"]
        f.attrs["fields"], f.attrs["target"] = json.dumps(specs), "mask"
    source = HDF5Source(str(train), val_path=val)
    with pytest.raises(ValueError, match=r"source\.val_path '.*val\.h5' holds other fields or class lists"):
        source.split("val")

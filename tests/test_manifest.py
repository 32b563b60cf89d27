"""source=manifest: a table of samples (CSV, TSV, Parquet, a ``path label`` list) read as named fields."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from feedline.datamodules.loaders import ImageLoaders
from feedline.datasets import ManifestSource
from feedline.datasets.manifest import index as manifest_index
from feedline.transforms.collate import DefaultCollate
from feedline.transforms.stacks import TransformStacks

CLASSES = ("cat", "dog", "eel")
SEGMENTATION = {
    "image": {"column": "image", "kind": "image"},
    "mask": {"column": "mask", "kind": "mask", "classes": ["background", "circle", "square"]},
    "id": {"column": "id", "kind": "number"},
}


def _samples(root, n: int = 12) -> list[dict]:
    """``n`` tiny images whose red channel is the row number, each with a mask of class indices 0..2."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        Image.new("RGB", (16, 12), (i, 7, 9)).save(root / "img" / f"{i}.png")
        mask = np.full((12, 16), i % 3, dtype=np.uint8)
        Image.fromarray(mask).save(root / "img" / f"{i}_mask.png")
        rows.append(
            {
                "image": f"img/{i}.png",
                "mask": f"img/{i}_mask.png",
                "id": str(i),
                "label": CLASSES[i % 3],
                "tags": " ".join(CLASSES[: i % 3 + 1]),
                "emb": json.dumps([i, i + 0.5]),
                "caption": f"sample {i}, a caption\nof two lines",
                "meta": json.dumps({"i": i}),
            }
        )
    return rows


def _write(path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix
    if suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif suffix == ".txt":
        path.write_text("".join(f"{r['image']} {r['label']}\n" for r in rows))
    else:
        sep = "\t" if suffix == ".tsv" else ","
        lines = [sep.join(rows[0])] + [sep.join(_quoted(v, sep) for v in r.values()) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    return str(path)


def _quoted(value: str, sep: str) -> str:
    return '"' + value.replace('"', '""') + '"' if sep in value or '"' in value or "\n" in value else value


def _source(table, **kwargs) -> ManifestSource:
    kwargs.setdefault("val_fraction", 0.0)
    return ManifestSource(str(table), **kwargs)


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".parquet"])
def test_each_table_format_reads_the_same_samples(tmp_path, suffix):
    rows = _samples(tmp_path)
    fields = {
        "image": "image",
        "label": {"kind": "class"},
        "id": "number",
        "tags": "classes",
        "emb": "vector",
        "caption": "text",
    }
    source = _source(_write(tmp_path / f"train{suffix}", rows), fields=fields, target="label")
    source.prepare()
    records = source.split("train")
    assert source.classes == list(CLASSES) and len(records) == len(rows)
    for i in (0, 5, 11):
        record = records[i]
        assert bytes(record["image"]) == (tmp_path / rows[i]["image"]).read_bytes()
        assert CLASSES[record["label"]] == rows[i]["label"] and record["id"] == float(i)
        assert record["tags"].tolist() == list(range(i % 3 + 1))
        assert record["emb"].tolist() == [i, i + 0.5] and record["emb"].dtype == np.float32
        assert record["caption"] == rows[i]["caption"]  # a comma and a line break inside a cell


def test_a_path_label_list_reads_as_classification(tmp_path):
    rows = _samples(tmp_path, 8)
    for r in rows:
        r["label"] = str(int(r["id"]) % 3 * 4)  # class numbers: 0, 4, 8
    source = _source(_write(tmp_path / "val.txt", rows))
    source.prepare()
    records = source.split("train")
    assert source.fields.target == "label" and source.fields["image"].column == "path"
    assert source.classes == [str(c) for c in range(9)]  # "0".."max", as ImageNet's labels number them
    assert [records[i]["label"] for i in range(4)] == [0, 4, 8, 0]
    assert records.describe(2).endswith(f"val.txt row 3 ({tmp_path / 'img' / '2.png'})")


def test_class_names_without_a_list_are_sorted_like_imagefolder(tmp_path):
    rows = _samples(tmp_path, 6)
    source = _source(_write(tmp_path / "train.csv", rows))  # columns image and label: the shorthand
    assert source.classes == sorted(CLASSES)
    assert source.fields.target == "label" and source.fields["image"].kind == "image"


def test_the_issues_yaml_composes_and_reads_segmentation_batches(tmp_path, make_cfg):
    from hydra.utils import instantiate

    rows = _samples(tmp_path / "data", 8)
    table = _write(tmp_path / "data" / "train.csv", rows)
    experiment = tmp_path / "conf" / "experiment" / "seg.yaml"
    experiment.parent.mkdir(parents=True)
    experiment.write_text(
        "# @package _global_\n"
        "defaults: [{override /source: manifest}]\n"
        "source:\n"
        f"  path: {table}\n"
        f"  root: {tmp_path / 'data'}\n"
        "  fields:\n"
        "    image: {column: image, kind: image}\n"
        "    mask: {column: mask, kind: mask, classes: [background, circle, square]}\n"
        "    id: {column: id, kind: number}\n"
        "  target: mask\n"
    )
    cfg = make_cfg(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=seg")
    source = instantiate(cfg.source)
    assert isinstance(source, ManifestSource) and source.classes == ["background", "circle", "square"]
    loaders = ImageLoaders(source, TransformStacks(), DefaultCollate(), batch_size=4, num_workers=0, seed=1)
    loaders.prepare_data()
    loaders.setup("fit")
    batch = next(iter(loaders.train_dataloader()))
    x, y = batch
    assert x.dtype == torch.uint8 and x.shape[1:] == (3, 12, 16)
    assert y is batch.mask and y.dtype == torch.uint8 and y.shape[1:] == (12, 16)
    assert batch.id.dtype == torch.float32
    for image, mask, i in zip(batch.image, batch.mask, batch.id):  # the fields of one row stay together
        assert int(image[0, 0, 0]) == int(i) and bool((mask == int(i) % 3).all())


def test_every_kind_reaches_a_batch_through_workers(tmp_path):
    rows = _samples(tmp_path, 8)
    fields = {
        "image": "image",
        "mask": {"kind": "mask", "classes": ["a", "b", "c"]},
        "label": {"kind": "class"},
        "tags": {"kind": "classes"},
        "id": "number",
        "emb": "vector",
        "caption": "text",
        "meta": "json",
    }
    source = _source(_write(tmp_path / "train.parquet", rows), fields=fields, target="tags")
    loaders = ImageLoaders(source, TransformStacks(), DefaultCollate(), batch_size=4, num_workers=2, seed=1)
    loaders.prepare_data()
    loaders.setup("fit")
    batch = next(iter(loaders.train_dataloader()))
    assert batch.image.shape == (4, 3, 12, 16) and batch.mask.shape == (4, 12, 16)
    assert (
        batch.label.dtype == torch.int64 and batch.tags.shape == (4, 3) and batch.tags.dtype == torch.float32
    )
    assert batch.id.dtype == torch.float32 and batch.emb.shape == (4, 2)
    for i, caption, meta, tags in zip(batch.id.tolist(), batch.caption, batch.meta, batch.tags):
        i = int(i)
        assert (
            caption == f"sample {i}, a caption\nof two lines"
            and meta == {"i": i}
            and tags.tolist() == [1.0] * (i % 3 + 1) + [0.0] * (2 - i % 3)
        )
    assert loaders.num_classes == 3 and loaders.fields.target == "tags"


def _bad(tmp_path, rows, fields=None, suffix=".csv"):
    kwargs = {"fields": fields, "target": "label"} if fields else {}
    source = _source(_write(tmp_path / f"bad{suffix}", rows), **kwargs)
    with pytest.raises(ValueError) as err:
        source.prepare()
    return str(err.value)


def test_a_missing_column_is_named_with_the_columns_there(tmp_path):
    rows = _samples(tmp_path, 4)
    message = _bad(tmp_path, rows, {"image": "image", "label": {"column": "species", "kind": "class"}})
    assert "bad.csv has no column 'species'" in message and "source.fields.label.column" in message
    assert "image, mask, id, label" in message  # the columns it has


@pytest.mark.parametrize(
    ("column", "value", "fields", "said"),
    [
        ("image", "img/missing.png", None, "missing.png does not exist"),
        ("label", "wolf", {"image": "image", "label": {"kind": "class", "classes": list(CLASSES)}}, "'wolf'"),
        ("tags", "[cat, dog", {"image": "image", "label": "class", "tags": "classes"}, "does not parse"),
        (
            "tags",
            "cat wolf",
            {"image": "image", "label": "class", "tags": {"kind": "classes", "classes": list(CLASSES)}},
            "'wolf'",
        ),
        ("id", "seven", {"image": "image", "label": "class", "id": "number"}, "'seven' is not a number"),
        ("id", "nan", {"image": "image", "label": "class", "id": "number"}, "'nan' is not a finite number"),
        ("emb", "[1, 1e39]", {"image": "image", "label": "class", "emb": "vector"}, "beyond float32's range"),
        ("emb", "[1, x]", {"image": "image", "label": "class", "emb": "vector"}, "does not parse"),
        ("meta", "{i: 1}", {"image": "image", "label": "class", "meta": "json"}, "is not JSON"),
    ],
)
def test_a_bad_cell_is_named_by_table_row_and_column(tmp_path, column, value, fields, said):
    rows = _samples(tmp_path, 5)
    rows[2][column] = value
    message = _bad(tmp_path, rows, fields)
    assert f"bad.csv row 3 (rows count from 1, the header not counted), column {column!r}" in message
    assert said in message


def test_an_empty_table_is_named(tmp_path):
    (tmp_path / "empty.csv").write_text("image,label\n")
    with pytest.raises(ValueError, match=r"empty\.csv holds no samples"):
        _source(tmp_path / "empty.csv").prepare()


def test_the_index_is_reused_and_rebuilt_when_the_table_changes(tmp_path, monkeypatch):
    rows = _samples(tmp_path, 6)
    table = _write(tmp_path / "train.csv", rows)
    first = _source(table)
    first.prepare()
    before = first.content_digest()
    built = []
    real = manifest_index._build
    monkeypatch.setattr(manifest_index, "_build", lambda *a: built.append(a) or real(*a))
    _source(table).prepare()
    assert built == []  # the cached index, mapped
    rows[0]["label"], rows[1]["label"] = rows[1]["label"], rows[0]["label"]  # same size, other content
    _write(tmp_path / "train.csv", rows)
    again = _source(table)
    again.prepare()
    assert len(built) == 1 and again.content_digest() != before
    assert again.split("train")[0]["label"] == CLASSES.index(rows[0]["label"])
    assert again.split("train").content_digest() == again.content_digest()


def test_records_pickle_as_paths_whatever_the_tables_length(tmp_path):
    sizes = []
    for n in (8, 40):
        rows = _samples(tmp_path / str(n), n)
        source = _source(_write(tmp_path / str(n) / "train.csv", rows), val_fraction=0.25)
        records = source.split("train")
        data = pickle.dumps(records)
        sizes.append(len(data))
        copy = pickle.loads(data)
        assert copy[3]["label"] == records[3]["label"] and copy.describe(3) == records.describe(3)
    assert sizes[1] - sizes[0] < 64 and sizes[1] < 2000  # a few bytes more for a longer path, not per row


def test_splits_are_disjoint_seeded_and_stratified_on_a_class_target(tmp_path):
    rows = _samples(tmp_path, 30)
    table = _write(tmp_path / "train.csv", rows)
    source = _source(table, val_fraction=0.2, test_fraction=0.1, seed=4)
    parts = {name: source.split(name) for name in ("train", "val", "test")}
    rows_of = {name: {r.row(i) for i in range(len(r))} for name, r in parts.items()}
    assert set.union(*rows_of.values()) == set(range(30)) and sum(map(len, rows_of.values())) == 30
    for name, share in (("val", 2), ("test", 1)):  # each class gives its share: 10 rows a class
        labels = [parts[name][i]["label"] for i in range(len(parts[name]))]
        assert sorted(labels) == sorted(list(range(3)) * share)
    assert rows_of["val"] == {
        _source(table, val_fraction=0.2, test_fraction=0.1, seed=4).split("val").row(i) for i in range(6)
    }
    other = _source(table, val_fraction=0.2, test_fraction=0.1, seed=5).split("val")
    assert {other.row(i) for i in range(len(other))} != rows_of["val"]


def test_a_split_on_a_number_target_is_seeded_at_random(tmp_path):
    rows = _samples(tmp_path, 20)
    table = _write(tmp_path / "train.csv", rows)
    source = _source(table, fields={"image": "image", "id": "number"}, target="id", val_fraction=0.25, seed=1)
    train, val = source.split("train"), source.split("val")
    assert source.classes == [] and len(val) == 5 and len(train) == 15
    assert not {train.row(i) for i in range(15)} & {val.row(i) for i in range(5)}
    drawn = {
        seed: set(
            _source(
                table, fields={"image": "image", "id": "number"}, target="id", val_fraction=0.25, seed=seed
            )
            .split("val")
            .subset.array.tolist()
        )
        for seed in (1, 2)
    }
    assert drawn[1] == {val.row(i) for i in range(5)} and drawn[2] != drawn[1]  # seeded, not the last rows


def test_val_path_is_read_with_the_train_tables_classes(tmp_path):
    rows = _samples(tmp_path, 9)
    train = _write(tmp_path / "train.csv", rows)
    val = _write(tmp_path / "val.csv", rows[1:3])  # dog and eel only: indices as in train
    source = _source(train, val_path=val)
    source.prepare()
    assert [source.split("val")[i]["label"] for i in range(2)] == [1, 2] and len(source.split("train")) == 9
    wrong = [dict(rows[0], label="wolf")]
    source = _source(train, val_path=_write(tmp_path / "val2.csv", wrong))
    with pytest.raises(
        ValueError, match=r"val2\.csv row 1 .*column 'label': class 'wolf' is not in the class list"
    ):
        source.prepare()


def test_a_mask_target_without_its_class_list_is_refused_by_key(tmp_path):
    table = _write(tmp_path / "train.csv", _samples(tmp_path, 3))
    with pytest.raises(ValueError, match=r"source\.fields\.mask: a mask target needs its class list"):
        _source(table, fields={"image": "image", "mask": "mask"}, target="mask")


def test_a_row_with_cells_missing_is_named(tmp_path):
    (tmp_path / "ragged.csv").write_text("image,label\na.png,cat\nb.png\n")
    with pytest.raises(ValueError, match=r"ragged\.csv does not read as a CSV table: row 2 .* has 1 cell"):
        _source(tmp_path / "ragged.csv").prepare()


def test_images_a_parquet_table_holds_are_read_from_it(tmp_path):
    """Parquet as Hugging Face writes it: an image column of bytes, or of {bytes, path} structs."""
    rows = _samples(tmp_path, 6)
    table = [
        {
            "image": (tmp_path / r["image"]).read_bytes(),
            "mask": {"bytes": (tmp_path / r["mask"]).read_bytes(), "path": r["mask"]},
            "id": float(r["id"]),
        }
        for r in rows
    ]
    pq.write_table(pa.Table.from_pylist(table), tmp_path / "embedded.parquet")
    (tmp_path / "img").rename(tmp_path / "gone")  # nothing is read from the files
    fields = {"image": "image", "mask": {"kind": "mask", "classes": ["a", "b", "c"]}, "id": "number"}
    source = _source(tmp_path / "embedded.parquet", fields=fields, target="mask")
    loaders = ImageLoaders(source, TransformStacks(), DefaultCollate(), batch_size=3, num_workers=0, seed=1)
    loaders.prepare_data()
    loaders.setup("fit")
    batch = next(iter(loaders.train_dataloader()))
    for image, mask, i in zip(batch.image, batch.mask, batch.id):
        assert int(image[0, 0, 0]) == int(i) and bool((mask == int(i) % 3).all())
    assert source.split("train").describe(1).endswith("embedded.parquet row 2 (its image held in the table)")
    table[4]["image"] = None
    pq.write_table(pa.Table.from_pylist(table), tmp_path / "mixed.parquet")
    with pytest.raises(ValueError, match=r"mixed\.parquet row 5 .*column 'image': .* holds no encoded image"):
        _source(tmp_path / "mixed.parquet", fields=fields, target="mask").prepare()


def test_a_class_column_with_nearly_a_class_per_row_is_questioned(tmp_path, caplog):
    rows = _samples(tmp_path, 24)
    table = _write(tmp_path / "ids.csv", rows)
    with caplog.at_level(logging.WARNING, logger="feedline.datasets.manifest.columns"):
        _source(table, fields={"image": "image", "id": "class"}, target="id").prepare()
    assert (
        "source.fields.id (kind class) found 24 classes in 24 rows" in caplog.text
        and "kind: number" in caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="feedline.datasets.manifest.columns"):
        _source(
            table, fields={"image": "image", "label": "class"}, target="label", cache_dir=tmp_path / "c2"
        ).prepare()
    assert "found" not in caplog.text  # 3 classes in 24 rows


def test_a_table_that_is_not_utf8_is_named_with_the_fix_and_a_list_skips_comments(tmp_path):
    rows = _samples(tmp_path, 4)
    rows[1]["caption"] = "café"
    table = tmp_path / "latin.csv"
    table.write_bytes(Path(_write(tmp_path / "t.csv", rows)).read_text(encoding="utf-8").encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"latin\.csv is not UTF-8 text \(byte \d+: .*\): save the table as UTF-8"
    ):
        _source(table).prepare()
    listed = tmp_path / "list.txt"
    listed.write_text("# path label\n" + "".join(f"{r['image']} {r['label']}\n" for r in rows))
    source = _source(listed)
    source.prepare()
    assert len(source.split("train")) == 4

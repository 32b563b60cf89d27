"""Shards of named fields: convert.py writes any source's fields with LitData's writer, LitData's own
StreamingDataset reads the same dicts back, and source=shards reads them without LitData (and without
source.fields), boxes (none included) and masks moved with their image by out.max_side, from S3 too."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from feedline.convert import run_convert
from feedline.datasets import Field, Fields, Source
from feedline.datasets.records import Records
from feedline.datasets.shards.source import ShardsSource
from feedline.transforms.decode import decode
from feedline.transforms.masks import decode_mask
from feedline.writers.options import WriteOptions
from feedline.writers.shards import convert_source
from tests.field_data import PixelSource, pixels, png

CLASSES = ("cat", "dog")
H, W = 32, 48
FIELDS = Fields(
    [
        Field("image", "image"),
        Field("objects", "boxes", classes=CLASSES, format="XYWH"),
        Field("caption", "text"),
        Field("score", "number"),
    ],
    target="objects",
)


def drawn(n: int):
    """(image (H, W, 3), boxes XYWH, labels) of sample ``n``: box k a filled rectangle of green 100 + 100 *
    its label on a black ground; every fourth sample has no box."""
    image = np.zeros((H, W, 3), np.uint8)
    image[..., 0] = n
    boxes, labels = [], []
    for k in range(n % 4 and 1 + n % 2):
        x, y, w, h = 4 + 22 * k, 4 + n % 6, 16, 12 + n % 5
        image[y : y + h, x : x + w, 1] = 100 + 100 * (k % 2)
        boxes.append((x, y, w, h))
        labels.append(k % 2)
    return image, np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int64)


class BoxRecords(Records):
    def __init__(self, n: int, drop=(), paths=(), gone=("iscrowd",)):
        super().__init__()
        self.n, self.drop, self.paths, self.gone = n, set(drop), set(paths), gone

    @property
    def total(self) -> int:
        return self.n

    def read(self, row: int) -> dict:
        image, boxes, labels = drawn(row)
        masks = np.zeros((len(boxes), H, W), np.uint8)
        for k, (x, y, w, h) in enumerate(boxes.astype(int)):
            masks[k, y : y + h, x : x + w] = 1
        objects = {
            "boxes": boxes,
            "labels": labels,
            "iscrowd": np.zeros(len(boxes), np.uint8),
            "area": boxes[:, 2] * boxes[:, 3],
            "image_id": 1000 + row,
            "masks": masks,
        }
        if row in self.drop:  # rows without the optional arrays ``gone``
            for key in self.gone:
                del objects[key]
        caption = __file__ if row in self.paths else f"photo {row} é"
        return {"image": png(image, "RGB"), "objects": objects, "caption": caption, "score": row / 4}

    def where(self, row: int) -> str:
        return f"boxes row {row}"


class BoxSource(Source):
    fields = FIELDS
    classes = list(CLASSES)

    def __init__(self, n: int = 10, drop=(), paths=(), gone=("iscrowd",)):
        self.n, self.drop, self.paths, self.gone = n, drop, paths, gone

    def prepare(self) -> None:
        pass

    def split(self, name: str) -> BoxRecords:
        return BoxRecords(self.n, self.drop, self.paths, self.gone)


class Pixels(PixelSource):
    def split(self, name: str):
        return super().split("train")


def write(source, path, **out) -> dict:
    out.setdefault("chunk_bytes", "8KB")
    return convert_source(source, WriteOptions(path=str(path), format="shards", workers=1, **out))


def same(a, b) -> bool:
    """Equal values, arrays equal in dtype and shape too, nested dicts alike."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (np.ndarray, bytes, memoryview)) or isinstance(b, (np.ndarray, bytes, memoryview)):
        a = np.asarray(a if not isinstance(a, (bytes, memoryview)) else np.frombuffer(a, np.uint8))
        b = np.asarray(b if not isinstance(b, (bytes, memoryview)) else np.frombuffer(b, np.uint8))
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def boxes_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("boxes") / "shards"
    assert write(BoxSource(10), path)["images"] == 10
    return path


@pytest.fixture(scope="module")
def pixels_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("pixels") / "shards"
    write(Pixels(6), path)
    return path


def test_boxes_read_back_as_the_source_read_them_an_image_without_boxes_too(boxes_dir):
    source = ShardsSource(boxes_dir, val_fraction=0)
    assert source.fields == FIELDS and source.fields.digest() == FIELDS.digest()  # no source.fields given
    assert source.classes == list(CLASSES) and source.fields["objects"].format == "XYWH"
    records, original = source.split("train"), BoxRecords(10)
    seen = set()
    for i in range(len(records)):
        record = records[i]
        row = record["objects"]["image_id"] - 1000
        assert same(record, original[row]), row
        seen.add(row)
    assert seen == set(range(10))
    empty = records[[records[i]["objects"]["image_id"] for i in range(10)].index(1000)]["objects"]
    assert (
        empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,) and empty["masks"].shape == (0, H, W)
    )
    sidecar = json.loads((boxes_dir / "feedline.json").read_text())
    assert sidecar["format"] == "feedline-shards/2" and sidecar["target"] == "objects"
    assert sidecar["fields"]["objects"] == {
        "kind": "boxes",
        "classes": list(CLASSES),
        "format": "XYWH",
        "keys": ["iscrowd", "area", "image_id", "masks"],
        "masks": "array",
    }
    assert np.load(boxes_dir / "labels.npy").tolist() == [0] * 10  # one stratum: the target has no class


@pytest.mark.parametrize("dataset", ["boxes_dir", "pixels_dir"])
def test_litdata_streaming_dataset_reads_the_same_dicts(dataset, request):
    from litdata import StreamingDataset

    path = request.getfixturevalue(dataset)
    index = json.loads((path / "index.json").read_text())["config"]
    assert index["item_loader"] == "PyTreeLoader" and "no_header_numpy:4" in index["data_format"]
    records = ShardsSource(path, val_fraction=0).split("train")
    theirs = StreamingDataset(str(path))
    assert len(theirs) == len(records)
    for i in range(len(records)):
        assert same(theirs[i], records[i]), i


def test_every_kind_of_a_source_of_fields_reads_back(pixels_dir):
    source = ShardsSource(pixels_dir, val_fraction=0)
    assert source.fields == Pixels.fields and source.classes == ["a", "b", "c", "d"]
    records, original = source.split("train"), Pixels(6).split("train")
    by_id = {int(records[i]["id"]): records[i] for i in range(len(records))}
    for row in range(6):
        want = original[row]
        want["emb"] = want["emb"].astype(np.float32)  # a vector is float32
        want["tags"] = want["tags"].astype(np.int64)
        got, mask = dict(by_id[row]), decode_mask(want.pop("mask"))  # a mask is written as PNG again
        assert torch.equal(decode_mask(got.pop("mask")), mask) and same(got, want), row


def test_max_side_resizes_masks_nearest_and_scales_boxes_with_their_image(tmp_path):
    write(BoxSource(8), tmp_path / "boxes", max_side=24)  # 48x32 -> 24x16: x by 1/2, y by 1/2
    records = ShardsSource(tmp_path / "boxes", val_fraction=0).split("train")
    framed = 0
    for i in range(len(records)):
        objects = records[i]["objects"]
        row = objects["image_id"] - 1000
        image = decode(records[i]["image"])
        assert tuple(image.shape[-2:]) == (16, 24)
        _, boxes, labels = drawn(row)
        assert np.allclose(objects["boxes"], boxes / 2) and np.array_equal(objects["labels"], labels)
        assert np.allclose(objects["area"], boxes[:, 2] * boxes[:, 3] / 4)
        assert objects["masks"].shape == (len(boxes), 16, 24) and set(np.unique(objects["masks"])) <= {0, 1}
        for (x, y, w, h), label, mask in zip(objects["boxes"], labels, objects["masks"]):
            cx, cy = int(x + w / 2), int(y + h / 2)
            assert abs(int(image[1, cy, cx]) - (100 + 100 * label)) < 20  # the box frames its rectangle
            assert mask[cy, cx] == 1 and mask[0, 0] == 0
            framed += 1
    assert framed == 10  # rows 1, 3, 5, 7 hold two boxes, rows 2, 6 one, rows 0, 4 none

    write(Pixels(4), tmp_path / "pixels", max_side=20)
    records = ShardsSource(tmp_path / "pixels", val_fraction=0).split("train")
    for i in range(len(records)):
        row = int(records[i]["id"])
        mask = decode_mask(records[i]["mask"])
        h, w = pixels(row)[1].shape
        size = [round(h * 20 / max(h, w)), round(w * 20 / max(h, w))]
        nearest = F.resize(tv_tensors.Mask(torch.from_numpy(pixels(row)[1])[None]), size)  # the HDF5 writer's
        assert torch.equal(mask, nearest.as_subclass(torch.Tensor))
        assert tuple(decode(records[i]["image"]).shape[-2:]) == tuple(size)


def test_convert_py_writes_a_manifest_whose_class_target_splits_by_class(make_cfg, tmp_path):
    rows = []
    for n in range(8):
        image, mask = pixels(n)
        (tmp_path / f"{n}.png").write_bytes(png(image, "RGB").tobytes())
        (tmp_path / f"{n}_mask.png").write_bytes(png(mask, "L").tobytes())
        rows.append(f"{n}.png,{n}_mask.png,{'xy'[n % 2]},{n}")
    (tmp_path / "train.csv").write_text("image,mask,kind,id\n" + "\n".join(rows) + "\n")
    cfg = make_cfg(
        "source=manifest",
        f"source.path={tmp_path / 'train.csv'}",
        "source.target=kind",
        f"out.path={tmp_path / 'shards'}",
        "out.format=shards",
        "out.workers=1",
        config="convert",
    )
    cfg.source.fields = {
        "image": {"column": "image", "kind": "image"},
        "mask": {"column": "mask", "kind": "mask", "classes": ["a", "b", "c", "d"]},
        "kind": {"column": "kind", "kind": "class", "classes": ["x", "y"]},
        "id": {"column": "id", "kind": "number"},
    }
    assert run_convert(cfg)["images"] == 8
    source = ShardsSource(tmp_path / "shards", val_fraction=0.5, seed=3)
    assert source.fields.target == "kind" and source.classes == ["x", "y"]
    records = source.split("all")
    labels = np.load(tmp_path / "shards" / "labels.npy")
    assert [records[i]["kind"] for i in range(8)] == labels.tolist()  # each sample's class, in order
    assert [int(records[i]["id"]) % 2 for i in range(8)] == labels.tolist()
    val = source.split("val")
    assert sorted(val[i]["kind"] for i in range(len(val))) == [0, 0, 1, 1]  # stratified: 2 of each class
    for i in range(8):
        n = int(records[i]["id"])
        assert np.array_equal(decode_mask(records[i]["mask"])[0].numpy(), pixels(n)[1])


def test_a_target_without_classes_splits_a_seeded_share_of_every_sample(boxes_dir):
    source = ShardsSource(boxes_dir, val_fraction=0.3, seed=1)
    ids = {name: {r["objects"]["image_id"] for r in source.split(name)} for name in ("train", "val")}
    assert len(ids["val"]) == 3 and ids["train"] | ids["val"] == set(range(1000, 1010))
    assert not ids["train"] & ids["val"]


def test_a_sample_litdata_would_store_otherwise_is_skipped_and_named(tmp_path):
    summary = write(BoxSource(6, drop=(3,), paths=(5,), gone=("masks",)), tmp_path / "s", shuffle=False)
    assert summary["images"] == 4 and summary["skipped"] == 2
    listed = (tmp_path / "s" / "skipped.tsv").read_text()
    assert "boxes row 3\tfield 'objects' (boxes): it holds no 'masks'" in listed  # no neutral value for masks
    assert "boxes row 5\tfield 'caption' (text): " in listed and "is the path of a file here" in listed


def test_a_malformed_sample_inside_a_chunk_is_an_oserror_naming_the_chunk(boxes_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(boxes_dir, copy)
    chunk = copy / json.loads((copy / "index.json").read_text())["chunks"][0]["filename"]
    data = bytearray(chunk.read_bytes())
    first = struct.unpack_from("<I", data, 4)[0]  # sample 0: its head of leaf sizes
    struct.pack_into("<I", data, first, struct.unpack_from("<I", data, first)[0] + 1)
    chunk.write_bytes(bytes(data))
    records = ShardsSource(copy, val_fraction=0).split("train")
    with pytest.raises(OSError, match=rf"{chunk}\[0\]: malformed sample \(leaf sizes"):
        records[0]
    assert records[1]["objects"]["boxes"].shape[1] == 4  # the others read


def test_the_schema_decides_the_fields_a_strict_resume_compares(boxes_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(boxes_dir, copy)
    sidecar = json.loads((copy / "feedline.json").read_text())
    sidecar["classes"] = sidecar["fields"]["objects"]["classes"] = ["cat", "fox"]
    (copy / "feedline.json").write_text(json.dumps(sidecar))
    fields = ShardsSource(copy, val_fraction=0).fields
    assert fields["objects"].classes == ("cat", "fox") and fields.digest() != FIELDS.digest()
    sidecar["classes"] = ["cat", "dog"]  # the target's classes, said twice, must agree
    (copy / "feedline.json").write_text(json.dumps(sidecar))
    with pytest.raises(
        ValueError, match=r"classes \['cat', 'dog'\] are not those of its target field 'objects'"
    ):
        ShardsSource(copy, val_fraction=0)


def test_a_sidecar_whose_fields_are_not_the_chunks_is_refused(boxes_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(boxes_dir, copy)
    sidecar = json.loads((copy / "feedline.json").read_text())
    del sidecar["fields"]["caption"]
    (copy / "feedline.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match=r"index\.json's samples hold caption, .* feedline\.json's fields"):
        ShardsSource(copy, val_fraction=0)


def test_a_url_reads_fields_through_the_chunk_cache(s3_server, boxes_dir, tmp_path):
    """A fields dataset in S3 takes the chunk cache as any shards do: read within its bound, on a fresh cache
    too (a resume on another node), and a chunk replaced after the run listed it is refused, never read."""
    from feedline.datasets.shards.meta import ChunkError
    from tests.test_s3_shards import options

    url = s3_server.new_prefix() + "/boxes"
    write(BoxSource(10), url, storage_options=options(s3_server))
    local = ShardsSource(boxes_dir, val_fraction=0).split("train")
    limit = 2 * max(p.stat().st_size for p in boxes_dir.glob("*.bin")) + 1024  # two chunks' room, not three

    def remote(cache: str):
        return ShardsSource(
            url, val_fraction=0, storage_options=options(s3_server), window=1, cache_dir=tmp_path / cache,
            cache_limit=limit,
        )  # fmt: skip

    source = remote("cache")
    assert source.fields == FIELDS
    records = source.split("train")
    assert len(records.chunks.files) >= 3
    for i in range(10):  # the same seeded order, the same bytes, within the cache's bound
        assert same(records[i], local[i])
        assert records.chunks.cache.usage() <= limit
    fresh = remote("fresh").split("train")  # an empty cache (a resume elsewhere): fetched again, the same
    assert all(same(fresh[i], local[i]) for i in (9, 0, 5))
    pinned = remote("pinned").split("train")  # lists the chunks (their ETags) before one is replaced
    last = pinned.chunks.files[-1]
    bucket, prefix = url[len("s3://") :].split("/", 1)
    client = s3_server.client()
    body = client.get_object(Bucket=bucket, Key=f"{prefix}/{last}")["Body"].read()
    client.put_object(Bucket=bucket, Key=f"{prefix}/{last}", Body=body[:-1] + bytes([body[-1] ^ 0xFF]))
    row = next(i for i in range(10) if pinned.chunks.locate(i)[0] == len(pinned.chunks.files) - 1)
    with pytest.raises(ChunkError, match=r"was replaced"):
        pinned.chunks.read_sample(row)


def test_batches_of_every_kind_come_from_shards_through_workers(pixels_dir):
    from tests.test_fields import check_batch, loaders

    dm = loaders(ShardsSource(pixels_dir, val_fraction=0), num_workers=2, batch_size=3)
    ids = [n for batch in dm.train_dataloader() for n in check_batch(batch)]
    assert sorted(ids) == list(range(6))  # each once, every field on its own sample's image


def test_parts_of_a_conversion_read_as_one_dataset_of_fields(tmp_path):
    for part in (0, 1):
        write(BoxSource(6), tmp_path / "p", part=part, parts=2)
    records = ShardsSource(tmp_path / "p", val_fraction=0).split("train")
    assert sorted(records[i]["objects"]["image_id"] for i in range(len(records))) == list(range(1000, 1006))


def test_images_and_labels_are_still_written_as_version_1_tuples(tmp_path):
    from feedline.datasets.folder.source import FolderSource
    from tests.helpers import simple_tree

    tree = simple_tree(tmp_path / "tree", classes=("cat", "dog"), per_class=2)
    write(FolderSource(tree, val_fraction=0, cache_dir=tmp_path / "c"), tmp_path / "v1")
    assert json.loads((tmp_path / "v1" / "index.json").read_text())["config"]["data_format"] == [
        "bytes",
        "int",
    ]
    assert json.loads((tmp_path / "v1" / "feedline.json").read_text())["format"] == "feedline-shards/1"
    source = ShardsSource(tmp_path / "v1", val_fraction=0)
    image, label = source.split("train")[0]
    assert source.fields is None and image.dtype == np.uint8 and label in (0, 1)


def test_a_missing_optional_box_array_is_filled_with_its_neutral_value_not_skipped(tmp_path):
    gone = ("iscrowd", "area", "image_id")
    summary = write(BoxSource(6, drop=(2, 3), gone=gone), tmp_path / "s", shuffle=False)
    assert summary["images"] == 6 and summary["skipped"] == 0
    records = ShardsSource(tmp_path / "s", val_fraction=0).split("train")
    by_row = {int(records[i]["caption"].split()[1]): records[i]["objects"] for i in range(len(records))}
    for row in (2, 3):  # XYWH boxes: area is each box's width * height
        _, boxes, _ = drawn(row)
        got = by_row[row]
        assert same(got["iscrowd"], np.zeros(len(boxes), np.uint8)) and got["image_id"] == -1
        assert same(got["area"], boxes[:, 2] * boxes[:, 3]) and len(boxes), row
    assert by_row[1]["image_id"] == 1001  # a sample holding them keeps its own
    # the first sample lacks 'iscrowd': a later one holding it is skipped, named, and the first fixes the keys
    summary = write(BoxSource(4, drop=(0,)), tmp_path / "t", shuffle=False)
    assert summary["images"] == 1 and summary["skipped"] == 3
    listed = (tmp_path / "t" / "skipped.tsv").read_text()
    assert "boxes row 1\tfield 'objects' (boxes): it holds 'iscrowd'" in listed
    assert "the first sample's keys (boxes, labels, area, image_id, masks) fix the structure" in listed

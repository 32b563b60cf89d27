"""source=wds with source.fields: each field read from the member of its extension (jpg, seg.png, cls, json,
txt), records as every source with fields reads them; a missing member is bad input, named."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from feedline.datamodules import ImageLoaders
from feedline.datasets.records import BadInput
from feedline.datasets.wds.source import WdsSource
from feedline.datasets.wds.tars import TarError
from feedline.transforms import TransformStacks, Uint8Collate
from tests.field_data import png
from tests.helpers import image_bytes, write_tar

SEG = {
    "image": {"kind": "image", "column": "jpg"},
    "mask": {"kind": "mask", "column": "seg.png", "classes": ["bg", "road"]},
    "caption": {"kind": "text", "column": "txt"},
    "tags": {"kind": "classes", "column": "json"},  # {"label": [...]}: source.label_key
    "label": {"kind": "class", "column": "cls"},
}


def mask_of(k: int) -> np.ndarray:
    return (np.arange(16 * 16).reshape(16, 16) // 16 + k) % 2 == 0


def seg_tar(path, n: int = 8, drop=None) -> list[dict]:
    samples = {}
    for k in range(n):
        samples[f"s{k:03d}"] = {
            "jpg": image_bytes(".jpg", size=(16, 16), seed=k),
            "seg.png": png(mask_of(k).astype(np.uint8), "L").tobytes(),
            "txt": f"sample {k}".encode(),
            "json": json.dumps({"label": ["cat", "dog"][: 1 + k % 2]}).encode(),
            "cls": str(k % 3).encode(),
        }
    if drop:
        del samples[drop[0]][drop[1]]
    write_tar(path, samples)
    return list(samples.values())


def test_each_fields_member_is_read_as_its_kind(tmp_path):
    written = seg_tar(tmp_path / "a.tar")
    source = WdsSource(
        str(tmp_path / "a.tar"), fields=SEG, target="mask", val_fraction=0.25, cache_dir=tmp_path / "c"
    )
    source.prepare()
    fields = source.fields
    assert fields.classes == ["bg", "road"] == source.classes
    assert fields["tags"].classes == ("cat", "dog") and fields["label"].classes == ("0", "1", "2")  # found
    train, val = source.split("train"), source.split("val")
    assert len(train) == 6 and len(val) == 2
    records = pickle.loads(pickle.dumps(train))
    for i in range(len(records)):
        record = records[i]
        k = int(record["caption"].split()[1])
        assert bytes(record["image"]) == written[k]["jpg"] and bytes(record["mask"]) == written[k]["seg.png"]
        assert record["tags"].tolist() == [0, 1][: 1 + k % 2] and record["label"] == k % 3
    by_class = WdsSource(
        str(tmp_path / "a.tar"), fields=SEG, target="label", val_fraction=0.3, cache_dir=tmp_path / "c"
    )
    val = by_class.split("val")  # a class target: each class gives its share
    assert sorted(val[i]["label"] for i in range(len(val))) == [0, 1, 2]


def test_a_segmentation_batch_comes_out_of_the_tars(tmp_path):
    seg_tar(tmp_path / "a.tar")
    source = WdsSource(
        str(tmp_path / "a.tar"), fields=SEG, target="mask", val_fraction=0.0, cache_dir=tmp_path / "c"
    )
    stacks = TransformStacks(train=[v2.RandomHorizontalFlip(p=1.0)], eval=[])
    loaders = ImageLoaders(source, stacks, Uint8Collate(), batch_size=4, num_workers=0, seed=1)
    loaders.prepare_data()
    batch = next(iter(loaders.train_dataloader()))
    x, y = batch
    assert x.shape == (4, 3, 16, 16) and y.shape == (4, 16, 16)
    for mask, caption in zip(y, batch.caption):  # the mask of the sample its caption names, flipped with it
        k = int(caption.split()[1])
        assert torch.equal(mask, torch.from_numpy(mask_of(k)[:, ::-1].copy()).to(torch.uint8))


def test_a_sample_missing_a_declared_member_is_bad_input_naming_the_tar_the_key_and_the_extension(tmp_path):
    seg_tar(tmp_path / "a.tar", drop=("s003", "seg.png"))
    source = WdsSource(
        str(tmp_path / "a.tar"), fields=SEG, target="mask", val_fraction=0.0, cache_dir=tmp_path / "c"
    )
    records = source.split("train")
    with pytest.raises(
        BadInput, match=r"a\.tar: sample 's003' has no \.seg\.png member \(source.fields.mask"
    ):
        _ = records[3]
    assert records[4]["caption"] == "sample 4"


def detection_tar(path) -> None:
    objects = [
        {"boxes": [[1, 2, 4, 5], [0, 0, 8, 8]], "labels": ["car", "person"], "iscrowd": [0, 1]},
        {"boxes": [], "labels": []},  # no boxes: a normal sample
        {"boxes": [[2, 2, 3, 3]], "labels": ["person"], "image_id": 42},
    ]
    write_tar(
        path,
        {
            f"d{k}": {"jpg": image_bytes(".jpg", size=(16, 16), seed=k), "json": json.dumps(o).encode()}
            for k, o in enumerate(objects)
        },
    )


def test_boxes_come_from_a_json_member_in_the_fields_format(tmp_path):
    detection_tar(tmp_path / "d.tar")
    fields = {
        "image": {"kind": "image", "column": "png;jpg"},  # the first of them a sample has
        "objects": {"kind": "boxes", "column": "json", "format": "XYWH"},
    }
    source = WdsSource(str(tmp_path / "d.tar"), fields=fields, val_fraction=0.0, cache_dir=tmp_path / "c")
    assert source.fields["objects"].format == "XYWH" and source.classes == ["car", "person"]
    records = source.split("train")
    first, empty, last = records[0]["objects"], records[1]["objects"], records[2]["objects"]
    assert first["boxes"].dtype == np.float32 and first["boxes"].tolist() == [[1, 2, 4, 5], [0, 0, 8, 8]]
    assert (
        first["labels"].tolist() == [0, 1] and first["iscrowd"].tolist() == [0, 1] and first["image_id"] == 0
    )
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)
    assert bytes(records[0]["image"][:2]) == b"\xff\xd8"  # the jpg
    assert last["labels"].tolist() == [1] and last["image_id"] == 42


def test_a_label_a_declared_class_list_lacks_is_refused_before_training(tmp_path):
    detection_tar(tmp_path / "d.tar")
    fields = {
        "image": {"kind": "image", "column": "jpg"},
        "objects": {"kind": "boxes", "column": "json", "classes": ["car"]},
    }
    source = WdsSource(str(tmp_path / "d.tar"), fields=fields, val_fraction=0.0, cache_dir=tmp_path / "c")
    with pytest.raises(TarError, match=r"class 'person' is not in the class list of field 'objects'"):
        source.prepare()


def test_a_detection_batch_from_the_tars_holds_xyxy_boxes_that_followed_the_flip(tmp_path):
    detection_tar(tmp_path / "d.tar")
    fields = {
        "image": {"kind": "image", "column": "jpg"},
        "objects": {"kind": "boxes", "column": "json", "format": "XYWH"},
    }
    source = WdsSource(str(tmp_path / "d.tar"), fields=fields, val_fraction=0.0, cache_dir=tmp_path / "c")
    stacks = TransformStacks(train=[v2.RandomHorizontalFlip(p=1.0)], eval=[])
    loaders = ImageLoaders(source, stacks, Uint8Collate(), batch_size=3, num_workers=0, seed=1)
    images, targets = next(iter(loaders.train_dataloader()))  # torchvision's detection convention
    assert images.shape == (3, 3, 16, 16)
    boxes = {t["image_id"]: t["boxes"].tolist() for t in targets}  # XYWH [1, 2, 4, 5] is XYXY [1, 2, 5, 7]
    assert boxes == {0: [[11, 2, 15, 7], [8, 0, 16, 8]], 1: [], 42: [[11, 2, 14, 5]]}


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"iscrowd": [-1]}, "iscrowd lists -1: 0 or 1"),
        ({"iscrowd": [300]}, "iscrowd lists 300: 0 or 1"),
        ({"iscrowd": ["x"]}, "iscrowd lists 'x': 0 or 1"),
        ({"area": ["big"]}, "area lists 'big': a finite number"),
        ({"image_id": "x7"}, "image_id 'x7' is not an integer"),
        ({"image_id": 7.5}, "image_id 7.5 is not an integer"),
    ],
)
def test_a_bad_iscrowd_area_or_image_id_is_bad_input_naming_the_tar_and_the_key(tmp_path, bad, said):
    objects = [
        {"boxes": [[1, 2, 4, 5]], "labels": ["car"], **bad},
        {"boxes": [], "labels": [], "image_id": 7.0},
    ]
    objects.append({"boxes": [], "labels": [], "image_id": "77"})
    write_tar(
        tmp_path / "d.tar",
        {
            f"d{k}": {"jpg": image_bytes(".jpg", size=(16, 16), seed=k), "json": json.dumps(o).encode()}
            for k, o in enumerate(objects)
        },
    )
    fields = {
        "image": {"kind": "image", "column": "jpg"},
        "objects": {"kind": "boxes", "column": "json", "classes": ["car"]},
    }
    source = WdsSource(str(tmp_path / "d.tar"), fields=fields, val_fraction=0.0, cache_dir=tmp_path / "c")
    records = source.split("train")
    with pytest.raises(BadInput, match="d.tar") as err:  # BadInput: on_bad_sample applies
        _ = records[0]
    assert said in str(err.value), str(err.value)
    assert records[1]["objects"]["image_id"] == 7 and records[2]["objects"]["image_id"] == 77  # not the row

"""source=coco: a COCO instances JSON plus its image folder, read as ``image`` and ``objects`` (boxes)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from feedline.datasets import CocoSource
from feedline.datasets.coco import index as coco_index

# sparse COCO ids, listed out of order: labels follow id order (1 -> 0, 3 -> 1, 7 -> 2)
CATEGORIES = [{"id": 3, "name": "circle"}, {"id": 7, "name": "square"}, {"id": 1, "name": "triangle"}]
LABEL = {1: 0, 3: 1, 7: 2}
COLOURS = {1: (255, 0, 0), 3: (0, 255, 0), 7: (0, 0, 255)}


def _coco(root, n: int = 10, empty=(4,), crowd=(6,)) -> dict:
    """``n`` images of 32..60 px (ids 10, 20, ... listed in reverse), each with a filled rectangle per box
    drawn in its category's colour; images ``empty`` have none, and ``crowd`` get one more box, a crowd."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    doc = {"images": [], "annotations": [], "categories": CATEGORIES}
    aid = 100
    for i in reversed(range(n)):
        w, h = 32 + 3 * i % 30, 60 - 2 * i % 28
        image = Image.new("RGB", (w, h))
        draw = ImageDraw.Draw(image)
        doc["images"].append({"id": 10 * (i + 1), "file_name": f"{i:02d}.png", "width": w, "height": h})
        boxes = [] if i in empty else [(1, 1, 10, 8, (1, 3, 7)[i % 3]), (w - 12, h - 9, 12, 9, 7)]
        if i in crowd:
            boxes.append((5, 12, 6, 6, 3))
        for k, (x, y, bw, bh, cid) in enumerate(boxes):
            draw.rectangle([x, y, x + bw - 1, y + bh - 1], fill=COLOURS[cid])
            aid += 1
            doc["annotations"].append(
                {
                    "id": aid,
                    "image_id": 10 * (i + 1),
                    "category_id": cid,
                    "bbox": [x, y, bw, bh],
                    "area": float(bw * bh),
                    "iscrowd": int(i in crowd and k == len(boxes) - 1),
                    "segmentation": [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]],
                }
            )
        image.save(root / "images" / f"{i:02d}.png")
    return doc


def _write(path, doc) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return str(path)


def _source(tmp_path, doc=None, **kwargs) -> CocoSource:
    doc = doc if doc is not None else _coco(tmp_path)
    kwargs.setdefault("val_fraction", 0.0)
    return CocoSource(_write(tmp_path / "ann" / "train.json", doc), str(tmp_path / "images"), **kwargs)


def test_the_index_holds_images_by_id_and_boxes_packed_with_offsets(tmp_path):
    source = _source(tmp_path)
    source.prepare()
    arrays = {k: v.array for k, v in source._index("train")["arrays"].items()}
    assert source.classes == ["triangle", "circle", "square"]  # categories in id order
    assert arrays["image_id"].tolist() == [10 * (i + 1) for i in range(10)]  # by id, not the file's order
    assert arrays["width"].tolist() == [32 + 3 * i for i in range(10)]
    assert arrays["height"].tolist() == [60 - 2 * i for i in range(10)]
    # two boxes an image, none for image 4; image 6's crowd box left out (source.crowd=false)
    assert arrays["box_offsets"].tolist() == [0, 2, 4, 6, 8, 8, 10, 12, 14, 16, 18]
    assert arrays["boxes"].dtype == np.float32 and arrays["boxes"].shape == (18, 4)
    assert arrays["boxes"][:2].tolist() == [[1, 1, 11, 9], [20, 51, 32, 60]]  # XYXY
    assert arrays["labels"][:2].tolist() == [LABEL[1], LABEL[7]] and arrays["labels"].dtype == np.int64
    assert not arrays["iscrowd"].any() and arrays["area"][:2].tolist() == [80.0, 108.0]
    assert "segmentation.text" not in arrays  # only with source.masks=true


def test_records_hold_the_image_bytes_and_its_boxes_that_frame_the_drawn_rectangles(tmp_path):
    records = _source(tmp_path).split("train")
    assert len(records) == 10 and records.describe(3).endswith(
        f"train.json image id 40 ({tmp_path / 'images' / '03.png'})"
    )
    for i in range(len(records)):
        sample = records[i]
        assert set(sample) == {"image", "objects"} and sample["image"].dtype == np.uint8
        objects = sample["objects"]
        assert set(objects) == {"boxes", "labels", "iscrowd", "area", "image_id"}
        assert objects["image_id"] == 10 * (i + 1)
        pixels = np.asarray(Image.open(tmp_path / "images" / f"{i:02d}.png"))
        for box, label in zip(objects["boxes"].astype(int).tolist(), objects["labels"]):
            assert _frames(pixels, box, label)  # the box frames its rectangle, of its class


def _frames(pixels, box, label) -> bool:
    """The box holds its class's colour only, and no pixel of that colour lies just outside it."""
    x0, y0, x1, y1 = box
    colour = COLOURS[[c for c, lab in LABEL.items() if lab == label][0]]
    inside = (pixels[y0:y1, x0:x1] == colour).all(-1)
    around = (pixels[max(y0 - 1, 0) : y1 + 1, max(x0 - 1, 0) : x1 + 1] == colour).all(-1)
    return bool(inside.all()) and int(around.sum()) == inside.size


def test_an_image_without_boxes_is_kept_or_skipped(tmp_path):
    kept = _source(tmp_path).split("train")
    empty = kept[4]["objects"]
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,) and empty["image_id"] == 50
    skipped = _source(tmp_path, empty="skip").split("train")
    assert len(skipped) == 9 and 50 not in [skipped[i]["objects"]["image_id"] for i in range(9)]
    with pytest.raises(ValueError, match=r"source.empty='drop' is not one of: keep, skip"):
        _source(tmp_path, empty="drop")


def test_crowd_annotations_are_left_out_unless_asked_for(tmp_path):
    assert len(_source(tmp_path).split("train")[6]["objects"]["boxes"]) == 2
    objects = _source(tmp_path, crowd=True).split("train")[6]["objects"]
    assert objects["iscrowd"].tolist() == [0, 0, 1] and objects["boxes"][2].tolist() == [5, 12, 11, 18]


def test_instance_masks_come_from_a_polygon_and_an_rle(tmp_path):
    from pycocotools import mask as mask_utils

    doc = _coco(tmp_path)
    first = next(a for a in doc["annotations"] if a["image_id"] == 10)  # image 0: 32 x 60, box 1,1 10x8
    square = np.zeros((60, 32), dtype=np.uint8, order="F")
    square[1:9, 1:11] = 1
    rle = mask_utils.encode(square)
    first["segmentation"] = {"size": [60, 32], "counts": rle["counts"].decode()}  # compressed RLE
    doc["annotations"][doc["annotations"].index(first) + 1]["segmentation"] = [  # two polygons: their union
        [20, 51, 26, 51, 26, 60, 20, 60],
        [26, 51, 32, 51, 32, 60, 26, 60],
    ]
    second = next(a for a in doc["annotations"] if a["image_id"] == 20)
    second["segmentation"] = {"size": [58, 35], "counts": [58 + 1, 2, 58 * 35 - 61]}  # column 1, rows 1..2
    third = next(a for a in doc["annotations"] if a["image_id"] == 30)
    third["segmentation"].append([1, 1, 3, 3])  # a line: left out of the object's polygons
    records = _source(tmp_path, doc, masks=True).split("train")
    masks = records[0]["objects"]["masks"]
    assert masks.dtype == np.uint8 and masks.shape == (2, 60, 32)
    assert (masks[0] == square).all()  # the RLE
    assert masks[1].sum() == 12 * 9 and masks[1][51:60, 20:32].all()  # the polygons, filled
    uncompressed = records[1]["objects"]["masks"][0]
    assert uncompressed.sum() == 2 and uncompressed[1:3, 1].all()
    assert records[2]["objects"]["masks"][0].sum() == 10 * 8  # the line left no pixel


@pytest.mark.parametrize(
    ("segmentation", "said"),
    [
        ({"size": [10, 10], "counts": "abc"}, "an RLE of size [10, 10], its image is 60 x 32"),
        ({"size": [60, 32], "counts": [5, 3]}, "summing to 60 x 32 = 1920 pixels"),
        ([[1, 1, 3, 3]], "no polygon of 3 or more points"),
        ("outline", "neither polygons nor an RLE"),
    ],
)
def test_a_segmentation_that_does_not_read_is_named_when_masks_are_asked_for(tmp_path, segmentation, said):
    doc = _coco(tmp_path)
    first = next(a for a in doc["annotations"] if a["image_id"] == 10)
    first["segmentation"] = segmentation
    _source(tmp_path, doc).prepare()  # without masks, segmentations are not read
    with pytest.raises(ValueError, match="1 segmentations that do not read") as err:
        _source(tmp_path, doc, masks=True).prepare()
    assert f"annotation id {first['id']} (image id 10): " in str(err.value) and said in str(err.value)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda d: d["annotations"][0].update(bbox=[55, 0, 10, 5]), "boxes outside their image"),
        (lambda d: d["annotations"][0].update(bbox=[1, 1, -3, 5]), "boxes of negative width or height"),
        (lambda d: d["annotations"][0].update(category_id=99), "category_id 99 (the categories: 1, 3, 7)"),
        (lambda d: d["images"][0].update(file_name="gone.png"), "gone.png does not exist"),
        (lambda d: d["annotations"][0].update(image_id=12345), "image_id 12345"),
        (lambda d: d["annotations"][0].pop("bbox"), "no 'bbox'"),
        (lambda d: d["images"][0].pop("width"), "no 'width'"),
        (lambda d: d["annotations"][0].update(area=-4.0), "area -4.0 is not a number of pixels"),
        (lambda d: d["annotations"][0].update(area="big"), "area 'big' is not a number of pixels"),
        (lambda d: d["images"][0].update(file_name="../escape.png"), "'../escape.png' leaves source.images"),
        (lambda d: d["images"][0].update(file_name="/etc/hostname"), "'/etc/hostname' leaves source.images"),
    ],
)
def test_bad_input_is_named_with_the_file_the_id_and_the_fix(tmp_path, edit, said):
    doc = _coco(tmp_path)
    edit(doc)
    with pytest.raises(ValueError) as err:
        _source(tmp_path, doc).prepare()
    message = str(err.value)
    assert "train.json: 1 problem(s)" in message and said in message, message
    assert "annotation id 1" in message or "image id 100" in message  # the id of what is wrong


def test_many_problems_name_the_first_few_and_the_count(tmp_path):
    doc = _coco(tmp_path)
    for a in doc["annotations"]:
        a["category_id"] = 42
    with pytest.raises(ValueError, match=r"19 unknown category ids \(the first 5\)") as err:
        _source(tmp_path, doc).prepare()
    assert str(err.value).count("category_id 42") == 5


def test_a_box_a_pixel_past_the_edge_is_clipped(tmp_path):
    doc = _coco(tmp_path)
    doc["annotations"][0]["bbox"] = [-0.5, 30.0, 10.0, 12.5]  # image 9: 59 x 42
    records = _source(tmp_path, doc).split("train")
    assert records[9]["objects"]["boxes"][0].tolist() == [0.0, 30.0, 9.5, 42.0]


def test_malformed_json_is_named_with_its_line_and_column(tmp_path):
    path = tmp_path / "ann" / "train.json"
    _write(path, _coco(tmp_path))
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace('"', "", 1)  # an unquoted key on line 4
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"train\.json is not valid JSON: .* at line 4, column \d+"):
        CocoSource(str(path), str(tmp_path / "images"), val_fraction=0.0).prepare()


def test_a_changed_file_rebuilds_the_index_and_changes_the_content_digest(tmp_path, monkeypatch):
    doc = _coco(tmp_path)
    first = _source(tmp_path, doc)
    first.prepare()
    before = first.content_digest()
    built = []
    real = coco_index.coco_json.build
    monkeypatch.setattr(coco_index.coco_json, "build", lambda *a, **k: built.append(a) or real(*a, **k))
    _source(tmp_path, doc).prepare()
    assert built == []  # the cached index, mapped
    doc["annotations"][0]["category_id"] = 3  # same size, other content
    again = _source(tmp_path, doc)
    again.prepare()
    assert len(built) == 1 and again.content_digest() != before
    assert again.split("train")[9]["objects"]["labels"][0] == LABEL[3]
    assert again.split("train").content_digest() == again.content_digest()


def test_a_split_pickles_small_whatever_the_files_length(tmp_path):
    sizes = []
    for n in (8, 30):
        source = _source(tmp_path / str(n), _coco(tmp_path / str(n), n), val_fraction=0.25, masks=True)
        records = source.split("train")
        data = pickle.dumps(records)
        sizes.append(len(data))
        copy = pickle.loads(data)
        assert copy.describe(3) == records.describe(3)
        assert copy[3]["objects"]["boxes"].tolist() == records[3]["objects"]["boxes"].tolist()
    assert sizes[1] - sizes[0] < 64 and sizes[1] < 3000  # a few bytes more for a longer path, not per row


def test_val_comes_from_its_own_file_or_a_seeded_share(tmp_path):
    source = _source(tmp_path, val_fraction=0.2, seed=3)
    train, val = source.split("train"), source.split("val")
    rows = [{r.row(i) for i in range(len(r))} for r in (train, val)]
    assert len(val) == 2 and len(train) == 8 and not rows[0] & rows[1]
    val_doc = _coco(tmp_path / "v", 3)
    val_doc["categories"] = CATEGORIES[::-1]
    own = CocoSource(
        _write(tmp_path / "ann" / "train.json", _coco(tmp_path)),
        str(tmp_path / "images"),
        val_annotations=_write(tmp_path / "ann" / "val.json", val_doc),
        val_images=str(tmp_path / "v" / "images"),
    )
    assert len(own.split("train")) == 10 and len(own.split("val")) == 3
    assert own.split("val")[0]["objects"]["labels"].tolist() == [LABEL[1], LABEL[7]]
    with pytest.raises(ValueError, match=r"source.val_annotations is set and source.val_images is not"):
        CocoSource(
            str(tmp_path / "ann" / "train.json"),
            str(tmp_path / "images"),
            val_annotations=str(tmp_path / "ann" / "val.json"),
        )
    val_doc["categories"] = [{"id": 3, "name": "disc"}, *CATEGORIES[1:]]  # id 3 named otherwise
    _write(tmp_path / "ann" / "val.json", val_doc)
    other = CocoSource(
        str(tmp_path / "ann" / "train.json"),
        str(tmp_path / "images"),
        val_annotations=str(tmp_path / "ann" / "val.json"),
        val_images=str(tmp_path / "v" / "images"),
    )
    with pytest.raises(ValueError, match="id 3 is 'disc' here, 'circle' in the train file"):
        other.prepare()


def _framed(image, target) -> None:
    """Each box frames a rectangle of its class's colour (an untransformed image: exact pixels)."""
    pixels = image.permute(1, 2, 0).numpy()
    for box, label in zip(target["boxes"].int().tolist(), target["labels"].tolist()):
        assert _frames(pixels, box, label)


def test_the_issues_yaml_reads_train_and_val_batches_of_detection_targets(tmp_path, make_cfg):
    from feedline.cli.instantiate import instantiate
    from feedline.datasets.fields import fields_of

    train = _write(tmp_path / "ann" / "instances_train.json", _coco(tmp_path / "train", 12))
    val = _write(tmp_path / "ann" / "instances_val.json", _coco(tmp_path / "val", 5, empty=(), crowd=()))
    experiment = tmp_path / "conf" / "experiment" / "det.yaml"
    experiment.parent.mkdir(parents=True)
    experiment.write_text(
        "# @package _global_\n"
        "defaults: [{override /source: coco}, {override /collate: detection}]\n"
        "source:\n"
        f"  annotations: {train}\n"
        f"  images: {tmp_path / 'train' / 'images'}\n"
        f"  val_annotations: {val}\n"
        f"  val_images: {tmp_path / 'val' / 'images'}\n"
    )
    cfg = make_cfg(
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "experiment=det",
        "data.batch_size=4",
        "data.num_workers=0",
    )
    data = instantiate(cfg.data, "data")
    assert isinstance(data.source, CocoSource) and data.source.classes == ["triangle", "circle", "square"]
    assert fields_of(data.source)["objects"].kind == "boxes" and fields_of(data.source).target == "objects"
    data.prepare_data()
    data.setup("fit")
    seen = []
    for images, targets in data.train_dataloader():  # the detection stack: crops, flips, sanitizes
        for image, target in zip(images, targets):
            assert image.dtype == torch.uint8 and target["boxes"].canvas_size == tuple(image.shape[-2:])
            assert target["labels"].dtype == torch.int64 and len(target["labels"]) == len(target["boxes"])
            seen.append(target["image_id"])
    assert sorted(seen) == [10 * (i + 1) for i in range(12)]  # every image once, the empty one included
    val_ids = []
    for images, targets in data.val_dataloader():  # no transforms: each image at its own size, listed
        for image, target in zip(images, targets):
            _framed(image, target)
            val_ids.append(target["image_id"])
    assert sorted(val_ids) == [10, 20, 30, 40, 50]


def test_a_strict_resume_refuses_a_changed_annotation_file(tmp_path):
    from feedline.datamodules import ImageLoaders
    from feedline.datamodules.epoch.checks import ResumeError
    from feedline.transforms import DetectionCollate, TransformStacks

    doc = _coco(tmp_path, 12)

    def loader():
        source = _source(tmp_path, doc)
        stacks = TransformStacks(train=[], eval=[], batch=[])
        return ImageLoaders(source, stacks, DetectionCollate(), batch_size=4, num_workers=0, seed=1)

    first = loader().train_dataloader()
    next(iter(first))
    state = first.state_dict()
    loader().train_dataloader().load_state_dict(state)  # the same file: resumes
    doc["annotations"][0]["bbox"] = [2, 1, 10, 8]  # one box moved
    with pytest.raises(ResumeError, match="sample fields") as refused:
        loader().train_dataloader().load_state_dict(state)
    assert "table content" in str(refused.value)


def test_the_whole_source_contract_holds(tmp_path):
    """Pickles small, workers read what the main process sees, disjoint seeded splits, decode, bad samples and
    resume: ``feedline.testing.check_source``, as for every source (its one test with worker processes)."""
    from feedline.testing import check_source

    check_source(_source(tmp_path, _coco(tmp_path, 16), val_fraction=0.25, test_fraction=0.125))


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda d: d["annotations"][0].update(iscrowd="0"), "iscrowd '0' is not 0, 1, true or false"),
        (lambda d: d["annotations"][0].update(iscrowd="no"), "iscrowd 'no' is not 0, 1, true or false"),
        (lambda d: d["annotations"][1].update(id=d["annotations"][0]["id"]), "1 ids given twice"),
        (lambda d: d["annotations"][0].update(id="abc"), "id 'abc' is not an integer"),
        (lambda d: d["annotations"][0].update(id=1.5), "id 1.5 is not an integer"),
        (lambda d: d["annotations"][0].update(id=2**70), f"id {2**70} is beyond int64"),
        (lambda d: d["images"][0].update(id=2**70), f"id {2**70} is beyond int64"),
    ],
)
def test_an_iscrowd_or_annotation_id_coco_does_not_allow_is_named(tmp_path, edit, said):
    doc = _coco(tmp_path)
    edit(doc)
    with pytest.raises(ValueError) as err:  # a CocoError naming the file, not a bare OverflowError
        _source(tmp_path, doc).prepare()
    message = str(err.value)
    assert "train.json: " in message and "problem(s)" in message and said in message, message


def test_iscrowd_as_a_boolean_and_an_annotation_id_past_2_53_are_kept(tmp_path):
    from feedline.datasets.coco import annotations as coco_json

    doc = _coco(tmp_path)
    doc["annotations"][0].update(iscrowd=False, id=2**60 + 1)
    doc["annotations"][1].update(iscrowd=True)
    arrays, found = coco_json.build(doc, "train.json", str(tmp_path / "images"), LABEL, False, "keep", False)
    assert 2**60 + 1 in arrays["annotation_id"].tolist()  # every digit: not through a float64 table
    assert found["crowd_excluded"] == 2  # the file's own crowd box and the one marked true


def test_a_category_without_a_name_is_named(tmp_path):
    doc = _coco(tmp_path)
    doc["categories"][0]["name"] = None  # would become the class "None"
    with pytest.raises(ValueError, match=r"name None is not a name"):
        _source(tmp_path, doc).prepare()

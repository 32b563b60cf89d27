"""source=mix with named fields (datasets/mix/labels.py): the parts' class lists merge field by field, first part
first, each part's indices remapped as it is read; parts of other fields are refused by name; the draw and
resume never look inside a sample."""

from __future__ import annotations

import csv
import pickle

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from feedline.datamodules import ImageLoaders
from feedline.datamodules.epoch.checks import ResumeError
from feedline.datasets import Field, Fields, MixSource, Source
from feedline.datasets.manifest.source import ManifestSource
from feedline.datasets.records import BadInput, Records
from feedline.transforms import TransformStacks, Uint8Collate
from tests.field_data import png
from tests.helpers import image_bytes


class Stub(Records):
    def __init__(self, rows: list[dict]):
        super().__init__()
        self.rows = rows

    @property
    def total(self) -> int:
        return len(self.rows)

    def read(self, row: int) -> dict:
        return self.rows[row]

    def where(self, row: int) -> str:
        return f"stub row {row}"


class FieldSource(Source):
    """Named fields read from a list of records (the same ones in every split)."""

    def __init__(self, fields: Fields, rows: list[dict]):
        self.fields, self.rows = fields, rows

    @property
    def classes(self) -> list[str]:
        return self.fields.classes

    def prepare(self) -> None:
        pass

    def split(self, name: str) -> Stub:
        return Stub(self.rows)


def labelled(label, tags, seg) -> Fields:
    return Fields(
        [
            Field("image", "image"),
            Field("label", "class", classes=label),
            Field("tags", "classes", classes=tags),
            Field("seg", "mask", classes=seg),
        ],
        target="label",
    )


MASK = np.array([[0, 1], [255, 1]], dtype=np.uint8)
ROW = {
    "image": png(np.zeros((2, 2, 3), np.uint8), "RGB"),
    "label": 0,
    "tags": np.array([0, 1]),
    "seg": png(MASK, "L"),
}


def test_class_lists_merge_first_part_first_and_each_parts_indices_are_remapped():
    a = FieldSource(labelled(("cat", "dog"), ("x", "y"), ("bg", "road")), [ROW])
    b = FieldSource(
        labelled(("dog", "eel"), ("y", "z"), ("bg", "car")), [ROW, {**ROW, "seg": png(MASK * 3, "L")}]
    )
    mix = MixSource({"a": {"source": a}, "b": {"source": b}})
    mix.prepare()
    fields = mix.fields
    assert fields["label"].classes == ("cat", "dog", "eel") and mix.classes == ["cat", "dog", "eel"]
    assert fields["tags"].classes == ("x", "y", "z") and fields["seg"].classes == ("bg", "road", "car")
    records = mix.split("train")
    first, second = records[0], records[1]  # part a as it is; part b into the merged lists
    assert first["label"] == 0 and first["tags"].tolist() == [0, 1] and first["seg"] is ROW["seg"]
    assert second["label"] == 1 and second["tags"].tolist() == [1, 2]
    assert second["seg"].tolist() == [[0, 2], [255, 2]]  # car is 2 in the mix; void stays void
    assert pickle.loads(pickle.dumps(records))[1]["tags"].tolist() == [1, 2]  # as a worker reads it
    with pytest.raises(BadInput, match="part b, field 'seg': mask pixel value 3 is neither"):
        _ = records[2]  # a value beyond b's classes is not quietly one of the merged ones


def boxes_source(classes, fmt, labels, boxes) -> FieldSource:
    fields = Fields(
        [Field("image", "image"), Field("objects", "boxes", classes=classes, format=fmt)], target="objects"
    )
    value = {"boxes": np.asarray(boxes, np.float32).reshape(-1, 4), "labels": np.asarray(labels, np.int64)}
    return FieldSource(fields, [{"image": ROW["image"], "objects": value}])


def test_box_labels_remap_and_boxes_in_another_format_are_converted():
    a = boxes_source(("car",), "XYXY", [0], [[1, 2, 5, 6]])
    b = boxes_source(("truck", "car"), "XYWH", [1, 0], [[1, 2, 4, 4], [0, 0, 2, 3]])
    mix = MixSource({"a": {"source": a}, "b": {"source": b}})
    assert mix.fields["objects"].classes == ("car", "truck") and mix.fields["objects"].format == "XYXY"
    records = mix.split("train")
    objects = records[1]["objects"]
    assert objects["labels"].tolist() == [0, 1]
    assert objects["boxes"].tolist() == [[1, 2, 5, 6], [0, 0, 2, 3]]
    empty = boxes_source(("bus",), "CXCYWH", [], [])  # an image without boxes stays one
    got = MixSource({"a": {"source": a}, "b": {"source": empty}}).split("train")[1]["objects"]
    assert got["boxes"].shape == (0, 4) and got["labels"].shape == (0,)


@pytest.mark.parametrize(
    "other, said",
    [
        (
            Fields([Field("image", "image"), Field("label", "classes", classes=("cat",))], "label"),
            "source.parts.a and source.parts.b hold different fields: field 'label' has kind 'class' in one and "
            "'classes'",
        ),
        (
            Fields(
                [Field("image", "image"), Field("label", "class", classes=("cat",)), Field("n", "number")],
                "label",
            ),
            "field 'n' is in one part only",
        ),
        (
            Fields([Field("image", "image"), Field("label", "class", classes=("Cat",))], "label"),
            "field 'label': source.parts.a has class 'cat' and source.parts.b class 'Cat'",
        ),
    ],
)
def test_parts_of_other_fields_are_refused_naming_the_parts_the_field_and_what_differs(other, said):
    own = Fields([Field("image", "image"), Field("label", "class", classes=("cat",))], "label")
    mix = MixSource({"a": {"source": FieldSource(own, [])}, "b": {"source": FieldSource(other, [])}})
    with pytest.raises(ValueError, match=said):
        _ = mix.fields


def table(tmp_path, name, labels, first_id) -> ManifestSource:
    """A manifest of 16 px images, each with an id, a class and a list of tags (named per part)."""
    (tmp_path / name).mkdir()
    with open(tmp_path / name / "t.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["image", "id", "label", "tags"])
        for k in range(8):
            (tmp_path / name / f"{k}.png").write_bytes(image_bytes(".png", size=(16, 16), seed=first_id + k))
            out.writerow([f"{k}.png", first_id + k, labels[k % 2], " ".join(labels[: 1 + k % 2])])
    fields = {
        "image": {"kind": "image"},
        "id": {"kind": "number"},
        "label": {"kind": "class", "classes": list(labels)},
        "tags": {"kind": "classes", "classes": list(labels)},
    }
    return ManifestSource(
        str(tmp_path / name / "t.csv"),
        fields=fields,
        target="label",
        val_fraction=0.0,
        cache_dir=tmp_path / "c",
    )


def test_a_mix_of_two_manifests_with_fields_trains_on_remapped_labels_and_resumes_exactly(tmp_path):
    parts = {"a": table(tmp_path, "a", ("cat", "dog"), 0), "b": table(tmp_path, "b", ("eel", "dog"), 100)}

    def loader():
        mix = MixSource({name: {"source": source} for name, source in parts.items()})
        mix.prepare()
        stacks = TransformStacks(train=[v2.Resize((8, 8), antialias=True)], eval=[])
        return ImageLoaders(
            mix, stacks, Uint8Collate(), batch_size=4, num_workers=0, seed=1
        ).train_dataloader()

    whole = list(loader())
    seen = []
    for batch in whole:
        for n, label, tags in zip(batch.id.long().tolist(), batch.label.tolist(), batch.tags.tolist()):
            own = ("cat", "dog") if n < 100 else ("eel", "dog")
            assert ["cat", "dog", "eel"][label] == own[n % 2]  # dog is 1 in both parts' samples
            assert tags == [float(c in own[: 1 + n % 2]) for c in ("cat", "dog", "eel")]
            seen.append(n)
    assert sorted(seen) == [*range(8), *range(100, 108)]
    first = loader()
    next(iter(first))
    first.position.batches += 1  # what on_after_batch_transfer counts under a Trainer
    state = first.state_dict()
    again = loader()
    again.load_state_dict(state)
    rest = list(again)  # the rest of the epoch, batch for batch
    assert len(rest) == len(whole) - 1
    for got, want in zip(rest, whole[1:]):
        assert (
            torch.equal(got.id, want.id)
            and torch.equal(got.label, want.label)
            and torch.equal(got.tags, want.tags)
        )
    # the same merged lists, but part b's own indices now mean other classes: its remap differs, refused
    table_b = parts["b"]
    parts["b"] = ManifestSource(
        table_b.path,
        fields={
            "image": {"kind": "image"},
            "id": {"kind": "number"},
            "label": {"kind": "class", "classes": ["dog", "eel"]},
            "tags": {"kind": "classes", "classes": ["dog", "eel"]},
        },
        target="label",
        val_fraction=0.0,
        cache_dir=tmp_path / "c",
    )
    swapped = loader()
    assert swapped.dataset.fields == first.dataset.fields  # the merged lists alone do not tell
    with pytest.raises(ResumeError, match="class"):
        swapped.load_state_dict(state)


class Unread(Stub):
    def read(self, row: int) -> dict:
        raise AssertionError("the draw read a sample")


def test_the_draw_of_a_mix_of_fields_never_reads_a_sample():
    a = FieldSource(labelled(("cat",), ("x",), ("bg",)), [ROW] * 5)
    b = FieldSource(labelled(("dog",), ("y",), ("bg",)), [ROW] * 3)
    a.split = lambda name: Unread([ROW] * 5)
    b.split = lambda name: Unread([ROW] * 3)
    records = MixSource({"a": {"source": a, "weight": 5}, "b": {"source": b, "weight": 3}}).split("train")
    order = records.epoch_order(seed=4, epoch=2)
    assert sorted(order.tolist()) == list(range(8)) and records.order_identity().startswith("mix of a 5, b 3")
    assert "b.label:1" in records.label_identity()  # a resume checks the remap too


@pytest.mark.parametrize("label", [-1, 2])
def test_a_box_label_or_classes_index_outside_the_parts_classes_is_bad_input_not_wrapped(label):
    a = boxes_source(("car",), "XYXY", [0], [[1, 2, 5, 6]])
    b = boxes_source(("truck", "car"), "XYXY", [label], [[1, 2, 4, 4]])  # -1 would wrap to 'truck'
    records = MixSource({"a": {"source": a}, "b": {"source": b}}).split("train")
    with pytest.raises(
        BadInput, match=rf"part b, field 'objects': box labels \[{label}\] are not all in 0\.\.1"
    ):
        _ = records[1]
    c = FieldSource(labelled(("cat", "dog"), ("x", "y"), ("bg", "road")), [ROW])
    d = FieldSource(labelled(("dog", "eel"), ("y", "z"), ("bg", "car")), [{**ROW, "tags": np.array([label])}])
    records = MixSource({"c": {"source": c}, "d": {"source": d}}).split("train")
    with pytest.raises(BadInput, match=rf"part d, field 'tags': classes \[{label}\] are not all in 0\.\.1"):
        _ = records[1]

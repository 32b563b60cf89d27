"""The boxes kind: boxes drawn into the pixels still frame their rectangles after every crop and flip, a box a
crop leaves degenerate goes with its label, an image without boxes is a normal sample, and collate=detection
gives ``images, targets = batch`` (or the padded form)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from feedline.datamodules import ImageLoaders
from feedline.datamodules.bad_samples import BadSampleError
from feedline.datamodules.sample_fields import FieldDecoder
from feedline.datasets import Field, Fields
from feedline.datasets.fields import fields_from_config
from feedline.transforms import DetectionCollate, SanitizeBoxes, TransformStacks, Uint8Collate
from feedline.transforms.boxes import decode_boxes
from feedline.transforms.decode import DecodeError
from tests.box_data import FIELDS, BoxRecords, BoxSource, drawn, unframed
from tests.test_fields import World

CROP = [
    v2.RandomResizedCrop(48, scale=(0.2, 1.0), antialias=True),
    v2.RandomHorizontalFlip(),
    SanitizeBoxes(),
]


def loaders(source, collate=None, train=CROP, **knobs):
    stacks = TransformStacks(train=train, eval=[], batch=[v2.ToDtype(torch.float32, scale=True)])
    options = {"batch_size": 4, "num_workers": 0, "seed": 3, **knobs}
    return ImageLoaders(source, stacks, collate or DetectionCollate(), **options)


def check(batch) -> list[int]:
    """Every target belongs to its image (red), and every box frames its drawn rectangle."""
    images, targets = batch
    ids = []
    for image, target in zip(images, targets):
        row = int(image[0, 0, 0])
        assert target["image_id"] == row
        assert isinstance(target["boxes"], tv_tensors.BoundingBoxes) and target["boxes"].format.name == "XYXY"
        assert target["boxes"].canvas_size == tuple(image.shape[-2:])
        assert len(target["labels"]) == len(target["boxes"]) == len(target["iscrowd"])
        assert unframed(image, target) == []
        ids.append(row)
    return ids


@pytest.mark.parametrize("workers", [0, 2])
def test_boxes_frame_their_rectangles_after_crop_and_flip_in_every_worker(workers):
    data = loaders(BoxSource(16), num_workers=workers)
    seen, dropped = [], 0
    for _ in range(2):  # two epochs: other crops
        for batch in data.train_dataloader():
            assert batch.image.shape == (4, 3, 48, 48)  # one size: stacked
            seen += check(batch)
            dropped += sum(len(drawn(int(i[0, 0, 0]))[1]) - len(t["boxes"]) for i, t in zip(*batch))
    assert sorted(seen) == sorted(list(range(16)) * 2)
    assert dropped > 0  # some crops left boxes out: each went with its label (the lengths agree above)


def test_the_check_sees_a_box_that_did_not_move():
    image, boxes, labels = drawn(7)
    target = decode_boxes({"boxes": boxes, "labels": labels}, "XYWH", (64, 64), 3)
    flipped = torch.from_numpy(image).permute(2, 0, 1).flip(-1)  # the image flipped, its boxes not
    assert unframed(flipped, target) and not unframed(torch.from_numpy(image).permute(2, 0, 1), target)


def test_an_image_without_boxes_is_a_sample_and_images_of_two_sizes_are_listed():
    data = loaders(BoxSource(10), train=[v2.RandomHorizontalFlip()])
    val = next(iter(data.val_dataloader()))  # eval stack is empty: images at their own size, stacked (all 64)
    assert isinstance(val.image, torch.Tensor)
    empty = [t for t in val.objects if t["image_id"] % 5 == 0]
    assert empty and all(t["boxes"].shape == (0, 4) and t["labels"].shape == (0,) for t in empty)
    collate = DetectionCollate()
    collate.bind(data.collate.layout)
    a = {"image": tv_tensors.Image(torch.zeros(3, 20, 30, dtype=torch.uint8)), "objects": val.objects[0]}
    b = {"image": tv_tensors.Image(torch.zeros(3, 40, 10, dtype=torch.uint8)), "objects": val.objects[1]}
    images, targets = collate([a, b])
    assert isinstance(images, list) and [tuple(i.shape) for i in images] == [(3, 20, 30), (3, 40, 10)]
    moved = data.device_batch(collate([a, b]), device="cpu")
    assert all(i.dtype == torch.float32 for i in moved.image)  # the device stack ran on each listed image


def test_the_padded_form_pads_boxes_to_the_most_with_a_valid_mask():
    data = loaders(BoxSource(10), collate=DetectionCollate(boxes="padded"))
    batch = next(iter(data.val_dataloader()))
    objects = batch.objects
    counts = [len(drawn(n)[1]) for n in batch.objects["image_id"].tolist()]
    assert objects["boxes"].shape == (4, max(counts), 4) and objects["valid"].sum(1).tolist() == counts
    assert (objects["labels"][~objects["valid"]] == -1).all() and (
        objects["labels"][objects["valid"]] >= 0
    ).all()
    assert objects["canvas_size"].tolist() == [[64, 64]] * 4
    moved = batch.to("cpu")
    assert moved.objects["boxes"].data_ptr() == objects["boxes"].data_ptr()  # a dict of tensors moves too


def test_a_batchs_targets_move_with_it():
    batch = next(iter(loaders(BoxSource(8)).train_dataloader()))
    moved = batch.apply(lambda t: t + 0 if t.is_floating_point() else t)
    assert isinstance(moved.objects, list) and moved.objects[0]["boxes"] is not batch.objects[0]["boxes"]
    assert isinstance(moved.objects[0]["boxes"], tv_tensors.BoundingBoxes)  # its format and canvas kept


def test_a_resume_on_another_world_reads_the_rest_of_the_epoch_once():
    def ranks(world, batch):
        stacks = TransformStacks(train=CROP, batch=[v2.ToDtype(torch.float32, scale=True)])
        return [World(BoxSource(20), stacks, DetectionCollate(), batch_size=batch, seed=5, world=world,
                      rank=r).train_dataloader() for r in range(world)]  # fmt: skip

    def boxes(batches):
        out = {}
        for batch in batches:
            for n, target in zip(check(batch), batch.objects):
                assert n not in out, f"sample {n} read twice"
                out[n] = target["boxes"].tolist()
        return out

    whole = boxes(b for loader in ranks(1, 4) for b in loader)
    first = ranks(2, 3)
    before = []
    for loader in first:
        for _, batch in zip(range(2), loader):
            loader.position.batches += 1
            before.append(batch)
    state = first[0].state_dict()
    second = ranks(1, 5)[0]
    second.load_state_dict(state)
    assert boxes(before + list(second)) == whole  # every sample once, with the crops of one uninterrupted run


def test_bad_boxes_are_named_by_field_and_sample():
    class Bad(BoxRecords):
        def read(self, row):
            record = super().read(row)
            if self.rows[row] == 3:
                record["objects"]["labels"] = record["objects"]["labels"] + 7  # beyond the 3 classes
            return record

    class BadSource(BoxSource):
        def split(self, name):
            return Bad(range(self.n))

    with pytest.raises(BadSampleError, match=r"boxes row 3: field 'objects': box labels .* not all in 0..2"):
        list(loaders(BadSource(8), on_bad_sample="raise").train_dataloader())
    with pytest.raises(DecodeError, match=r"2 labels for 1 boxes"):
        decode_boxes({"boxes": np.zeros((1, 4)), "labels": [0, 1]}, "XYXY", (8, 8), 3)
    with pytest.raises(DecodeError, match=r"expected \(M, 4\)"):
        decode_boxes({"boxes": np.zeros((2, 3)), "labels": [0, 1]}, "XYXY", (8, 8), 3)
    with pytest.raises(DecodeError, match="not finite"):
        decode_boxes({"boxes": [[0, 0, float("nan"), 2]], "labels": [0]}, "XYXY", (8, 8), 3)


def test_instance_masks_from_arrays_polygons_and_rle_follow_their_boxes():
    polygon = [[2.0, 2.0, 6.0, 2.0, 6.0, 6.0, 2.0, 6.0]]
    from pycocotools import mask as coco_mask

    rle = coco_mask.encode(np.asfortranarray(np.pad(np.ones((3, 3), np.uint8), ((0, 5), (0, 5)))))
    rle["counts"] = rle["counts"].decode()
    value = {"boxes": [[2, 2, 4, 4], [0, 0, 3, 3]], "labels": [0, 1], "masks": [polygon, rle]}
    target = decode_boxes(value, "XYWH", (8, 8), 3)
    assert target["masks"].shape == (2, 8, 8) and int(target["masks"][1].sum()) == 9
    flipped = v2.RandomHorizontalFlip(1.0)({"image": tv_tensors.Image(torch.zeros(3, 8, 8)), "t": target})[
        "t"
    ]
    assert flipped["masks"][1, :3, 5:].all() and flipped["boxes"][1].tolist() == [5.0, 0.0, 8.0, 3.0]
    keep = SanitizeBoxes()({"image": tv_tensors.Image(torch.zeros(3, 8, 8)), "t": {**target, "boxes": tv_tensors.wrap(
        torch.tensor([[2.0, 2, 6, 6], [3.0, 3, 3, 3]]), like=target["boxes"])}})["t"]  # fmt: skip
    assert len(keep["masks"]) == len(keep["labels"]) == 1 and keep["labels"].tolist() == [0]
    with pytest.raises(DecodeError, match="1 instance masks for 2 boxes"):
        decode_boxes({**value, "masks": [polygon]}, "XYWH", (8, 8), 3)


def test_boxes_fields_are_checked_by_key():
    with pytest.raises(ValueError, match=r"source.fields.objects.format='XYZ' is not one of"):
        fields_from_config({"image": "image", "objects": {"kind": "boxes", "format": "xyz"}}, "objects")
    with pytest.raises(ValueError, match="2 fields of kind boxes"):
        Fields([Field("image", "image"), Field("a", "boxes"), Field("b", "boxes")], "a")
    with pytest.raises(ValueError, match="boxes .* beside a segmentation mask"):
        Fields([Field("image", "image"), Field("a", "boxes"), Field("m", "mask")], "a")
    ok = fields_from_config(
        {"image": "image", "objects": {"kind": "boxes", "format": "xywh", "classes": ["a"]}}, None
    )
    assert ok["objects"].format == "XYWH" and ok.classes == ["a"] and ok.target == "objects"


def test_mixup_is_refused_for_boxes_and_the_uint8_collate_lists_targets():
    from feedline.transforms import MixupCutmix

    stacks = TransformStacks(train=CROP, mix=MixupCutmix(num_classes=3))
    data = ImageLoaders(BoxSource(8), stacks, Uint8Collate(), batch_size=4, num_workers=0)
    with pytest.raises(ValueError, match="kind boxes"):
        data.device_batch(next(iter(data.train_dataloader())), training=True)
    batch = next(iter(loaders(BoxSource(8), collate=Uint8Collate()).train_dataloader()))
    assert batch.image.shape == (4, 3, 48, 48) and check(batch)
    from feedline.transforms.deferred import (
        DeferredCrop,
    )  # a crop and flip the collate would finish, with boxes

    sample = DeferredCrop(CROP[:2])(FieldDecoder(FIELDS)(BoxRecords([7]).read(0)))
    assert (
        isinstance(sample["image"], tv_tensors.Image) and unframed(sample["image"], sample["objects"]) == []
    )


def test_bench_times_the_boxes_as_their_own_stage():
    from feedline.diagnostics.loader_bench import stage_breakdown

    data = loaders(BoxSource(8))
    data.setup("fit")
    result = stage_breakdown(data.datasets["train"], data.collate, list(range(8)), batch_size=4)
    assert {"decode", "decode objects", "transform", "collate"} <= set(result["stages_run"])
    assert result["per_sample_s"]["decode objects"] > 0


def test_feedlines_crop_gives_torchvisions_pixels_and_boxes_on_a_sample_of_fields():
    from feedline.transforms import RandomResizedCrop

    record = BoxRecords([7]).read(0)
    sample = FieldDecoder(FIELDS)(record)
    outputs = []
    for crop in (
        RandomResizedCrop(40, scale=(0.2, 1.0), antialias=True),
        v2.RandomResizedCrop(40, (0.2, 1.0)),
    ):
        torch.manual_seed(11)
        outputs.append(crop(sample))
    ours, theirs = outputs
    assert isinstance(ours["image"], tv_tensors.Image) and torch.equal(ours["image"], theirs["image"])
    assert isinstance(ours["objects"]["boxes"], tv_tensors.BoundingBoxes)
    assert (
        torch.equal(ours["objects"]["boxes"], theirs["objects"]["boxes"])
        and unframed(ours["image"], ours["objects"]) == []
    )


def test_a_stack_that_crops_boxes_without_sanitizing_is_refused_with_the_fix():
    unlabelled = v2.SanitizeBoundingBoxes(labels_getter=None)  # would keep the dropped boxes' labels
    for train in (CROP[:2], [SanitizeBoxes(), *CROP[:2]], [*CROP[:2], unlabelled]):
        with pytest.raises(ValueError, match=r"moves boxes through RandomResizedCrop.*SanitizeBoxes"):
            loaders(BoxSource(8), train=train).setup("fit")
    loaders(BoxSource(8), train=[v2.RandomHorizontalFlip()]).setup("fit")  # a flip leaves every box whole
    loaders(BoxSource(8)).setup("fit")


def test_images_of_two_sizes_under_the_uint8_collate_point_to_collate_detection():
    collate = Uint8Collate()
    target = decode_boxes({"boxes": np.zeros((0, 4)), "labels": []}, "XYXY", (8, 8), 3)
    samples = [
        {"image": tv_tensors.Image(torch.zeros(3, 8, s, dtype=torch.uint8)), "objects": target}
        for s in (8, 9)
    ]
    with pytest.raises(RuntimeError, match="use collate=detection"):
        collate(samples)


def test_bench_times_a_detection_models_own_training_step():
    import lightning as L

    from feedline.diagnostics.loader_bench import model_step

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def training_step(self, batch, batch_idx):
            images, targets = batch
            loss = self.w * (images.mean() + sum(len(t["boxes"]) for t in targets))
            self.log("train/loss", loss)
            return loss

    data = loaders(BoxSource(8))
    batch = next(iter(data.train_dataloader()))
    assert (
        model_step(Tiny(), batch, torch.device("cpu"), lambda b: data.device_batch(b, training=True), 2) > 0
    )


def test_bench_does_not_claim_reduced_decode_for_samples_with_boxes():
    from feedline.diagnostics.in_force import REDUCED_DECODE, in_force

    assert REDUCED_DECODE not in in_force(loaders(BoxSource(8)), workers=0, cpus=2)


def test_a_box_beyond_its_image_or_of_negative_size_is_bad_input():
    with pytest.raises(
        DecodeError, match=r"box 1 \[60.0, 50.0, 20.0, 20.0\] \(XYWH\) lies beyond the 48x40 image"
    ):
        decode_boxes({"boxes": [[0, 0, 8, 8], [60, 50, 20, 20]], "labels": [0, 0]}, "XYWH", (40, 48), 3)
    with pytest.raises(DecodeError, match=r"box 0 \[10.0, 10.0, 4.0, 12.0\] \(XYXY\) has a negative width"):
        decode_boxes({"boxes": [[10, 10, 4, 12]], "labels": [0]}, "XYXY", (40, 48), 3)
    edge = decode_boxes({"boxes": [[-0.5, 0, 48.5, 40.6]], "labels": [0]}, "XYXY", (40, 48), 3)
    assert edge["boxes"].shape == (1, 4)  # within 1 px of the edge: a float exporter's rounding, kept


def test_a_target_with_more_labels_than_boxes_never_reaches_the_model():
    target = decode_boxes({"boxes": [[0, 0, 4, 4], [4, 4, 8, 8]], "labels": [0, 1]}, "XYXY", (8, 8), 3)
    target["boxes"] = tv_tensors.wrap(target["boxes"][:1], like=target["boxes"])  # labels left as they were
    image = tv_tensors.Image(torch.zeros(3, 8, 8, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="holds 1 boxes but 2 labels"):
        DetectionCollate()([{"image": image, "objects": target}])


def test_sanitize_passes_a_sample_without_boxes_unchanged():
    image = torch.zeros(3, 8, 8, dtype=torch.uint8)
    assert SanitizeBoxes()(image) is image
    pair = SanitizeBoxes()(image, 3)
    assert pair[0] is image and pair[1] == 3


def test_hdf5_conversion_refuses_boxes_by_name_before_writing(tmp_path):
    from feedline.writers.hdf5 import convert_source
    from feedline.writers.options import HDF5WriteOptions

    out = tmp_path / "out.h5"
    with pytest.raises(ValueError, match=r"out.format=hdf5 does not store a boxes field \(objects\).*shards"):
        convert_source(BoxSource(4), HDF5WriteOptions(path=str(out)))
    assert not out.exists()


def test_a_batchs_targets_share_one_segment_per_key_and_keep_their_values():
    batch = next(
        iter(loaders(BoxSource(8), train=[v2.RandomHorizontalFlip()], num_workers=2).train_dataloader())
    )
    with_boxes = [t for t in batch.objects if len(t["boxes"])]
    assert len(with_boxes) >= 2
    for key in ("boxes", "labels", "iscrowd"):
        storages = {t[key].untyped_storage().data_ptr() for t in with_boxes}
        assert len(storages) == 1, key  # one segment crossed from the worker, each target a view of its rows
    for image, target in zip(batch.image, batch.objects):
        n = int(image[0, 0, 0])
        assert isinstance(target["boxes"], tv_tensors.BoundingBoxes) and len(target["boxes"]) == len(
            drawn(n)[2]
        )
        assert unframed(image, target) == [] and target["labels"].tolist() == drawn(n)[2].tolist()

"""Samples of named fields: a mask stays on its image through every path (crop and flip, workers, shuffle,
collate, resume on another world, mix), each kind reaches the batch as its kind, and bad input is named."""

from __future__ import annotations

import io
import logging
import pickle
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from feedline.datamodules import ImageLoaders
from feedline.datamodules.bad_samples import BadSampleError
from feedline.datamodules.epoch.checks import ResumeError
from feedline.datasets import Field, Fields, MixSource
from feedline.datasets.fields import fields_from_config
from feedline.moved import MovedWarning
from feedline.transforms import Batch, DefaultCollate, MixupCutmix, PadCollate, TransformStacks, Uint8Collate
from feedline.transforms.decode import DecodeError
from feedline.transforms.masks import decode_mask
from tests.field_data import FIELDS, PixelSource, misaligned, pixels, png

CROP = [v2.RandomResizedCrop(24, scale=(0.3, 1.0)), v2.RandomHorizontalFlip()]


def loaders(source, collate=None, train=CROP, **knobs):
    stacks = TransformStacks(
        train=train, eval=[v2.CenterCrop(24)], batch=[v2.ToDtype(torch.float32, scale=True)]
    )
    options = {"batch_size": 4, "num_workers": 0, "seed": 3, **knobs}
    return ImageLoaders(source, stacks, collate or Uint8Collate(), **options)


def check_batch(batch) -> list[int]:
    """Every field of every sample belongs to the sample its pixels name, and each mask lies on its image."""
    ids = batch.id.long().tolist()
    assert batch.image.dtype == torch.uint8 and batch.mask.dtype == torch.uint8 and batch.mask.dim() == 3
    assert batch.image[:, 0, 0, 0].long().tolist() == ids  # red is the sample's row
    assert batch.caption == [f"sample {n}" for n in ids] and [m["n"] for m in batch.meta] == ids
    assert batch.tags.dtype == torch.float32 and batch.tags.argmax(1).tolist() == [n % 3 for n in ids]
    assert batch.emb.dtype == torch.float32 and batch.emb.tolist() == [[n, -n, 0.5] for n in ids]
    valid = batch.valid if batch.valid is not None else [None] * len(ids)
    for image, mask, where in zip(batch.image, batch.mask, valid):
        pure, wrong = misaligned(image, mask, where)
        assert pure > 50 and wrong <= pure // 100, f"{wrong} of {pure} pixels off their mask"
    x, y = batch
    assert x is batch.image and y is batch.mask  # the target field unpacks as y
    return ids


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mask_stays_on_its_image_through_crop_flip_shuffle_and_workers(workers):
    source = loaders(PixelSource(12), num_workers=workers)
    ids = [n for batch in source.train_dataloader() for n in check_batch(batch)]
    assert sorted(ids) == list(range(12)) and ids != sorted(ids)  # each once, shuffled


def test_the_check_sees_a_mask_that_did_not_move():
    image, mask = (torch.from_numpy(a) for a in pixels(5))
    flipped = image.permute(2, 0, 1).flip(-1)
    assert misaligned(flipped, mask)[1] > 100  # a flip of the image alone is caught
    assert misaligned(flipped, mask.flip(-1))[1] == 0


@pytest.mark.parametrize("collate", [DefaultCollate(), PadCollate(pad_value=0)])
def test_every_collate_stacks_each_kind(collate):
    train = [v2.RandomHorizontalFlip()] if isinstance(collate, PadCollate) else CROP
    batch = next(iter(loaders(PixelSource(8), collate, train).train_dataloader()))
    check_batch(batch)
    if isinstance(collate, PadCollate):  # sizes differ: padded, the mask with its ignore_index
        assert batch.valid.shape == batch.mask.shape
        assert (batch.mask[~batch.valid] == 255).all() and (batch.mask[batch.valid] < 4).all()


def test_the_device_stack_normalises_the_image_only():
    dm = loaders(PixelSource(8))
    batch = dm.device_batch(next(iter(dm.train_dataloader())), training=True)
    assert batch.image.dtype == torch.float32 and batch.mask.dtype == torch.uint8
    assert isinstance(batch.caption, list) and batch.id.dtype == torch.float32


def test_mixup_is_refused_for_a_mask_target_and_mixes_multi_hot_targets():
    stacks = TransformStacks(train=CROP, mix=MixupCutmix(mixup_alpha=0.4, cutmix_alpha=0))
    with pytest.raises(ValueError, match="target 'mask' is of kind mask"):
        ImageLoaders(PixelSource(8), stacks, Uint8Collate(), batch_size=4).setup("fit")
    tagged = PixelSource(8)
    tagged.fields = Fields(list(FIELDS.values()), target="tags")
    tagged.classes = ["x", "y", "z"]
    with pytest.raises(ValueError, match="also hold 'mask', which it would leave describing only one"):
        ImageLoaders(tagged, stacks, Uint8Collate(), batch_size=4).setup("fit")
    tagged.fields = Fields([f for f in FIELDS.values() if f.name != "mask"], target="tags")
    dm = ImageLoaders(tagged, stacks, Uint8Collate(), batch_size=4, seed=1)
    batch = dm.device_batch(next(iter(dm.train_dataloader())), training=True, seed=0)
    assert batch.tags.shape == (4, 3) and torch.allclose(batch.tags.sum(1), torch.ones(4))


def test_a_mask_of_another_size_than_its_image_is_named_or_skipped():
    with pytest.raises(BadSampleError, match=r"pixels row 3: field 'mask' is 56x32 but 'image' is 56x40"):
        list(loaders(PixelSource(8, bad=[3]), on_bad_sample="raise").train_dataloader())
    skipping = loaders(PixelSource(8, bad=[3]), on_bad_sample="skip", max_bad_fraction=0.5)
    ids = [n for batch in skipping.train_dataloader() for n in check_batch(batch)]
    assert 3 not in ids and len(ids) == 8  # replaced by a readable sample: batches keep their size


class World(ImageLoaders):
    def __init__(self, *args, world=1, rank=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.world, self.rank = world, rank

    def _world(self):
        return self.world, self.rank, 1, False


def per_sample(batches) -> dict[int, bytes]:
    out = {}
    for batch in batches:
        for n, image, mask in zip(check_batch(batch), batch.image, batch.mask):
            assert n not in out, f"sample {n} read twice"
            out[n] = image.numpy().tobytes() + mask.numpy().tobytes()
    return out


def test_a_resume_on_another_world_reads_the_rest_of_the_epoch_once_with_the_same_crops():
    def ranks(world, batch):
        return [World(PixelSource(24), TransformStacks(train=CROP), Uint8Collate(), batch_size=batch,
                      seed=5, world=world, rank=r).train_dataloader() for r in range(world)]  # fmt: skip

    whole = per_sample(b for loader in ranks(1, 4) for b in loader)
    first = ranks(2, 3)
    before = []
    for loader in first:
        for _, batch in zip(range(2), loader):
            loader.position.batches += 1  # what on_after_batch_transfer counts under a Trainer
            before.append(batch)
    state = first[0].state_dict()
    second = ranks(1, 5)
    second[0].load_state_dict(state)
    assert per_sample(before + list(second[0])) == whole  # every sample once, mask and crop as before


def test_a_strict_resume_refuses_other_fields():
    loader = loaders(PixelSource(12)).train_dataloader()
    next(iter(loader))
    state = loader.state_dict()
    other = PixelSource(12)
    other.fields = Fields([*FIELDS.values()][:2], target="mask")  # a field dropped
    with pytest.raises(ResumeError, match="sample fields") as refused:
        loaders(other).train_dataloader().load_state_dict(state)
    said = str(refused.value)  # what changed, in words: the fields dropped were there then, not now
    assert (
        "caption: text" in said.split(" then, ")[0]
        and "caption" not in said.split(" then, ")[1].split(" now")[0]
    )


def test_a_mix_of_sources_with_the_same_fields_reads_both_and_refuses_others():
    mix = MixSource({"a": {"source": PixelSource(6)}, "b": {"source": PixelSource(6)}})
    assert mix.fields == FIELDS
    dm = loaders(mix)
    assert sorted(n for batch in dm.train_dataloader() for n in check_batch(batch)) == sorted([*range(6)] * 2)
    val = next(iter(dm.val_dataloader()))
    assert val.part.tolist() == [0, 0, 0, 0] and check_batch(val)
    other = PixelSource(6)
    other.fields = Fields([*FIELDS.values()][:3], target="mask")
    with pytest.raises(
        ValueError, match="parts.a and source.parts.b hold different fields: field 'caption' is in"
    ):
        _ = MixSource({"a": {"source": PixelSource(6)}, "b": {"source": other}}).fields
    renamed = PixelSource(6)
    renamed.fields = Fields([*FIELDS.values()][::-1], target="mask")  # the same fields, in another order
    assert MixSource({"a": {"source": PixelSource(6)}, "b": {"source": renamed}}).fields == FIELDS
    renamed.fields = Fields(
        [Field("mask", "mask", classes=("a", "b", "c", "e")), *[*FIELDS.values()][2:], FIELDS["image"]],
        "mask",
    )
    merged = MixSource(
        {"a": {"source": PixelSource(6)}, "b": {"source": renamed}}
    ).fields  # other class lists
    assert merged["mask"].classes == ("a", "b", "c", "d", "e")  # merge (tests/test_mix_fields.py)


def test_source_fields_config_is_checked_by_key():
    fields = fields_from_config(
        {"image": "image", "seg": {"column": "m", "kind": "mask", "classes": ["a"]}}, "seg"
    )
    assert fields.target == "seg" and fields["seg"].source_column == "m" and fields.classes == ["a"]
    for bad, said in [
        ({"image": "image", "y": "colour"}, r"source.fields.y.kind='colour' is not one of"),
        (
            {"image": "image", "y": {"kind": "class", "colum": "c"}},
            r"source.fields.y.colum is not a field key",
        ),
        ({"image": "image", "valid": "class"}, "a name a batch keeps for itself"),
        ({"y": "class"}, "no field of kind image"),
        ({"image": "image", "t": "classes"}, "needs its class list"),
    ]:
        with pytest.raises(ValueError, match=said):
            fields_from_config(bad, None if "t" not in bad else "t")
    with pytest.raises(ValueError, match="source.target='z' is not one of the fields"):
        fields_from_config({"image": "image", "y": "class"}, "z")


def test_a_palette_mask_keeps_its_indices_and_a_colour_mask_is_refused():
    values = (np.arange(48).reshape(6, 8) % 5).astype(np.uint8)
    palette = Image.fromarray(values, "P")
    palette.putpalette([0, 0, 0, 200, 10, 10, 10, 200, 10, 10, 10, 200, 250, 250, 0])
    buffer = io.BytesIO()
    palette.save(buffer, "PNG")
    for payload in (buffer.getvalue(), png(values, "L"), values):
        mask = decode_mask(payload)
        assert (
            mask.shape == (1, 6, 8)
            and mask.dtype == torch.uint8
            and mask[0].numpy().tolist() == values.tolist()
        )
    with pytest.raises(DecodeError, match="RGB mask.*one channel of class indices"):
        decode_mask(png(np.zeros((4, 4, 3), np.uint8), "RGB"))


def test_a_batch_is_a_mapping_that_unpacks_moves_and_pickles():
    batch = Batch.of(
        {"image": torch.zeros(2, 3, 4, 4), "mask": torch.ones(2, 4, 4), "caption": ["a", "b"]},
        "image",
        "mask",
    )
    x, y = batch
    assert y is batch["mask"] is batch.mask and list(batch.keys()) == ["image", "mask", "caption"]
    assert batch[1] is y and "caption" in batch and batch.get("nothing") is None and batch.part is None
    moved = pickle.loads(pickle.dumps(batch.to("cpu")))
    assert moved.caption == ["a", "b"] and torch.equal(moved.mask, batch.mask) and moved.y_name == "mask"
    with pytest.raises(AttributeError, match="no field 'label'; it has image, mask, caption"):
        batch.label  # noqa: B018
    padded = PadCollate()(
        [(torch.zeros(3, 2, 2, dtype=torch.uint8), 0), (torch.zeros(3, 3, 2, dtype=torch.uint8), 1)]
    )
    with pytest.warns(MovedWarning, match="batch.mask of a padded batch is now batch.valid"):
        assert padded.mask is padded.valid
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Uint8Collate()([(torch.zeros(3, 2, 2, dtype=torch.uint8), 0)]).mask is None


def test_bench_times_a_masks_decode_as_its_own_stage():
    from feedline.diagnostics.loader_bench import stage_breakdown

    dm = loaders(PixelSource(8))
    dm.setup("fit")
    result = stage_breakdown(dm.datasets["train"], dm.collate, list(range(8)), batch_size=4)
    assert result["items"] == 8 and result["formats"] == {"png": 8}
    assert {"decode", "decode mask", "fields", "transform", "collate"} <= set(result["stages_run"])
    assert all(result["per_sample_s"][stage] > 0 for stage in ("decode", "decode mask", "fields"))


def test_reduced_decode_serves_an_image_alone_and_turns_off_beside_a_mask():
    from feedline.datamodules.sample_fields import FieldDecoder

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((256, 256, 3), np.uint8)).save(buffer, "JPEG")
    jpeg = np.frombuffer(buffer.getvalue(), np.uint8).copy()
    captioned = Fields([Field("image", "image"), Field("caption", "text")], target="caption")

    def floor(height, width):  # what a first transform of 64 px needs
        return 64, 64

    alone = FieldDecoder(captioned)({"image": jpeg, "caption": "c"}, floor=floor)
    assert alone["image"].shape == (3, 64, 64) and alone["caption"] == "c"  # decoded at 1/4 scale
    masked = FieldDecoder(Fields([Field("image", "image"), Field("mask", "mask")], target="mask"))
    sample = masked({"image": jpeg, "mask": np.zeros((256, 256), np.uint8)}, floor=floor)
    assert sample["image"].shape == (3, 256, 256) and sample["mask"].shape == (1, 256, 256)


NEAREST = [v2.RandomResizedCrop(24, interpolation=v2.InterpolationMode.NEAREST), v2.RandomHorizontalFlip()]


@pytest.mark.parametrize(("seed", "crop"), [(0, CROP), (1, CROP), (2, NEAREST), (3, NEAREST)])
def test_the_crop_finished_in_the_collate_gives_the_stacks_very_pixels_and_draws(seed, crop):
    from feedline.transforms.deferred import DeferredCrop, PendingMask

    dm = loaders(PixelSource(4), train=None)
    dm.setup("fit")
    samples = [dm.datasets["train"][i] for i in range(4)]
    stack, deferred = v2.Compose(crop), DeferredCrop(crop)
    torch.manual_seed(seed)
    plain = DefaultCollate()([stack(dict(s)) for s in samples])
    torch.manual_seed(seed)
    pended = [deferred(dict(s)) for s in samples]
    assert isinstance(pended[0]["mask"], PendingMask)
    fast = Uint8Collate()(pended)
    assert torch.equal(fast.image, plain.image) and torch.equal(fast.mask, plain.mask)
    assert fast.caption == plain.caption and torch.equal(fast.tags, plain.tags)


def test_a_mask_value_beyond_the_class_list_and_a_nan_number_are_bad_input():
    from feedline.datamodules.sample_fields import FieldDecoder

    fields = Fields(
        [
            Field("image", "image"),
            Field("mask", "mask", classes=("a", "b"), ignore_index=0),
            Field("n", "number"),
        ],
        target="mask",
    )
    image, mask = np.zeros((3, 4, 4), np.uint8), np.ones((4, 4), np.uint8)
    decode = FieldDecoder(fields)
    decode({"image": image, "mask": mask, "n": 1.0})  # indices 0..1 (and 0, the ignore_index): fine
    mask[1, 1] = 7
    with pytest.raises(DecodeError, match=r"field 'mask': mask value 7 is not a class index \(2 classes"):
        decode({"image": image, "mask": mask, "n": 1.0})
    with pytest.raises(DecodeError, match=r"field 'n': nan is not finite"):
        decode({"image": image, "mask": np.ones((4, 4), np.uint8), "n": float("nan")})


def test_a_mask_class_list_is_checked_against_uint8_and_the_source_against_its_target(caplog):
    with pytest.raises(ValueError, match=r"source.fields.m.classes lists 300 classes: a mask is uint8"):
        Fields([Field("image", "image"), Field("m", "mask", classes=tuple(map(str, range(300))))], "m")
    with pytest.raises(ValueError, match=r"source.fields.m.classes is empty"):
        Fields([Field("image", "image"), Field("m", "mask", classes=())], "m")
    with caplog.at_level(logging.WARNING, logger="feedline.datasets.fields"):
        Fields([Field("image", "image"), Field("m", "mask", classes=("void", "cat"), ignore_index=0)], "m")
    assert "source.fields.m.ignore_index=0 is a class index ('void')" in caplog.text
    wrong = PixelSource(8)
    wrong.classes = ["a", "b"]  # the target has 4
    with pytest.raises(ValueError, match=r"PixelSource.classes \(2: a, b\) is not its target field 'mask'"):
        loaders(wrong).setup("fit")


def test_a_record_without_a_declared_field_is_a_source_bug_never_skipped():
    class Forgetful(PixelSource):
        def split(self, name):
            records = super().split(name)
            read = records.read
            records.read = lambda row: {k: v for k, v in read(row).items() if k != "caption"}
            return records

    with pytest.raises(KeyError, match="the source's record has no field 'caption'"):
        next(iter(loaders(Forgetful(8), on_bad_sample="skip").train_dataloader()))


def test_beside_a_mask_a_photo_is_turned_as_its_exif_orientation_says():
    from feedline.datamodules.sample_fields import FieldDecoder

    image, mask = pixels(3)  # 48x56, not square
    stored = Image.fromarray(np.ascontiguousarray(np.rot90(image, 1)))  # the sensor's frame: turned
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    buffer = io.BytesIO()
    stored.save(buffer, "JPEG", quality=95, exif=exif)
    jpeg = np.frombuffer(buffer.getvalue(), np.uint8).copy()
    sample = FieldDecoder(
        Fields([Field("image", "image"), Field("mask", "mask", classes=tuple("abcd"))], "mask")
    )({"image": jpeg, "mask": png(mask, "L")})
    assert tuple(sample["image"].shape[-2:]) == mask.shape  # displayed as drawn, so the mask fits
    assert np.abs(sample["image"].permute(1, 2, 0).numpy().astype(int) - image).mean() < 4  # pixel for pixel
    captioned = FieldDecoder(Fields([Field("image", "image"), Field("c", "text")], "c"))(
        {"image": jpeg, "c": "x"}
    )
    assert (
        tuple(captioned["image"].shape[-2:]) == mask.shape[::-1]
    )  # no mask: as stored, as ImageFolder reads it


def test_pixels_a_transform_invents_carry_the_masks_ignore_index():
    pad = [v2.RandomCrop(64, pad_if_needed=True), v2.RandomRotation(30)]
    dm = loaders(PixelSource(4), DefaultCollate(), train=pad)
    batch = next(iter(dm.train_dataloader()))
    # black: padding and rotated-in corners; a real pixel's red is its sample's row, so row 0 is left out
    invented = (batch.image == 0).all(1) & (batch.id > 0)[:, None, None]
    assert invented.sum() > 1000 and (batch.mask[invented] == 255).float().mean() > 0.95


def test_a_segmenter_step_on_void_alone_is_zero_not_nan():
    from functools import partial

    from feedline.models import Segmenter
    from feedline.models.nets import SmallUNet

    model = Segmenter(num_classes=2, net=partial(SmallUNet, width=4))
    model.log = lambda *a, **k: None
    loss = model.training_step(
        (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), torch.full((2, 16, 16), 255)), 0
    )
    assert loss.item() == 0.0 and loss.requires_grad

"""Decode only the crop: the crop's window drawn from the JPEG's header and decoded alone, with the pixels of a
full decode (``transforms/jpeg_window.py``, ``transforms/window.py``, ``transforms/_jpeg_window.c``)."""

from __future__ import annotations

import io
import logging
import os
import random

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2

from feedline.datamodules.image import ImageDataModule
from feedline.datamodules.samples import SampleDataset
from feedline.datasets.folder.source import FolderSource
from feedline.transforms import jpeg_window
from feedline.transforms.collate import DefaultCollate, Uint8Collate
from feedline.transforms.crop import RandomResizedCrop
from feedline.transforms.decode import DecodeError
from feedline.transforms.deferred import DeferredCrop, PendingCrop, defer_crop
from feedline.transforms.flip import RandomHorizontalFlip
from feedline.transforms.stacks import TransformStacks, compose
from feedline.transforms.window import Windowed, crop_first
from tests.field_data import PixelRecords, PixelSource

PHOTO = Image.fromarray(load_sample_images().images[1])


def jpeg(size=(160, 120), subsampling=2, progressive=False, mode="RGB", quality=90) -> bytes:
    image = PHOTO.resize(size).convert(mode)
    out = io.BytesIO()
    extra = {"subsampling": subsampling} if mode == "RGB" else {}
    image.save(out, "JPEG", quality=quality, progressive=progressive, **extra)
    return out.getvalue()


KINDS = {
    "4:4:4": lambda size: jpeg(size, 0),
    "4:2:2": lambda size: jpeg(size, 1),
    "4:2:0": lambda size: jpeg(size, 2),
    "grayscale": lambda size: jpeg(size, mode="L"),
    "progressive": lambda size: jpeg(size, 2, progressive=True),
}


def full_decode(data: bytes) -> torch.Tensor:
    return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


class Spy:
    """The extension, counting its decodes."""

    def __init__(self, native):
        self.native, self.calls = native, 0
        self.JpegError = native.JpegError

    def decode_into(self, *args):
        self.calls += 1
        return self.native.decode_into(*args)


@pytest.fixture
def spy(monkeypatch):
    spy = Spy(jpeg_window._native)
    monkeypatch.setattr(jpeg_window, "_native", spy)
    return spy


def test_the_extension_is_built_where_a_compiler_and_libjpeg_headers_are():
    if not os.path.exists("/usr/include/jpeglib.h"):
        pytest.skip("no libjpeg headers on this machine: the extension is optional")
    assert jpeg_window.available(), "pip install -e . did not build transforms/_jpeg_window.c"


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("size", [(160, 120), (97, 61)])
def test_a_window_holds_the_pixels_of_torchvisions_full_decode(kind, size):
    data = KINDS[kind](size)
    full = full_decode(data)
    rng = random.Random(f"{kind}{size}")
    height, width = full.shape[1:]
    for _ in range(60):
        h, w = rng.randint(1, height), rng.randint(1, width)
        top, left = rng.randint(0, height - h), rng.randint(0, width - w)
        window = jpeg_window.window(np.frombuffer(data, np.uint8), (height, width), (top, left, h, w))
        assert torch.equal(window, full[:, top : top + h, left : left + w]), (top, left, h, w)
        assert window.permute(1, 2, 0).is_contiguous()  # channels-last, as the crop's resize reads it


class Records:
    """JPEG records of every subsampling and of several sizes, one truncated where ``bad`` says."""

    def __init__(self, n: int = 20, bad: int | None = None):
        kinds = list(KINDS.values())
        self.items = [kinds[i % len(kinds)]((90 + 9 * i, 70 + 5 * (i % 7))) for i in range(n)]
        if bad is not None:
            self.items[bad] = self.items[bad][: len(self.items[bad]) // 2]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return np.frombuffer(self.items[i], np.uint8), i % 3

    def describe(self, i):
        return f"image {i}"


STACKS = {
    "deferred crop and flip (collate=uint8)": (
        lambda: defer_crop(compose([RandomResizedCrop(40, antialias=True), RandomHorizontalFlip()])),
        lambda: Uint8Collate(reuse_buffers=False),
    ),
    "torchvision's crop, flip, colour jitter": (
        lambda: compose(
            [v2.RandomResizedCrop(40, antialias=True), v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4)]
        ),
        DefaultCollate,
    ),
    "bicubic crop, not square": (
        lambda: compose([RandomResizedCrop((30, 44), interpolation=v2.InterpolationMode.BICUBIC)]),
        DefaultCollate,
    ),
}


def batch_of(records, stack, collate, window: bool, keys, reduced: bool = False):
    stack = crop_first(stack) if window else stack
    dataset = SampleDataset(records, stack, reduced_decode=reduced, window_decode=window)
    return collate(dataset.__getitems__(keys))


@pytest.mark.parametrize("name", list(STACKS))
def test_batches_from_windows_equal_batches_from_whole_images_bit_for_bit(name, spy):
    stack, collate = STACKS[name]
    keys = [(i, 500 + i) for i in range(20)]  # (index, seed), as the train sampler gives them
    whole = batch_of(Records(), stack(), collate(), False, keys)
    assert spy.calls == 0
    windowed = batch_of(Records(), stack(), collate(), True, keys)
    assert spy.calls == 20  # every sample's window decoded alone
    assert torch.equal(windowed[0], whole[0]) and torch.equal(windowed[1], whole[1])


def test_the_crop_is_drawn_before_the_decode_with_the_samples_seed():
    """The seed is set before the decode, where the window is drawn, and the flip draws after it: the same
    sample and seed give the same box and flip as a whole image through the stack."""
    stack = defer_crop(compose([RandomResizedCrop(40), RandomHorizontalFlip(p=0.5)]))
    dataset = SampleDataset(Records(), stack, reduced_decode=False, window_decode=True)
    for i in range(10):
        pending = dataset[(i, 77 + i)][0]
        image = full_decode(Records().items[i])
        torch.manual_seed(77 + i)
        expected = stack(image)
        assert isinstance(pending, PendingCrop) and pending.flip == expected.flip
        top, left, h, w = expected.box  # the window alone was decoded: the stack's box, in the image
        assert pending.box == (0, 0, h, w) and torch.equal(
            pending.image, image[:, top : top + h, left : left + w]
        )
        assert torch.equal(pending.materialize(), expected.materialize())


def test_a_corrupt_jpeg_is_named_as_the_whole_decode_names_it_and_skipped_alike(spy):
    records = Records(bad=3)
    stack = defer_crop(compose([RandomResizedCrop(40), RandomHorizontalFlip()]))
    with_window = SampleDataset(records, crop_first(stack), reduced_decode=False, window_decode=True)
    whole = SampleDataset(records, stack, reduced_decode=False, window_decode=False)
    payload = records[3][0]
    with pytest.raises(DecodeError) as windowed_error:
        with_window.decode(payload)
    with pytest.raises(DecodeError) as whole_error:
        whole.decode(payload)
    assert str(windowed_error.value) == str(whole_error.value)
    assert "truncated" in str(windowed_error.value)
    keys = [(i, 9 + i) for i in range(8)]
    collate = Uint8Collate(reuse_buffers=False)
    got, want = collate(with_window.__getitems__(keys)), collate(whole.__getitems__(keys))
    assert torch.equal(got[0], want[0]) and torch.equal(
        got[1], want[1]
    )  # sample 3 replaced by sample 4, alike
    assert with_window.bad.count == 1


@pytest.mark.parametrize(
    "variant",
    ["cmyk", "bytes after the end of the image"],
)
def test_what_the_extension_declines_is_decoded_whole_by_torchvision(variant, spy):
    if variant == "cmyk":
        out = io.BytesIO()
        PHOTO.resize((120, 90)).convert("CMYK").save(out, "JPEG", quality=90)
        data = out.getvalue()
    else:
        data = jpeg((120, 90)) + b"trailing bytes a camera wrote"
    stack = crop_first(compose([RandomResizedCrop(32)]))
    torch.manual_seed(5)
    got = jpeg_window.decode_drawn(np.frombuffer(data, np.uint8), stack, False, None)
    assert isinstance(got, Windowed) and spy.calls == 1
    assert torch.equal(got.image, full_decode(data))  # torchvision's whole image, the drawn box kept
    torch.manual_seed(5)
    assert got.box == stack.draw(90, 120)


def test_windows_at_a_dct_scale_stay_near_the_unscaled_window_and_only_where_allowed():
    data = np.frombuffer(jpeg((1280, 960), 2), np.uint8)
    stack = crop_first(compose([RandomResizedCrop(64, antialias=True)]))
    scaled_once = False
    for seed in range(12):
        torch.manual_seed(seed)
        box = stack.draw(960, 1280)
        torch.manual_seed(seed)
        reduced = jpeg_window.decode_drawn(data, stack, True, None)
        torch.manual_seed(seed)
        exact = jpeg_window.decode_drawn(data, stack, False, None)
        assert tuple(exact.image.shape[1:]) == box[2:]  # reduced_decode off: the window at full size
        denom = stack.scale(box)
        assert box[2] // denom >= 128 or denom == 1  # twice the output's 64 px on each side
        size = (-(-960 // denom), -(-1280 // denom))
        assert tuple(reduced.image.shape[1:]) == jpeg_window.scaled(box, denom, size)[2:]
        scaled_once |= denom > 1
        a, b = stack(reduced).float(), stack(exact).float()
        psnr = 10 * torch.log10(255**2 / ((a - b) ** 2).mean().clamp(min=1e-9))
        assert (a - b).abs().mean() < 3 and psnr > 28
    assert scaled_once


def test_the_datamodule_decodes_windows_in_workers_with_the_pixels_of_whole_images(tmp_path):
    root = tmp_path / "data"
    for c, cls in enumerate(("ant", "bee")):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            (root / cls / f"{i}.jpg").write_bytes(KINDS[list(KINDS)[(i + c) % 5]]((80 + 7 * i, 64 + 3 * i)))
    stacks = TransformStacks(train=[RandomResizedCrop(32), RandomHorizontalFlip()])
    batches = {}
    for window in (True, False):
        source = FolderSource(str(root), val_fraction=0, cache_dir=str(tmp_path / "cache"))
        dm = ImageDataModule(
            source, stacks, Uint8Collate(), batch_size=4, num_workers=2, reduced_decode=False,
            window_decode=window, seed=3,
        )  # fmt: skip
        dm.setup("fit")
        assert isinstance(dm.datasets["train"].transform, DeferredCrop)
        assert dm.datasets["train"].window_decode is window
        batches[window] = [(b.image.clone(), b.label.clone()) for b in dm.train_dataloader()]
    assert len(batches[True]) == 3
    for (a, la), (b, lb) in zip(batches[True], batches[False]):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_without_the_extension_jpegs_decode_whole_and_feedline_says_so_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(jpeg_window, "_native", None)
    monkeypatch.setattr(jpeg_window, "_WHY", "No module named 'feedline.transforms._jpeg_window'")
    monkeypatch.setattr(jpeg_window, "_told", False)
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    for i in range(4):
        (root / "a" / f"{i}.jpg").write_bytes(jpeg((70, 50)))
    stacks = TransformStacks(train=[RandomResizedCrop(16)])
    with caplog.at_level(logging.WARNING, logger="feedline.transforms.jpeg_window"):
        for _ in range(2):
            source = FolderSource(str(root), val_fraction=0, cache_dir=str(tmp_path / "cache"))
            dm = ImageDataModule(source, stacks, Uint8Collate(), batch_size=2, num_workers=0)
            dm.setup("fit")
            dataset = dm.datasets["train"]
            assert not dataset.window_decode
            decoded = dataset.decode(dataset.records[0][0])  # the crop drawn from the header, the image whole
            assert isinstance(decoded, Windowed) and decoded.image.shape == (3, 50, 70)
    said = [r.getMessage() for r in caplog.records if "crop-window" in r.getMessage()]
    assert len(said) == 1 and "libjpeg" in said[0] and "pip install" in said[0]


class JpegPixelRecords(PixelRecords):
    def read(self, row: int) -> dict:
        record = super().read(row)
        out = io.BytesIO()
        Image.open(io.BytesIO(record["image"].tobytes())).save(out, "JPEG")
        return {**record, "image": np.frombuffer(out.getvalue(), np.uint8)}


class JpegPixelSource(PixelSource):
    def split(self, name: str) -> JpegPixelRecords:
        return JpegPixelRecords(range(self.n) if name == "train" else range(100, 104))


def test_data_window_decode_false_and_samples_of_named_fields_keep_the_whole_decode(spy):
    stack = compose([RandomResizedCrop(16)])
    dataset = SampleDataset(Records(4), crop_first(stack), window_decode=False)
    decoded = dataset.decode(dataset.records[0][0])
    assert decoded.image.shape == (3, 70, 90) and spy.calls == 0  # the whole image
    # a stack that does not start with the crop is left as it is
    assert type(crop_first(compose([v2.Resize(8), RandomResizedCrop(4)]))) is v2.Compose
    source = JpegPixelSource(4)
    stacks = TransformStacks(train=[RandomResizedCrop(16), RandomHorizontalFlip()])
    dm = ImageDataModule(source, stacks, Uint8Collate(), batch_size=2, num_workers=0)
    dm.setup("fit")
    sample = dm.datasets["train"][(0, 1)]
    assert isinstance(sample["image"], PendingCrop) and spy.calls == 0  # its mask crops with it, whole


@pytest.mark.parametrize(
    "steps",
    [
        lambda: [v2.Resize(48, antialias=True), v2.CenterCrop(40)],
        lambda: [v2.Resize(50, interpolation=v2.InterpolationMode.BICUBIC), v2.CenterCrop((36, 44))],
        lambda: [v2.Resize((40, 90)), v2.CenterCrop(32), v2.ColorJitter(0.3)],
        lambda: [v2.Resize(24, interpolation=v2.InterpolationMode.NEAREST), v2.CenterCrop(20)],
    ],
)
@pytest.mark.parametrize("reduced", [False, True])
def test_evaluation_stacks_decode_what_their_centre_crop_reads_with_the_same_pixels(steps, reduced, spy):
    records = Records()
    whole = SampleDataset(records, compose(steps()), reduced_decode=reduced, window_decode=False)
    windowed = SampleDataset(records, compose(steps()), reduced_decode=reduced, window_decode=True)
    for i in range(len(records)):
        torch.manual_seed(i)
        a = whole[i][0]
        torch.manual_seed(i)
        assert torch.equal(windowed[i][0], a), i
    assert spy.calls == len(records)
    assert type(windowed.decode(records[0][0])) is torch.Tensor  # nothing drawn: the stack runs as it did


@pytest.mark.parametrize("how", ["window decode off", "extension not built"])
def test_the_crops_are_the_same_with_the_window_decoded_alone_or_not_at_every_scale(how, monkeypatch, spy):
    """The crop is drawn at the image's full size from its header, and decoded at the DCT scale its box allows,
    whether the window alone is decoded or the whole image: a run without the extension, or with
    data.window_decode=false, gets the same batches (data.reduced_decode on, photos large enough to scale)."""
    photos = [np.frombuffer(jpeg((640 + 64 * i, 480 - 16 * i), i % 3), np.uint8) for i in range(8)]

    class Photos(Records):
        def __init__(self):
            self.items = photos

        def __getitem__(self, i):
            return self.items[i], i % 2

    stack = lambda: defer_crop(compose([RandomResizedCrop(48, antialias=True), RandomHorizontalFlip()]))  # noqa: E731
    keys = [(i, 40 + i) for i in range(8)]
    collate = Uint8Collate(reuse_buffers=False)
    windowed = SampleDataset(Photos(), stack(), reduced_decode=True, window_decode=True)
    with_window = collate(windowed.__getitems__(keys))
    assert spy.calls == 8
    if how == "extension not built":
        monkeypatch.setattr(jpeg_window, "_native", None)
    whole = SampleDataset(Photos(), stack(), reduced_decode=True, window_decode=how == "extension not built")
    without = collate(whole.__getitems__(keys))
    assert spy.calls == 8  # no window decoded
    assert torch.equal(with_window[0], without[0]) and torch.equal(with_window[1], without[1])
    scaled = 0  # some windows were decoded at a DCT scale
    for i, seed in keys:
        torch.manual_seed(seed)
        box = windowed.transform.draw(480 - 16 * i, 640 + 64 * i)
        scaled += windowed.transform.scale(box) > 1
    assert scaled >= 2

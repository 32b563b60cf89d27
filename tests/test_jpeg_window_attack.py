"""Crop-window decoding against the whole decode on damaged JPEGs: a window must never turn a sample that the whole
decode calls bad into a good one, nor give other pixels than the whole decode where both decode."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from torchvision.transforms import v2

from feedline.datamodules.bad_samples import BadSampleError
from feedline.datamodules.samples import SampleDataset
from feedline.transforms.window import crop_first

PHOTO = Image.fromarray(load_sample_images().images[1])


def jpeg(size=(160, 240), progressive=False) -> bytes:
    out = io.BytesIO()
    PHOTO.resize(size).save(out, "JPEG", quality=90, progressive=progressive)
    return out.getvalue()


def marker_inserted(data: bytes, marker: int, at: float) -> bytes:
    """A stray marker written over the entropy data, ``at`` of the way through the file (the end marker kept)."""
    damaged = bytearray(data)
    k = int(len(damaged) * at)
    damaged[k : k + 2] = bytes((0xFF, marker))
    return bytes(damaged)


class Records:
    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i], i

    def describe(self, i):
        return f"item {i}"


def outcome(dataset, key):
    try:
        image, _ = dataset[key]
    except BadSampleError:
        return "bad"
    return image


def test_a_jpeg_corrupt_below_the_train_window_is_bad_on_both_paths():
    data = marker_inserted(jpeg(), 0xC4, 0.8)  # a bogus DHT near the bottom: torchvision refuses the file
    stack = v2.Compose([v2.RandomResizedCrop(32, scale=(0.02, 0.05))])
    whole = SampleDataset(
        Records([data]), stack, on_bad_sample="raise", reduced_decode=False, window_decode=False
    )
    window = SampleDataset(
        Records([data]), crop_first(stack), on_bad_sample="raise", reduced_decode=False, window_decode=True
    )
    for seed in range(6):
        assert outcome(whole, (0, seed)) == "bad"
        assert outcome(window, (0, seed)) == "bad", f"seed {seed}: the window path decoded a corrupt JPEG"


def test_a_jpeg_corrupt_below_the_centre_crop_is_bad_on_both_paths():
    data = marker_inserted(jpeg(), 0xC4, 0.95)
    steps = lambda: v2.Compose([v2.Resize(32), v2.CenterCrop(8)])  # noqa: E731
    whole = SampleDataset(
        Records([data]), steps(), on_bad_sample="raise", reduced_decode=False, window_decode=False
    )
    window = SampleDataset(
        Records([data]), steps(), on_bad_sample="raise", reduced_decode=False, window_decode=True
    )
    assert outcome(whole, 0) == "bad"
    assert outcome(window, 0) == "bad"


def test_a_cut_progressive_jpeg_gives_the_same_pixels_through_the_window():
    good = jpeg(progressive=True)
    data = good[: int(len(good) * 0.7)] + b"\xff\xd9"
    stack = v2.Compose([v2.RandomResizedCrop(64)])
    whole = SampleDataset(Records([data]), stack, reduced_decode=False, window_decode=False)
    window = SampleDataset(Records([data]), crop_first(stack), reduced_decode=False, window_decode=True)
    for seed in range(6):
        a, b = outcome(whole, (0, seed)), outcome(window, (0, seed))
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        assert torch.equal(a, b), f"seed {seed}: max difference {(a.int() - b.int()).abs().max().item()}"


def with_claimed_size(data: bytes, height: int, width: int) -> bytes:
    """The JPEG with its frame header (SOF0) claiming another size."""
    damaged = bytearray(data)
    k = damaged.find(b"\xff\xc0")
    damaged[k + 5 : k + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(damaged)


@pytest.mark.parametrize(
    "claimed, window_decode",
    [
        ((0, 160), True),
        ((0, 160), False),  # the draw from the header would divide by the height
        ((240, 0), True),
        ((240, 0), False),
    ],
)
def test_a_jpeg_claiming_a_zero_side_is_a_bad_sample_not_a_crash(claimed, window_decode):
    good = jpeg()
    records = Records([with_claimed_size(good, *claimed), good])
    stack = v2.Compose([v2.RandomResizedCrop(32)])
    whole = SampleDataset(records, stack, on_bad_sample="skip", reduced_decode=False, window_decode=False)
    expected, label = whole[(0, 7)]
    assert label == 1  # skipped, replaced by the next sample
    drawn = SampleDataset(
        records, crop_first(stack), on_bad_sample="skip", reduced_decode=False, window_decode=window_decode
    )
    got, label = drawn[(0, 7)]
    assert label == 1 and torch.equal(got, expected)

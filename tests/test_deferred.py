"""The deferred crop: a train stack's crop and flip finished by the uint8 collate, with the stack's pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from feedline.datamodules.image import ImageDataModule
from feedline.datamodules.samples import SampleDataset
from feedline.datasets.folder.source import FolderSource
from feedline.transforms import deferred as deferred_module
from feedline.transforms.collate import DefaultCollate, Uint8Collate
from feedline.transforms.crop import CropDraws, RandomResizedCrop
from feedline.transforms.deferred import DeferredCrop, PendingCrop, defer_crop
from feedline.transforms.flip import RandomHorizontalFlip
from feedline.transforms.stacks import TransformStacks, compose
from tests.helpers import simple_tree


class Images:
    """Records of decoded (H, W, C)-ordered uint8 images of varied sizes, as the decoders return them."""

    def __init__(self, n: int = 24):
        rng = np.random.default_rng(0)
        sizes = [(90, 120), (120, 90), (64, 64), (37, 211), (200, 150), (48, 48)]
        self.images = [
            torch.from_numpy(rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8)).permute(
                2, 0, 1
            )
            for i in range(n)
        ]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], i % 3

    def describe(self, i):
        return f"image {i}"


def batches(stack, keys, collate=None):
    dataset = SampleDataset(Images(), stack)
    collate = collate or Uint8Collate(reuse_buffers=False)
    return [collate(dataset.__getitems__(chunk)) for chunk in keys]


STACKS = {
    "crop+flip": lambda: [RandomResizedCrop(48, antialias=True), RandomHorizontalFlip()],
    "torchvision's": lambda: [v2.RandomResizedCrop(48, antialias=True), v2.RandomHorizontalFlip(p=0.7)],
    "crop alone, not square": lambda: [RandomResizedCrop((40, 56), antialias=True)],
    "no antialias": lambda: [RandomResizedCrop(48, antialias=False), RandomHorizontalFlip()],
    "bicubic": lambda: [
        RandomResizedCrop(48, interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
        RandomHorizontalFlip(p=1.0),
    ],
    "nearest": lambda: [
        RandomResizedCrop(48, interpolation=v2.InterpolationMode.NEAREST),
        RandomHorizontalFlip(p=0.7),
    ],
    # whole 48x48 images: the window is often already the output size (torchvision returns it as it is)
    "whole image": lambda: [
        RandomResizedCrop(48, scale=(1.0, 1.0), ratio=(1.0, 1.0)),
        RandomHorizontalFlip(),
    ],
}


@pytest.mark.parametrize("name", list(STACKS))
def test_deferred_batches_equal_the_stacks_bit_for_bit(name, monkeypatch):
    # (index, seed) keys, as the train sampler gives
    keys = [[(i, 1000 + i) for i in range(k, k + 8)] for k in range(0, 24, 8)]
    stack = compose(STACKS[name]())
    deferred = defer_crop(stack)
    assert isinstance(deferred, DeferredCrop)
    in_place = []  # crops resized by the kernel straight into the batch
    kernel = deferred_module._AA
    monkeypatch.setattr(deferred_module, "_AA", lambda *a, **k: in_place.append(1) or kernel(*a, **k))
    ours, theirs = batches(deferred, keys), batches(stack, keys)
    native = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")  # torchvision's uint8 resize
    assert bool(in_place) == (native and name not in ("no antialias", "bicubic", "nearest"))
    for a, b in zip(ours, theirs):
        assert torch.equal(a.image, b.image) and torch.equal(a.label, b.label)
        assert a.image.stride(1) == 1  # channels-last, as the uint8 crops give
    flips = compose([RandomResizedCrop(48), RandomHorizontalFlip(p=0.5)])
    unflipped = compose([RandomResizedCrop(48), RandomHorizontalFlip(p=0.0)])
    assert not torch.equal(batches(defer_crop(flips), keys)[0].image, batches(unflipped, keys)[0].image)


def test_only_a_crop_and_flip_stack_is_deferred():
    class MyCrop(v2.RandomResizedCrop):  # a subclass may draw or crop its own way
        pass

    kept = [
        [v2.Resize(48), v2.CenterCrop(48)],
        [RandomResizedCrop(48), v2.ColorJitter(0.2)],
        [RandomResizedCrop(48), RandomHorizontalFlip(), RandomHorizontalFlip()],
        [MyCrop(48)],
        [RandomHorizontalFlip(), RandomResizedCrop(48)],
    ]
    for transforms in kept:
        stack = compose(transforms)
        assert defer_crop(stack) is stack
    assert defer_crop(None) is None


def test_a_pending_crop_stands_for_the_stacks_image():
    stack = compose([RandomResizedCrop((40, 56)), RandomHorizontalFlip()])
    image = Images()[3][0]
    torch.manual_seed(5)
    pending = defer_crop(stack)(image)
    torch.manual_seed(5)
    expected = stack(image)
    assert isinstance(pending, PendingCrop)
    assert pending.shape == expected.shape and pending.dtype == torch.uint8
    assert torch.equal(pending.materialize(), expected)
    floats = image.float()  # anything but one uint8 image: the stack's own path
    torch.manual_seed(5)
    assert isinstance(defer_crop(stack)(floats), torch.Tensor)


def test_the_datamodule_defers_only_for_the_uint8_collate(tmp_path):
    source = FolderSource(
        simple_tree(tmp_path / "data"), val_fraction=0.25, cache_dir=str(tmp_path / "cache")
    )
    stacks = TransformStacks(
        train=[RandomResizedCrop(8), RandomHorizontalFlip()], eval=[v2.Resize(8), v2.CenterCrop(8)]
    )
    dm = ImageDataModule(source, stacks, Uint8Collate(), batch_size=4)
    dm.setup("fit")
    assert isinstance(dm.datasets["train"].transform, DeferredCrop)
    assert dm.datasets["val"].transform is stacks.eval
    batch = next(iter(dm.train_dataloader()))
    assert batch.image.shape == (4, 3, 8, 8) and batch.image.dtype == torch.uint8
    dm = ImageDataModule(source, stacks, DefaultCollate(), batch_size=4)
    dm.setup("fit")
    train = dm.datasets["train"].transform  # the stack itself (its window drawn at the decode: window.py)
    assert not isinstance(train, DeferredCrop) and list(train.transforms) == list(stacks.train.transforms)


@pytest.mark.parametrize(
    "crop",
    [
        RandomResizedCrop(48),
        v2.RandomResizedCrop(20, scale=(0.3, 0.9), ratio=(0.5, 2.0)),
        RandomResizedCrop(16, scale=(0.95, 1.0), ratio=(3.0, 4.0)),  # rarely fits: the centre-crop fallback
    ],
)
def test_crop_draws_are_torchvisions(crop):
    draws = CropDraws(crop, flip_p=0.7)
    flip = v2.RandomHorizontalFlip(p=0.7)
    for seed in range(400):
        height, width = 20 + seed % 97, 20 + (seed * 7) % 131
        image = torch.zeros(3, height, width, dtype=torch.uint8)
        torch.manual_seed(seed)
        params = crop.make_params([image])
        flipped = not torch.equal(flip(torch.arange(2)[None, None]), torch.arange(2)[None, None])
        after = torch.rand(1)
        torch.manual_seed(seed)
        assert draws.box(height, width) == (params["top"], params["left"], params["height"], params["width"])
        assert draws.flip() == flipped
        assert torch.equal(torch.rand(1), after)  # the generator is left where torchvision leaves it

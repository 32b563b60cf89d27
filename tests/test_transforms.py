"""Transform presets, the channels-last crop, reduced-size JPEG decoding and worker seeding."""

from __future__ import annotations

import io

import lightning as L
import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from feedline.train import train
from feedline.transforms.crop import RandomResizedCrop
from feedline.transforms.decode import decode, jpeg_size
from feedline.transforms.reduce import minimum_size, reduction
from tests.conftest import CONF, FAST

PRESETS = sorted(p.stem for p in (CONF / "transforms").glob("*.yaml"))


def photo_jpeg(width: int, height: int, quality: int = 90) -> np.ndarray:
    from sklearn.datasets import load_sample_images

    photo = Image.fromarray(load_sample_images().images[0]).resize((width, height), Image.BICUBIC)
    buf = io.BytesIO()
    photo.save(buf, "JPEG", quality=quality)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()


@pytest.mark.parametrize("preset", PRESETS)
def test_every_transform_preset_trains(make_cfg, tree, preset):
    cfg = make_cfg(
        *FAST,
        "source=folder",
        f"source.root={tree}",
        f"transforms={preset}",
        "collate=uint8" if preset != "none" else "collate=default",
    )
    assert train(cfg)["metrics"]["train/loss"] > 0


def test_custom_stack_experiment_trains(make_cfg):
    cfg = make_cfg("experiment=custom_stack", *FAST)
    assert [t["_target_"].rsplit(".", 1)[1] for t in cfg.transforms.train] == [
        "RandomResizedCrop",
        "ColorJitter",
        "RandomRotation",
    ]
    assert train(cfg)["metrics"]["train/loss"] > 0


def test_crop_gives_torchvisions_pixels_channels_last():
    image = torch.from_numpy(
        np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    ).permute(2, 0, 1)
    ours, theirs = RandomResizedCrop(64, antialias=True), v2.RandomResizedCrop(64, antialias=True)
    for seed in range(5):
        torch.manual_seed(seed)
        a = ours(image)
        torch.manual_seed(seed)
        b = theirs(image)
        assert torch.equal(a, b)
        assert a.stride(0) == 1  # stays (H, W, C) in memory, so the uint8 collate copies whole rows


def test_jpeg_size_reads_the_frame_header():
    blob = photo_jpeg(333, 217)
    assert jpeg_size(blob) == (217, 333)
    assert jpeg_size(np.frombuffer(b"\xff\xd8\xff\xe0\x00\x02", dtype=np.uint8)) is None


def test_reduction_keeps_what_the_first_transform_needs():
    resize = minimum_size(v2.Compose([v2.Resize(256), v2.CenterCrop(224)]))
    assert reduction(resize, 1365, 2048) == 4  # 342 x 512 still has a 256 shorter side
    assert reduction(resize, 375, 500) == 1
    assert reduction(minimum_size(v2.Resize([64, 64])), 1000, 1000) == 8
    crop = minimum_size(v2.RandomResizedCrop(224))  # its smallest crop is 8% of the area
    assert reduction(crop, 1365, 2048) == 1
    assert reduction(crop, 4000, 6000) == 4
    assert minimum_size(v2.CenterCrop(224)) is None
    assert reduction(None, 4000, 6000) == 1


def test_reduced_decode_is_smaller_and_close_to_the_full_path():
    blob = photo_jpeg(2048, 1365)
    stack = v2.Compose([v2.Resize(256), v2.CenterCrop(224)])
    small, full = decode(blob, minimum_size(stack)), decode(blob)
    assert tuple(small.shape) == (3, 342, 512) and tuple(full.shape) == (3, 1365, 2048)
    a, b = stack(small).float(), stack(full).float()
    assert a.shape == b.shape == (3, 224, 224)
    psnr = 10 * torch.log10(255**2 / (a - b).pow(2).mean())
    assert psnr > 25, f"reduced decode drifted from the full decode: PSNR {psnr:.1f} dB"


def test_reduced_decode_can_be_turned_off(make_cfg, tmp_path):
    from tests.helpers import make_tree

    root = make_tree(tmp_path / "big", {"a": [], "b": []})
    for cls in ("a", "b"):
        (tmp_path / "big" / cls / "x.jpg").write_bytes(photo_jpeg(1024, 683).tobytes())
    sizes = {}
    for flag in ("true", "false"):
        cfg = make_cfg(
            *FAST,
            "source=folder",
            f"source.root={root}",
            "source.val_fraction=0",
            "transforms=none",
            f"data.reduced_decode={flag}",
            "+transforms.train=[{_target_: torchvision.transforms.v2.Resize, size: 128}]",
        )
        dm = instantiate(cfg.data)
        dm.prepare_data()
        dm.setup("fit")
        sizes[flag] = dm.datasets["train"]._decode(0)[0].shape
    assert sizes == {"true": (3, 171, 256), "false": (3, 683, 1024)}


def _first_batch(cfg, seed: int) -> torch.Tensor:
    L.seed_everything(seed, workers=True)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    return next(iter(loader)).image


def test_same_seed_same_first_batch_with_workers(make_cfg, tree):
    cfg = make_cfg(
        "source=folder",
        f"source.root={tree}",
        "transforms=imagenet",
        "data.num_workers=2",
        "data.batch_size=4",
    )
    a, b, c = _first_batch(cfg, 7), _first_batch(cfg, 7), _first_batch(cfg, 8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_workers_and_ranks_draw_different_augmentations(tmp_path):
    """One image, shown to two workers: each must crop it differently; and the datamodule's loader on
    another rank, with the same seed, must crop differently too."""
    from types import SimpleNamespace

    from lightning.pytorch.accelerators import CPUAccelerator

    from feedline.datamodules.image import ImageDataModule
    from feedline.datamodules.samples import SampleDataset
    from feedline.transforms.collate import DefaultCollate

    class Same:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.random.default_rng(0).integers(0, 256, (3, 64, 64), dtype=np.uint8), 0

        def describe(self, i):
            return f"same[{i}]"

    def first_batches(rank: int) -> list[torch.Tensor]:
        dm = ImageDataModule(
            source=SimpleNamespace(classes=["same"]), collate=DefaultCollate(), batch_size=1, num_workers=2
        )
        dm.trainer = SimpleNamespace(
            world_size=2, global_rank=rank, num_devices=2, accelerator=CPUAccelerator()
        )
        dm.datasets["train"] = SampleDataset(Same(), v2.RandomResizedCrop(32, antialias=True))
        torch.manual_seed(0)
        batches = iter(dm._loader("train", shuffle=False, drop_last=False))
        try:
            return [b[0] for b in batches]  # batch k comes from worker k % 2
        finally:  # persistent workers stopped now: left to the garbage collector, each waits out 5 s
            batches._shutdown_workers()

    rank0, rank1 = first_batches(0), first_batches(1)
    assert not torch.equal(rank0[0], rank0[1])  # two workers of one rank
    assert not torch.equal(rank0[0], rank1[0])  # worker 0 of two ranks
    assert all(torch.equal(a, b) for a, b in zip(rank0, first_batches(0)))  # and a rerun repeats them


def test_flip_gives_torchvisions_pixels_and_draws():
    from feedline.transforms.flip import RandomHorizontalFlip

    image = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)).permute(
        2, 0, 1
    )
    ours, theirs = RandomHorizontalFlip(), v2.RandomHorizontalFlip()
    flipped = 0
    for seed in range(8):
        torch.manual_seed(seed)
        a, after_ours = ours(image), torch.rand(1)
        torch.manual_seed(seed)
        b, after_theirs = theirs(image), torch.rand(1)
        assert torch.equal(a, b) and torch.equal(after_ours, after_theirs)  # same pixels, same draws
        flipped += not torch.equal(a, image)
        assert a.stride(0) == 1  # channels-last in, channels-last out
    assert 0 < flipped < 8
    boxes = tv_tensors.BoundingBoxes([[0, 0, 10, 10]], format="XYXY", canvas_size=(30, 40))
    torch.manual_seed(0)
    out = RandomHorizontalFlip(p=1.0)(image, boxes)  # several inputs: torchvision's own path
    assert out[1].tolist() == [[30, 0, 40, 10]]

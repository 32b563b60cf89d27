"""mix=mixup_cutmix: a batch transform on the device, for training batches only; the collate stays plain."""

from __future__ import annotations

import pickle

import pytest
import torch

from feedline.transforms.batch import Batch
from feedline.transforms.collate import Uint8Collate
from feedline.transforms.mix import MixupCutmix
from feedline.transforms.stacks import TransformStacks


def _batch(n: int = 8, size: int = 16, classes: int = 5) -> Batch:
    samples = [(torch.full((3, size, size), 10 * k, dtype=torch.uint8), k % classes) for k in range(n)]
    return Uint8Collate()(samples)


def test_mixup_soft_labels_sum_to_one():
    mix = MixupCutmix(mixup_alpha=0.4, cutmix_alpha=1.0, num_classes=5)
    torch.manual_seed(0)
    for _ in range(6):  # both MixUp and CutMix get drawn
        batch = _batch()
        image, label = mix(batch.image, batch.label)
        assert image.dtype == torch.float32 and label.shape == (8, 5)
        torch.testing.assert_close(label.sum(dim=1), torch.ones(8))
        assert (label >= 0).all()


def test_mixup_mixes_labels_and_prob_zero_gives_one_hot():
    batch = _batch(4, 4, classes=3)
    _, mixed = MixupCutmix(mixup_alpha=1.0, cutmix_alpha=0, num_classes=3)(batch.image, batch.label)
    assert ((mixed > 0).sum(dim=1) >= 1).all() and (mixed < 1).any()
    _, plain = MixupCutmix(prob=0.0, num_classes=3)(batch.image, batch.label)
    assert plain.tolist() == torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 0]), 3).float().tolist()


def test_mix_runs_after_the_batch_stack_and_only_when_training():
    stacks = TransformStacks(
        batch=[lambda x: x.float() / 255], mix=MixupCutmix(mixup_alpha=1.0, cutmix_alpha=0, num_classes=5)
    )
    batch = _batch()
    image, label = stacks.on_device(batch.image, batch.label, training=False)
    assert torch.equal(label, batch.label) and torch.equal(image, batch.image.float() / 255)
    torch.manual_seed(0)
    image, label = stacks.on_device(batch.image, batch.label, training=True)
    assert label.shape == (8, 5) and not torch.equal(image, batch.image.float() / 255)


def test_the_datamodule_gives_mix_its_class_count(make_cfg, tree):
    from feedline.cli.instantiate import instantiate

    cfg = make_cfg("source=folder", f"source.root={tree}", "mix=mixup_cutmix", "data.num_workers=0")
    dm = instantiate(cfg.data, "data")
    batch = dm.device_batch(_batch(6, 8, classes=3), training=True)
    assert dm.transforms.mix.num_classes == 3 and batch.label.shape == (6, 3)


def test_mix_config_errors_name_the_key():
    with pytest.raises(ValueError, match="transforms.mix.prob"):
        MixupCutmix(prob=1.5)
    with pytest.raises(ValueError, match="mixup_alpha or transforms.mix.cutmix_alpha"):
        MixupCutmix(mixup_alpha=0, cutmix_alpha=0)


def test_mix_pickles_for_spawn_workers():
    mix = MixupCutmix(num_classes=4)
    batch = _batch(2, 4, classes=4)
    mix(batch.image, batch.label)  # builds the torchvision mixer, which is not shipped
    assert isinstance(pickle.loads(pickle.dumps(mix)), MixupCutmix)

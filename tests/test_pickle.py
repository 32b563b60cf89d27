"""Datamodules and datasets cross process boundaries: pickle round trips and spawn workers."""

from __future__ import annotations

import pickle

import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from feedline.datamodules.image import ImageDataModule
from feedline.datasets.folder.source import FolderSource
from feedline.transforms.collate import Batch, Uint8Collate
from feedline.transforms.stacks import TransformStacks


def _datamodule(tree, **kwargs):
    stacks = TransformStacks(train=[v2.Resize([16, 16])], eval=[v2.Resize([16, 16])])
    return ImageDataModule(
        FolderSource(tree, val_fraction=0.2), stacks, Uint8Collate(), batch_size=4, **kwargs
    )


def test_datamodule_and_datasets_survive_pickle(tree):
    datamodule = _datamodule(tree)
    datamodule.prepare_data()
    datamodule.setup("fit")
    clone = pickle.loads(pickle.dumps(datamodule))
    for split in ("train", "val"):
        a, b = datamodule.datasets[split], clone.datasets[split]
        assert len(a) == len(b)
        assert torch.equal(a[1][0], b[1][0]) or split == "train"  # train crops are random
        assert a.records.describe(1) == b.records.describe(1)


def test_spawn_workers_load_batches(tree):
    datamodule = _datamodule(tree, num_workers=2, multiprocessing_context="spawn", persistent_workers=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    batches = list(datamodule.train_dataloader())
    assert all(isinstance(b, Batch) and b.image.dtype == torch.uint8 for b in batches)
    assert sum(len(b.label) for b in batches) == len(datamodule.datasets["train"])


def test_dataset_pickles_small(tree):
    datamodule = _datamodule(tree)
    datamodule.setup("fit")
    assert len(pickle.dumps(datamodule.datasets["train"])) < 8 * 1024
    loader = DataLoader(datamodule.datasets["val"], batch_size=2, collate_fn=Uint8Collate())
    assert next(iter(loader)).image.shape[1:] == (3, 16, 16)

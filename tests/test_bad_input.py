"""Bad input gives an error that names the path and the config key; bad samples follow the policy."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from feedline.datamodules.samples import BadSampleError, SampleDataset
from feedline.datasets.folder import FolderSource
from feedline.train import train
from tests.conftest import FAST
from tests.helpers import make_tree


def test_missing_root_names_path_and_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"source\.root '.*trian' does not exist"):
        FolderSource(tmp_path / "trian")


def test_missing_val_root_names_its_key(tmp_path, tree):
    with pytest.raises(FileNotFoundError, match=r"source\.val_root '.*nope' does not exist"):
        FolderSource(tree, val_root=tmp_path / "nope")


def test_tree_without_class_folders(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.png").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"source\.root '.*flat' has no class folders"):
        FolderSource(tmp_path / "flat").prepare()


def test_tree_without_images(tmp_path):
    root = make_tree(tmp_path / "t", {"a": ["x.txt"], "b": ["y.csv"]})
    with pytest.raises(FileNotFoundError, match=r"Found 0 images .*source\.root.*source\.extensions"):
        FolderSource(root).prepare()


def test_class_without_images_is_named(tmp_path):
    root = make_tree(tmp_path / "t", {"a": ["1.png"], "empty": ["notes.txt"]})
    with pytest.raises(FileNotFoundError, match=r"hold no images: .*/t/empty"):
        FolderSource(root).prepare()


def test_bad_config_values_name_their_key(tree):
    with pytest.raises(ValueError, match=r"source\.val_fraction"):
        FolderSource(tree, val_fraction=1.5)
    with pytest.raises(ValueError, match=r"source\.refresh"):
        FolderSource(tree, refresh="sometimes")


@pytest.fixture
def corrupt_tree(tmp_path):
    root = make_tree(
        tmp_path / "t", {"a": [f"{i}.png" for i in range(4)], "b": [f"{i}.png" for i in range(4)]}
    )
    (tmp_path / "t" / "a" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return root


def test_corrupt_image_is_skipped_and_reported_by_path(corrupt_tree, caplog):
    records = FolderSource(corrupt_tree, val_fraction=0).split("train")
    dataset = SampleDataset(records, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING):
        images = [dataset[i][0] for i in range(len(dataset))]
    assert all(img.dtype == torch.uint8 and img.shape[0] == 3 for img in images)
    assert os.path.join(corrupt_tree, "a", "1.png") in caplog.text
    assert torch.equal(images[1], images[2])  # replaced by the next readable sample


def test_corrupt_image_raises_with_path_and_key(corrupt_tree):
    dataset = SampleDataset(FolderSource(corrupt_tree, val_fraction=0).split("train"), on_bad_sample="raise")
    with pytest.raises(BadSampleError, match=r"a/1\.png.*data\.on_bad_sample"):
        dataset[1]


def test_missing_file_during_training_is_a_bad_sample(corrupt_tree, caplog):
    records = FolderSource(corrupt_tree, val_fraction=0).split("train")
    os.remove(os.path.join(corrupt_tree, "b", "2.png"))
    with caplog.at_level(logging.WARNING):
        SampleDataset(records, on_bad_sample="skip")[6]
    assert "b/2.png" in caplog.text


def test_train_raises_on_corrupt_image_when_asked(make_cfg, corrupt_tree):
    cfg = make_cfg(
        *FAST,
        "source=folder",
        f"source.root={corrupt_tree}",
        "source.val_fraction=0",
        "data.on_bad_sample=raise",
        "data.batch_size=8",
        "transforms=digits",
    )
    with pytest.raises(BadSampleError, match=r"a/1\.png"):
        train(cfg)


def test_train_skips_corrupt_image_by_default(make_cfg, corrupt_tree):
    cfg = make_cfg(
        *FAST,
        "source=folder",
        f"source.root={corrupt_tree}",
        "source.val_fraction=0",
        "data.batch_size=8",
        "transforms=digits",
    )
    assert train(cfg)["metrics"]["train/loss"] > 0

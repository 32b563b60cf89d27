"""Every config group option composes and builds; mistakes fail at composition, naming the key."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from datamodules.image import ImageDataModule
from tests.conftest import CONF, ROOT_DIR
from utils.instantiate import instantiate, instantiate_all

OPTIONS = sorted(
    (group.name, option.stem) for group in CONF.iterdir() if group.is_dir() for option in group.glob("*.yaml")
)


def test_every_group_has_options():
    groups = {g for g, _ in OPTIONS}
    assert {
        "source",
        "transforms",
        "collate",
        "data",
        "model",
        "trainer",
        "logger",
        "callbacks",
        "paths",
        "hydra",
        "experiment",
    } <= groups


def _source_overrides(option: str, tree: str, tmp_path) -> list[str]:
    """What each source needs set before it can be built."""
    if option == "hdf5":
        path = tmp_path / "tiny.h5"
        with h5py.File(path, "w") as f:
            f["images"] = np.zeros((4, 3, 8, 8), np.float32)
            f["labels"] = np.array([0, 1, 2, 0])
        return ["source=hdf5", f"source.path={path}"]
    return [f"source={option}", f"source.root={tree}"]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_instantiates(make_cfg, tree, tmp_path, group, option):
    source = _source_overrides(option if group == "source" else "folder", tree, tmp_path)
    cfg = make_cfg(*source, *([f"{group}={option}"] if group != "source" else []))
    for key in cfg:  # every interpolation resolves
        if key != "hydra":
            OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
    if group in ("paths", "hydra"):
        return
    if group == "trainer" and option in ("gpu", "ddp") and not torch.cuda.is_available():
        pytest.skip(f"trainer={option} composes; building it needs a GPU")
    if group == "experiment":
        datamodule = instantiate(cfg.data, "data")
        assert isinstance(datamodule, ImageDataModule)
        instantiate(cfg.model, "model", num_classes=3)
        return
    if group in ("logger", "callbacks"):
        built = instantiate_all(cfg[group], group)
        assert len(built) == len([v for v in (cfg[group] or {}).values() if v is not None])
        return
    node = cfg[group]
    kwargs = {"num_classes": 3} if group == "model" else {}
    assert instantiate(node, group, **kwargs) is not None


def test_data_instantiates_the_whole_datamodule(make_cfg, tree):
    cfg = make_cfg("source=folder", f"source.root={tree}", "collate=uint8", "transforms=imagenet")
    datamodule = instantiate(cfg.data, "data")
    assert type(datamodule.source).__name__ == "FolderSource"
    assert type(datamodule.collate).__name__ == "Uint8Collate"
    assert datamodule.transforms.batch is not None
    assert datamodule.classes == ["cat", "dog", "eel"]


def test_unknown_option_lists_the_valid_ones(make_cfg):
    with pytest.raises(MissingConfigException, match=r"(?s)Could not find 'source/nope'.*digits.*folder"):
        make_cfg("source=nope")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.batchsize=3", "batchsize"),
        ("data.batch_size=big", "batch_size"),
        ("data.on_bad_sample=ignore", "on_bad_sample"),
        ("source.roott=/x", "roott"),
    ],
)
def test_config_mistakes_fail_at_composition_naming_the_key(make_cfg, override, key):
    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(override)
    assert key in str(err.value) + str(err.value.__cause__)


def test_folder_source_without_root_says_what_to_set(make_cfg):
    cfg = make_cfg("source=folder")
    with pytest.raises(Exception, match=r"source\.root"):
        instantiate(cfg.data, "data")


@pytest.mark.slow
def test_cli_prints_config_and_lists_options():
    out = subprocess.run(
        [sys.executable, "train.py", "--cfg", "job"], cwd=ROOT_DIR, capture_output=True, text=True, check=True
    ).stdout
    assert "_target_: datamodules.image.ImageDataModule" in out and "source:" in out
    bad = subprocess.run(
        [sys.executable, "train.py", "source=nope"], cwd=ROOT_DIR, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "folder" in bad.stderr and "digits" in bad.stderr

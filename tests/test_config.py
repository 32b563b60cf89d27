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

from feedline.cli.instantiate import instantiate, instantiate_all
from feedline.datamodules.image import ImageDataModule
from tests.conftest import CONF
from tests.helpers import simple_tree

OPTIONS = sorted(
    (group.name, option.stem) for group in CONF.iterdir() if group.is_dir() for option in group.glob("*.yaml")
)


COLD_COMPOSE = """
import sys
from pathlib import Path
from hydra import compose, initialize_config_module

import feedline.conf
conf = Path(feedline.conf.__file__).parent
groups = {g.name: sorted(p.stem for p in g.glob("*.yaml")) for g in conf.iterdir() if g.is_dir()}
composed = 0
with initialize_config_module("feedline.conf", version_base="1.3"):
    for primary in ("train", "convert", "bench"):
        base = ["out.path=/tmp/x.h5"] if primary == "convert" else []
        chosen = compose(primary, overrides=base, return_hydra_config=True).hydra.runtime.choices
        for group, options in groups.items():
            if group not in chosen or group.startswith("hydra"):
                continue
            for option in options:
                compose(primary, overrides=[*base, f"{group}={option}"])
                composed += 1
    try:
        compose("train", overrides=["data.batch_size=big"])
        raise SystemExit("a wrong type composed")
    except Exception as err:
        assert "data.batch_size" in str(err), err
print(composed, "torch" in sys.modules)
"""


def test_every_config_composes_cold_from_a_fresh_interpreter(tmp_path):
    """Nothing imported first, run from outside the checkout: Hydra finds the schemas by itself."""
    out = subprocess.run(
        [sys.executable, "-c", COLD_COMPOSE], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    composed, torch_imported = out.stdout.split()
    assert int(composed) >= len(OPTIONS) and torch_imported == "False"  # composing stays cheap


def _source_overrides(option: str, tree: str, tmp_path) -> list[str]:
    """What each source needs set before it can be built."""
    if option == "hdf5":
        path = tmp_path / "tiny.h5"
        with h5py.File(path, "w") as f:
            f["images"] = np.zeros((4, 3, 8, 8), np.float32)
            f["labels"] = np.array([0, 1, 2, 0])
        return ["source=hdf5", f"source.path={path}"]
    if option == "shards":
        from feedline.datasets.folder.source import FolderSource
        from feedline.writers.options import WriteOptions
        from feedline.writers.shards import convert_source

        path = tmp_path / "tiny-shards"
        convert_source(
            FolderSource(tree, cache_dir=tmp_path / "c"),
            WriteOptions(path=str(path), format="shards", workers=1),
        )
        return ["source=shards", f"source.path={path}"]
    if option == "mix":  # two parts from the command line, as the README shows
        return [
            "source=mix",
            "+source/parts@source.parts.base=folder",
            f"source.parts.base.source.root={tree}",
            "+source/parts@source.parts.extra=folder",
            f"source.parts.extra.source.root={simple_tree(tmp_path / 'extra')}",  # another tree: one tree twice is refused
            "source.parts.extra.weight=0.25",
        ]
    if option == "wds":
        from tests.helpers import wds_tars

        wds_tars(tmp_path / "tars")
        return ["source=wds", f"source.path={tmp_path / 'tars'}"]
    if option == "seg_folder":
        from tests.test_seg_folder import seg_tree

        return [
            "source=seg_folder",
            f"source.root={seg_tree(tmp_path / 'seg', range(2))}",
            "source.num_classes=4",
        ]
    if option == "coco":  # a tiny COCO file and its images
        from tests.test_coco import _coco, _write

        annotations = _write(tmp_path / "coco" / "train.json", _coco(tmp_path / "coco", 4))
        return [
            "source=coco",
            f"source.annotations={annotations}",
            f"source.images={tmp_path / 'coco' / 'images'}",
        ]
    if option in ("shapes", "shapes_coco"):  # generated, small
        return [f"source={option}", "source.n=8", "source.size=16"]
    if option == "manifest":  # the tree as a table: image, label
        from pathlib import Path

        rows = [f"{p.relative_to(tree)},{p.parent.name}" for p in sorted(Path(tree).glob("*/*.png"))]
        (tmp_path / "train.csv").write_text("\n".join(["image,label", *rows]) + "\n")
        return ["source=manifest", f"source.path={tmp_path / 'train.csv'}", f"source.root={tree}"]
    return [f"source={option}", f"source.root={tree}"]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_instantiates(make_cfg, tree, tmp_path, group, option):
    source = _source_overrides(option if group == "source" else "folder", tree, tmp_path)
    if group == "experiment" and option.startswith("shapes_"):  # they choose source=shapes and its target
        source = _source_overrides("shapes", tree, tmp_path)
    if (group, option) == ("experiment", "mix_demo"):
        source = []  # the experiment chooses source=mix itself (the embedded digits, twice): source=folder would
        # replace it and leave its parts nowhere to go (Key 'parts' not in 'FolderOptions')
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
    node = OmegaConf.select(cfg, "transforms.mix") if group == "mix" else cfg[group]
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
        ("source.val_fraction=abc", "source.val_fraction"),
        ("source=hdf5 source.seed=one", "source.seed"),
    ],
)
def test_config_mistakes_fail_at_composition_naming_the_key(make_cfg, override, key):
    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(*override.split())
    assert key in str(err.value) + str(err.value.__cause__)


def test_folder_source_without_root_says_what_to_set(make_cfg):
    cfg = make_cfg("source=folder")
    with pytest.raises(Exception, match=r"source\.root"):
        instantiate(cfg.data, "data")


def test_the_instantiation_log_names_the_class_built(make_cfg, tree, caplog):
    import logging

    cfg = make_cfg("source=folder", f"source.root={tree}")
    with caplog.at_level(logging.INFO, logger="feedline.cli.instantiate"):
        loaders = instantiate(cfg.data, "data", _target_="feedline.datamodules.loaders.ImageLoaders")
    assert type(loaders).__name__ == "ImageLoaders"
    assert "Instantiating data <feedline.datamodules.loaders.ImageLoaders>" in caplog.text

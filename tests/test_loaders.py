"""ImageLoaders: the datamodule's loaders without Lightning, for plain PyTorch loops and quick start-ups."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from feedline.datamodules.image import ImageDataModule
from feedline.datamodules.loaders import ImageLoaders
from feedline.datasets.folder.source import FolderSource
from feedline.transforms.collate import Uint8Collate
from feedline.transforms.crop import RandomResizedCrop
from feedline.transforms.stacks import TransformStacks
from tests.conftest import ROOT_DIR
from tests.helpers import simple_tree


def _parts(tmp_path):
    source = FolderSource(
        simple_tree(tmp_path / "data"), val_fraction=0.25, cache_dir=str(tmp_path / "cache")
    )
    return source, TransformStacks(train=[RandomResizedCrop(8)], eval=[RandomResizedCrop(8)]), Uint8Collate()


def test_loaders_give_the_datamodules_batches(tmp_path):
    plain = ImageLoaders(*_parts(tmp_path), batch_size=4, seed=3)
    lightning = ImageDataModule(*_parts(tmp_path), batch_size=4, seed=3)
    for a, b in zip(plain.train_dataloader(), lightning.train_dataloader()):
        assert torch.equal(a.image, b.image) and torch.equal(a.label, b.label)
    assert plain.config == dict(
        lightning.hparams
    )  # what rebuilds them, saved in checkpoints by the datamodule
    assert plain.config["batch_size"] == 4 and plain.config["seed"] == 3


@pytest.mark.slow
def test_loading_data_never_imports_lightning(tmp_path):
    tree = simple_tree(tmp_path / "data")
    probe = textwrap.dedent(
        f"""
        import sys
        from feedline.datamodules.loaders import ImageLoaders
        loaders = ImageLoaders(
            {{"_target_": "feedline.datasets.folder.source.FolderSource", "root": {str(tree)!r}}},
            {{"_target_": "feedline.transforms.stacks.TransformStacks",
              "train": [{{"_target_": "feedline.transforms.crop.RandomResizedCrop", "size": 8}}]}},
            {{"_target_": "feedline.transforms.collate.Uint8Collate"}},
            batch_size=4, num_workers=1,
        )
        batch = next(iter(loaders.train_dataloader()))
        print(tuple(batch.image.shape), "lightning" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT_DIR, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "False" and "(4, 3, 8, 8)" in out.stdout

    # bench.py times the same loaders: its start-up breakdown is the data layer's own
    bench = textwrap.dedent(
        f"""
        import atexit, runpy, sys
        atexit.register(lambda: print("lightning imported:", "lightning" in sys.modules))
        sys.argv = ["bench.py", "source=folder", "source.root={tree}", "bench.batches=2", "bench.warmup=0",
                    "bench.sample_items=4", "data.batch_size=4", "data.num_workers=0",
                    "paths.cache_dir={tmp_path / "cache"}", "hydra.run.dir={tmp_path / "run"}",
                    "bench.json_path={tmp_path / "bench.json"}"]
        runpy.run_path("bench.py", run_name="__main__")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", bench], cwd=ROOT_DIR, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lightning imported: False" in out.stdout and "verdict:" in out.stdout

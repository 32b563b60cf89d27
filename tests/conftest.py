from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from tests.helpers import simple_tree

ROOT_DIR = Path(__file__).resolve().parents[1]
CONF = ROOT_DIR / "conf"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def tree(tmp_path) -> str:
    return simple_tree(tmp_path / "tree")


@pytest.fixture
def make_cfg(tmp_path):
    """Compose ``conf/train.yaml`` with overrides, as ``python train.py ...`` would, outputs in tmp_path."""

    def _make(*overrides: str, config: str = "train"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(
                config,
                overrides=[
                    f"paths.output_dir={tmp_path / 'out'}",
                    f"paths.cache_dir={tmp_path / 'cache'}",
                    *overrides,
                ],
                return_hydra_config=True,
            )
        HydraConfig().set_config(cfg)
        return cfg

    yield _make
    GlobalHydra.instance().clear()


FAST = ["trainer.fast_dev_run=true", "trainer.accelerator=cpu", "data.num_workers=0", "data.batch_size=4"]

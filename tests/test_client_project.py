"""feedline as the data layer of a project of its own: its config reaches feedline's groups by search path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import simple_tree

PROJECT_CONFIG = """
defaults:
  - source: folder
  - transforms: imagenet
  - collate: uint8
  - data: default
  - _self_

hydra:
  searchpath:
    - pkg://feedline.conf
"""

PROJECT_SCRIPT = """
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfg = compose("config", overrides=sys.argv[2:])
dm = instantiate(cfg.data)
dm.prepare_data()
dm.setup("fit")
batch = next(iter(dm.train_dataloader()))
print(dm.num_classes, sorted(dm.class_to_idx.items()), tuple(batch.image.shape), dm.source.cache_dir)
"""


@pytest.mark.slow
def test_a_project_of_its_own_needs_only_the_search_path(tmp_path, monkeypatch):
    """No `paths` group in the project: the cache resolves to $FEEDLINE_CACHE_DIR by itself."""
    tree = simple_tree(tmp_path / "tree", per_class=4)
    project = tmp_path / "project"
    (project / "conf").mkdir(parents=True)
    (project / "conf" / "config.yaml").write_text(PROJECT_CONFIG)
    (project / "prepare.py").write_text(PROJECT_SCRIPT)
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "feedline-cache"))
    overrides = [f"source.root={tree}", "source.val_fraction=0.25", "data.batch_size=4", "data.num_workers=0"]
    out = subprocess.run(
        [sys.executable, "prepare.py", str(project / "conf"), *overrides],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("[")[0].strip() == "3"
    assert "('cat', 0), ('dog', 1), ('eel', 2)" in out.stdout and "(4, 3, 224, 224)" in out.stdout
    assert (tmp_path / "feedline-cache" / "folder-index").is_dir()

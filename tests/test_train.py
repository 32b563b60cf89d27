"""train(cfg) end to end, as `python train.py ...` runs it."""

from __future__ import annotations

import json
import os

import pytest

from feedline.train import train
from tests.conftest import FAST

COLLATES = sorted(p.stem for p in (__import__("tests.conftest").conftest.CONF / "collate").glob("*.yaml"))


@pytest.mark.parametrize("collate", COLLATES)
def test_fast_dev_run_on_a_generated_tree(make_cfg, tree, collate):
    cfg = make_cfg(*FAST, "source=folder", f"source.root={tree}", f"collate={collate}", "transforms=digits")
    summary = train(cfg)
    assert summary["metrics"]["train/loss"] > 0
    assert 0.0 <= summary["val_acc"] <= 1.0


def test_fast_dev_run_with_workers(make_cfg, tree):
    import time

    from feedline.diagnostics.startup import process_start

    cfg = make_cfg(*FAST, "source=folder", f"source.root={tree}", "data.num_workers=2", "transforms=imagenet")
    summary = train(cfg)
    assert summary["metrics"]["train/loss"] > 0
    # the summary says when the first batch came, counted from this process's start
    assert 0 < summary["first_batch_s"] < time.time() - process_start()


@pytest.mark.slow
def test_default_run_learns_the_digits(make_cfg, tmp_path):
    """The embedded default, as `make train` runs it: real digits, >= 0.90 validation accuracy."""
    summary = train(make_cfg())
    assert summary["val_acc"] >= 0.90
    assert summary["train_samples_per_s"] > 0
    assert len(os.listdir(tmp_path / "cache" / "digits")) == 10
    with open(tmp_path / "out" / "summary.json") as f:
        assert json.load(f)["val_acc"] == summary["val_acc"]
    assert os.path.exists(tmp_path / "out" / "checkpoints" / "last.ckpt")


@pytest.mark.slow
def test_reused_batch_buffers_train_exactly_like_fresh_ones(make_cfg, tmp_path):
    """Two workers, collate=uint8, one epoch of the digits: with buffer reuse on and off the model sees the
    same bytes, so loss and accuracy agree exactly."""
    results = []
    for reuse in ("true", "false"):
        cfg = make_cfg(
            "trainer.max_epochs=1",
            "data.num_workers=2",
            f"collate.reuse_buffers={reuse}",
            f"paths.output_dir={tmp_path / reuse}",
        )
        summary = train(cfg)
        results.append((summary["metrics"]["train/loss"], summary["val_acc"]))
    assert results[0] == results[1]

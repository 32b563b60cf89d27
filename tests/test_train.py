"""train(cfg) end to end, as `python train.py ...` runs it."""

from __future__ import annotations

import json
import logging
import os

import pytest

from feedline.train import train
from tests.conftest import FAST

# every collate but detection, which takes samples with boxes (tests/test_boxes.py) and refuses these by name
COLLATES = sorted(
    p.stem
    for p in (__import__("tests.conftest").conftest.CONF / "collate").glob("*.yaml")
    if p.stem != "detection"
)


@pytest.mark.parametrize("collate", COLLATES)
def test_fast_dev_run_on_a_generated_tree(make_cfg, tree, collate):
    cfg = make_cfg(*FAST, "source=folder", f"source.root={tree}", f"collate={collate}", "transforms=digits")
    summary = train(cfg)
    assert summary["metrics"]["train/loss"] > 0
    assert 0.0 <= summary["val_acc"] <= 1.0
    # the choices made, and no optional group that was not loaded (experiment_source@source: "None/folder")
    assert summary["choices"]["source"] == "folder" and summary["choices"]["collate"] == collate
    assert "experiment_source@source" not in summary["choices"]


def test_collate_detection_refuses_a_source_without_boxes_by_name(make_cfg, tree):
    cfg = make_cfg(*FAST, "source=folder", f"source.root={tree}", "collate=detection", "transforms=digits")
    with pytest.raises(
        TypeError, match="collate=detection stacks samples with a boxes field.*collate=default"
    ):
        train(cfg)


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


def test_a_second_run_into_a_directory_in_use_stops_at_once_naming_the_first(make_cfg, tree, tmp_path):
    from feedline.cli.run_dir import own_run_dir

    cfg = make_cfg(*FAST, "source=folder", f"source.root={tree}", "transforms=digits")
    in_use = rf"is in use by another run \(pid {os.getpid()} on "
    with own_run_dir(str(tmp_path / "out"), None), pytest.raises(BlockingIOError, match=in_use):
        train(cfg)  # a first run holds tmp_path/out
    assert not (tmp_path / "cache" / "folder-index").exists()  # refused before any work
    assert train(cfg)["metrics"]["train/loss"] > 0  # the first run has ended: the directory is free


def test_a_run_killed_while_its_forked_workers_live_on_frees_its_directory_at_once(tmp_path):
    import signal
    import subprocess
    import sys

    from feedline.cli.run_dir import own_run_dir

    out = str(tmp_path / "out")
    holder = subprocess.Popen(  # a run that forked a DataLoader worker, which outlives a kill -9 for a while
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "from feedline.cli.run_dir import own_run_dir\n"
            f"with own_run_dir({out!r}, None):\n"
            "    worker = os.fork()\n"
            "    if worker == 0:\n"
            "        time.sleep(60); os._exit(0)\n"
            "    print(worker, flush=True); time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = int(holder.stdout.readline())
    try:
        in_use = pytest.raises(BlockingIOError, match=rf"in use by another run \(pid {holder.pid} on ")
        with in_use, own_run_dir(out, "last"):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with own_run_dir(out, "last"):  # the resume: its worker still lives, and holds no share of the lock
            os.kill(worker, 0)
    finally:
        os.kill(worker, signal.SIGKILL)


def test_a_fresh_start_over_an_earlier_runs_checkpoints_is_refused(make_cfg, tree, tmp_path):
    (tmp_path / "out" / "checkpoints").mkdir(parents=True)
    (tmp_path / "out" / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run's")
    cfg = make_cfg(*FAST, "source=folder", f"source.root={tree}", "transforms=digits")
    with pytest.raises(FileExistsError, match=r"checkpoints of an earlier run .*last\.ckpt.*ckpt_path=last"):
        train(cfg)
    assert (tmp_path / "out" / "checkpoints" / "last.ckpt").read_bytes() == b"an earlier run's"
    elsewhere = make_cfg(
        *FAST, "source=folder", f"source.root={tree}", f"paths.output_dir={tmp_path / 'new'}"
    )
    assert train(elsewhere)["metrics"]["train/loss"] > 0


def two_steps(tree) -> list[str]:
    """A run of two training steps an epoch over ``tree``, one validation batch: what resume tests repeat."""
    return [
        "source=folder",
        f"source.root={tree}",
        "transforms=digits",
        "trainer.accelerator=cpu",
        "data.num_workers=0",
        "data.batch_size=4",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
    ]


def test_a_resume_into_its_own_directory_is_not_warned_that_its_checkpoints_exist(make_cfg, tree):
    import warnings

    run = two_steps(tree)
    train(make_cfg(*run, "trainer.max_epochs=1"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(make_cfg(*run, "trainer.max_epochs=2", "ckpt_path=last"))
    assert not [w for w in seen if "exists and is not empty" in str(w.message)]


def test_a_mix_declared_in_yaml_trains_and_reports_each_part(make_cfg, tree, tmp_path, caplog):
    """experiment=mix_demo with a part swapped for a folder from the command line: the summary holds what
    each part gave an epoch, and validation the accuracy of each part besides the whole."""
    cfg = make_cfg(
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",  # validation whole: every part's held-out samples
        "data.num_workers=0",
        "data.batch_size=64",
        "experiment=mix_demo",
        "source/parts@source.parts.hard=folder",  # the experiment has the part: swapped, not added
        f"source.parts.hard.source.root={tree}",
        "source.parts.hard.source.val_fraction=0.5",
        "source.parts.hard.class_map={cat: '0', dog: '1', eel: '2'}",
    )
    with caplog.at_level(logging.INFO, logger="feedline"):
        summary = train(cfg)
    assert summary["drawn_per_epoch"] == {"base": 1800, "hard": 200}
    # the train split's rows (every part's) are not what an epoch draws: the log line says both
    rows = summary["samples"]["train"]
    assert f"train split: {rows} samples in all parts; an epoch draws 2000 (source.epoch_size)" in caplog.text
    # the merged classes, as class_map left them (the tree's cat, dog, eel became the digits' 0, 1, 2)
    assert "source=mix classes (10): 0, 1, 2, 3, 4, 5, 6, 7, 8, 9" in caplog.text
    assert {"val/acc/base", "val/acc/hard"} <= set(summary["metrics"])
    with open(tmp_path / "out" / "summary.json") as f:
        assert json.load(f)["drawn_per_epoch"] == {"base": 1800, "hard": 200}


class _OpensAFile:
    """Pickles as ``open(path, "w")``: what a checkpoint from elsewhere could make ``torch.load`` run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize(
    "planted, named",
    [(lambda tmp: __import__("pathlib").PurePosixPath(tmp), "pathlib.PurePosixPath"), (None, "io.open")],
    ids=["a-path", "code-on-load"],
)
def test_a_checkpoint_holding_other_types_is_refused_by_name_and_loads_once_allowed(
    make_cfg, tree, tmp_path, planted, named
):
    import torch

    run = two_steps(tree)
    train(make_cfg(*run, "trainer.max_epochs=1"))
    last = tmp_path / "out" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)  # feedline's own: tensors and plain containers
    marker = tmp_path / "ran"
    checkpoint["planted"] = planted(tmp_path) if planted else _OpensAFile(marker)
    torch.save(checkpoint, last)
    with pytest.raises(
        ValueError, match=rf"holds {named}, which is not a tensor .* allow it: ckpt_safe_types=\[{named}\]"
    ):
        train(make_cfg(*run, "trainer.max_epochs=2", "ckpt_path=last"))
    assert not marker.exists()  # refused before anything it names ran
    if planted:  # allowed by name, it loads and the run goes on
        summary = train(
            make_cfg(*run, "trainer.max_epochs=2", "ckpt_path=last", f"ckpt_safe_types=[{named}]")
        )
        assert summary["metrics"]["train/loss"] > 0

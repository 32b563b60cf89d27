"""bench.py's picture and the README's charts: drawn from the results, not blank, with feedline's bars in them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from feedline.bench import bench
from tests.conftest import ROOT_DIR
from tests.helpers import simple_tree

FEEDLINE_RGB = (0x1F, 0x6F, 0xEB)  # the colour feedline's bars and lines are drawn in
QUICK = [
    "bench.batches=3",
    "bench.warmup=1",
    "bench.sample_items=12",
    "data.batch_size=4",
    "data.num_workers=0",
]
SLEEP = "transforms.train=[{_target_: tests.sleepy.Sleep, seconds: 0.008}]"


pytestmark = pytest.mark.usefixtures("fake_clock")  # conftest.py: bench on fake time


def assert_drawn(path) -> None:
    """A PNG with ink on it, some of it in feedline's colour (a blank or failed figure has neither)."""
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    ink = (pixels < 240).any(axis=1).mean()
    assert ink > 0.02, f"{path} is nearly blank ({ink:.1%} ink)"
    near = (np.abs(pixels.astype(int) - FEEDLINE_RGB).sum(axis=1) < 30).sum()
    assert near > 100, f"{path} has no bar or line in feedline's colour"


def bench_run(make_cfg, tmp_path, *overrides, source=None):
    source = source or ["source=folder", f"source.root={simple_tree(tmp_path / 'tree', per_class=8)}"]
    cfg = make_cfg(
        *source,
        *QUICK,
        f"bench.json_path={tmp_path / 'bench.json'}",
        f"bench.plot_path={tmp_path / 'bench.png'}",
        *overrides,
        config="bench",
    )
    return bench(cfg, show=False)


def test_bench_draws_its_result_beside_the_json(make_cfg, tmp_path):
    bench_run(make_cfg, tmp_path, "transforms=none", SLEEP)
    assert (tmp_path / "bench.json").exists()
    assert_drawn(tmp_path / "bench.png")


def test_bench_times_imagefolder_beside_feedline_when_asked(make_cfg, tmp_path):
    result = bench_run(make_cfg, tmp_path, "transforms=none", SLEEP, "bench.anchor=true")
    anchor = result["anchor"]
    assert anchor["batches"] == 3 and anchor["samples_per_s"] > 0
    assert anchor["ratio"] == pytest.approx(result["loader"]["samples_per_s"] / anchor["samples_per_s"])
    assert json.loads((tmp_path / "bench.json").read_text())["anchor"]["ratio"] == pytest.approx(
        anchor["ratio"]
    )
    assert_drawn(tmp_path / "bench.png")


def test_the_anchor_needs_class_folders(make_cfg, tmp_path):
    import h5py

    path = tmp_path / "foreign.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((16, 8, 8, 3), dtype=np.uint8)
        f["labels"] = np.arange(16) % 2
    with pytest.raises(ValueError, match="bench.anchor"):
        bench_run(
            make_cfg, tmp_path, "bench.anchor=true", SLEEP, source=["source=hdf5", f"source.path={path}"]
        )


def test_a_crop_done_in_the_collate_is_its_own_stage(make_cfg, tmp_path, monkeypatch):
    from feedline.transforms.deferred import PendingCrop
    from tests.sleepy import CLOCK

    write_into = PendingCrop.write_into

    def slow_write(self, out):
        CLOCK.advance(0.004)
        write_into(self, out)

    monkeypatch.setattr(PendingCrop, "write_into", slow_write)
    stack = "transforms.train=[{_target_: torchvision.transforms.v2.RandomResizedCrop, size: 8}]"
    result = bench_run(make_cfg, tmp_path, "transforms=none", stack, "collate=uint8")
    stages = result["breakdown"]
    assert "crop" in stages["stages_run"]
    assert stages["per_sample_s"]["crop"] == pytest.approx(0.004)
    assert stages["per_sample_s"]["collate"] == pytest.approx(0.0)  # the resizes are not counted twice


def test_without_a_deferred_crop_there_is_no_crop_stage(make_cfg, tmp_path):
    result = bench_run(make_cfg, tmp_path, "transforms=none", SLEEP, "collate=uint8")
    assert "crop" not in result["breakdown"]["stages_run"]


def test_the_readme_charts_are_drawn_from_the_benchmarks_json(tmp_path):
    done = subprocess.run(
        [sys.executable, "benchmarks/charts.py", "--out", str(tmp_path)],
        cwd=ROOT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for name in ("peers", "scaling"):
        assert_drawn(tmp_path / f"{name}.png")


def test_the_model_step_is_drawn_per_sample_of_the_batch_it_was_timed_on():
    """The step is timed on one full batch of 4; the loader's measured batches (27 samples in 7: the last
    one short) do not divide it."""
    from matplotlib.figure import Figure

    from feedline.diagnostics.drawing import _stages

    result = {
        "breakdown": {"per_sample_s": {"read": 0.001}, "stages_run": ["read"]},
        "loader": {"samples": 27, "batches": 7},
        "model": {"device": "cpu", "step_s": 0.4, "batch_size": 4},
    }
    ax = Figure().subplots()
    _stages(ax, result)
    assert max(bar.get_width() for bar in ax.patches) == pytest.approx(100.0)  # 400 ms / 4 samples


def test_the_model_step_is_drawn_per_sample_of_the_batch_it_stepped_on():
    from feedline.diagnostics.drawing import stage_bars

    result = {
        "breakdown": {"stages_run": ["decode"], "per_sample_s": {"decode": 0.001}},
        "loader": {"samples": 42, "batches": 11},  # the epoch's short last batch lowers the mean to 3.8
        "model": {"device": "cpu", "batch_size": 4, "step_s": 0.4},
    }
    names, values, _ = stage_bars(result)
    assert names[-1] == "model step (cpu)" and values[-1] == pytest.approx(100.0)


@pytest.mark.parametrize(("step_s", "scale"), [(0.4, "log"), (0.0002, "linear")])
def test_a_model_step_that_dwarfs_the_stages_is_drawn_on_a_log_scale(step_s, scale):
    from matplotlib.figure import Figure

    from feedline.diagnostics.drawing import _stages

    result = {
        "breakdown": {"stages_run": ["read", "decode"], "per_sample_s": {"read": 2e-5, "decode": 4e-4}},
        "model": {"device": "cpu", "batch_size": 4, "step_s": step_s},  # 100 ms or 0.05 ms a sample
    }
    ax = Figure().subplots()
    _stages(ax, result)
    assert ax.get_xscale() == scale  # every stage's bar visible beside the step

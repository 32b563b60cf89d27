"""The benchmarks run end to end on tiny inputs (their figures come from full-size runs, not from here)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT_DIR


def run_benchmark(script: str, tmp_path, *args: str) -> tuple[str, dict]:
    """Run ``benchmarks/<script>`` on its own tiny data; returns what it printed and its JSON."""
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        f"benchmarks/{script}",
        *args,
        "--data-dir",
        str(tmp_path / "data"),
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=ROOT_DIR, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-4000:]}"
    return done.stdout, json.loads(out.read_text())


UNITS = {"ms": 1e-3, "s": 1.0, "KiB": 1024.0, "MiB": 1024.0**2}


def _meets(row: dict, kind: str, target: str) -> bool:
    """Re-derive a target's verdict from the row: '>= 3x faster' reads the ratio, '<= 50.0 ms' the value."""
    op, amount, unit = target.split()[:3]
    assert op in (">=", "<=")
    if amount.endswith("x"):
        figure, bound = row["ratios"][kind], float(amount[:-1])
    else:
        figure, bound = row["values"][kind], float(amount) * UNITS[unit]
    return figure >= bound if op == ">=" else figure <= bound


@pytest.mark.slow
def test_index_scale_benchmark_runs_and_writes_json(tmp_path):
    printed, result = run_benchmark(
        "index_scale.py", tmp_path, "--files", "400", "--classes", "20", "--repeat", "1", "--quick"
    )
    assert "| first build |" in printed and "| setup without manifest |" in printed
    assert result["files"] == 400
    rows = {r["measure"]: r for r in result["rows"]}
    assert set(rows) == {
        "first build",
        "cached load",
        "setup without manifest",
        "RSS added",
        "pickled dataset",
        "worker memory growth / epoch",
        "spawn: first batch",
    }
    for name, row in rows.items():
        kinds = (
            {"imagefolder", "lazy_folder"}
            if name == "setup without manifest"
            else {"imagefolder", "folder", "lazy_folder"}
        )
        assert set(row["values"]) == kinds and all(v > 0 for v in row["values"].values())
    for row in rows.values():  # each verdict agrees with its own figure and target
        for kind, target in row["targets"].items():
            assert target["met"] == _meets(row, kind, target["target"]), (row["measure"], kind, target)
    assert rows["first build"]["targets"]["folder"]["target"] == ">= 3x faster"


@pytest.mark.slow
def test_throughput_benchmark_runs_every_row(tmp_path):
    printed, result = run_benchmark(
        "throughput.py", tmp_path, "--images", "64", "--batch-size", "16", "--repeat", "1"
    )
    assert "| ImageFolder (PIL classic) |" in printed
    rows = {r["row"]: r for r in result["rows"]}
    assert len(rows) == 11 and all(r["images_per_s"] > 0 for r in rows.values())
    assert rows["hdf5 (raw max_side=256) fresh buffers"]["checks"] == []  # an ablation, not a target
    assert [c["target"] for c in rows["folder"]["checks"]][0] == ">= 2.2x ImageFolder"
    assert "of 2 x 1 process" in rows["folder"]["checks"][1]["target"]
    assert rows["ImageFolder (PIL classic)"]["ratio"] == 1.0
    assert [c["target"] for c in rows["hdf5 (raw max_side=256)"]["checks"]][0] == ">= 6x ImageFolder"


@pytest.mark.slow
def test_reduced_decode_benchmark_runs_and_writes_json(tmp_path):
    printed, result = run_benchmark(
        "reduced_decode.py", tmp_path, "--images", "6", "--side", "900", "--repeat", "1"
    )
    assert "| feedline, reduced decode |" in printed
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == {
        "ImageFolder (PIL classic)",
        "feedline, full-size decode",
        "feedline, reduced decode",
    }
    assert all(r["images_per_s"] > 0 for r in rows.values())


def bench_module(name: str):
    sys.path.insert(0, str(ROOT_DIR / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_shards_verdict_says_when_cpu_was_too_short_to_measure():
    """A run whose CPU time stays under the clock's resolution prints 0.00 and blank ratios: it says why."""
    bench_shards = bench_module("shards")
    rows = [
        {"loader": "feedline folder", "cpu_ms": 0.83},
        {"loader": bench_shards.HDF5, "cpu_ms": 0.0},
        {"loader": bench_shards.SHARDS, "cpu_ms": 0.0},
        {"loader": bench_shards.ANCHOR, "cpu_ms": 0.0},
    ]
    bench_shards.ratios(rows)
    lines = bench_shards.verdict(rows)
    assert any("more --images" in line and bench_shards.SHARDS in line for line in lines), lines


def test_shards_verdict_judges_no_target_on_an_unmeasured_row():
    """shards at 0.00 ms (unmeasured) against a measured anchor is not '0.00x: met'."""
    bench_shards = bench_module("shards")
    rows = [
        {"loader": bench_shards.HDF5, "cpu_ms": 0.8},
        {"loader": bench_shards.SHARDS, "cpu_ms": 0.0},
        {"loader": bench_shards.ANCHOR, "cpu_ms": 0.9},
    ]
    bench_shards.ratios(rows)
    assert rows[1]["vs_anchor"] is None and rows[1]["vs_hdf5"] is None
    lines = bench_shards.verdict(rows)
    assert len(lines) == 1 and "more --images" in lines[0], lines


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the per-process CPU clock is Linux's")
def test_the_cpu_clock_counts_under_a_millisecond():
    """The benchmarks' CPU clock counts far below psutil's 10 ms tick, so a short run still has a CPU figure:
    readings a few hundred microseconds of work apart all differ (with ticks, most would be equal)."""
    import psutil

    cpu_clock = bench_module("cpu_clock")
    me = psutil.Process()
    readings = []
    for _ in range(10):
        sum(range(20_000))  # a few hundred microseconds of work
        readings.append(cpu_clock.process_seconds(me))
    assert all(b > a for a, b in zip(readings, readings[1:])), readings


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the per-process CPU clock is Linux's")
def test_the_cpu_clock_counts_a_worker_alive_and_after_it_is_reaped():
    """A child's CPU is in the tree's total while it runs, and stays there (reaped) once it has ended."""
    import psutil

    cpu_clock = bench_module("cpu_clock")
    me = psutil.Process()
    before = cpu_clock.tree_seconds(me, reaped=True)
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, text=True)
    try:
        child_proc = psutil.Process(child.pid)
        while cpu_clock.process_seconds(child_proc) < 0.3:  # its CPU, read from outside it
            time.sleep(0.05)
        alive = cpu_clock.tree_seconds(me, reaped=True)
    finally:
        child.communicate("\n", timeout=60)
    reaped = cpu_clock.tree_seconds(me, reaped=True)
    assert alive - before >= 0.3 and reaped - before >= 0.3 and reaped >= alive
    assert cpu_clock.tree_seconds(me) - before < 0.3  # without reaped: an ended child's CPU is gone


def test_segmentation_benchmark_measures_each_row_on_the_same_pairs(tmp_path):
    """benchmarks/segmentation.py's rows (the PIL + v2 anchor, feedline's manifest source, LitData's dict
    samples) each load image and mask batches from the same pairs and are measured as the benchmark's fresh
    processes measure them (``peers.child``, here in this process); the verdict judges feedline's ratio."""
    import argparse

    import numpy as np
    import torch
    from PIL import Image

    segmentation, peers = bench_module("segmentation"), bench_module("peers")
    args = argparse.Namespace(images=8, data_dir=str(tmp_path), batch_size=2, workers=0, batches=1)
    data = segmentation.prepare(args, list(segmentation.LOADERS))
    pairs = bench_module("segmentation_data").pairs(data["table"])
    assert len(pairs) == 8
    for image, mask in pairs:  # a palette mask of its image's size, 4 classes
        with Image.open(image) as photo, Image.open(mask) as classes:
            assert classes.mode == "P" and classes.size == photo.size
            assert 0 < np.asarray(classes).max() < 4
    args.data = json.dumps(data)
    for name, (_, _, build) in segmentation.LOADERS.items():
        images, masks = next(iter(build(data, args)))
        assert images.shape[-3:] == (3, 224, 224) and images.dtype == masks.dtype == torch.uint8, name
        assert masks.shape[-2:] == (224, 224) and masks.max() < 4 and masks.numel() * 3 == images.numel(), (
            name
        )
    runs = {name: [peers.child(name, args, segmentation.LOADERS)] for name in segmentation.LOADERS}
    rows = segmentation.summarise(runs)
    assert [row["loader"] for row in rows] == list(segmentation.LOADERS)
    assert all(row["images_per_s"] > 0 and row["cpu_ms"] > 0 for row in rows)
    ours = rows[1]["vs_anchor"]
    assert rows[0]["vs_anchor"] == 1.0 and ours == rows[1]["cpu_ms"] / rows[0]["cpu_ms"]
    met = "yes" if ours <= 0.5 else "no"
    assert segmentation.verdict(rows) == [
        f"feedline CPU per sample {ours:.2f}x the anchor's (target <= 0.50x): met: {met}"
    ]

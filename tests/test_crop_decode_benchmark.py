"""benchmarks/crop_decode.py runs end to end on tiny data (--quick) and its JSON holds what its tables say: every
row's runs, the median and min-max of them, and ratios computed from those medians. No duration is judged."""

from __future__ import annotations

import statistics

import pytest

from tests.test_benchmarks import run_benchmark

KERNEL = [
    "torchvision decode_jpeg + v2 RandomResizedCrop + flip",
    "feedline, window decode off",
    "feedline, window decode on",
]
LARGE = [
    "torchvision ImageFolder (decode_jpeg) + v2 RRC + flip, DataLoader",
    "feedline, window off, reduced off",
    "feedline, window off, reduced on",
    "feedline, window on, reduced on",
]


def check_rows(section: dict, names: list[str], window_off: str, rounds: int) -> dict:
    """Each row's median and spread are those of its runs; its ratios are the anchor's and the window-off
    row's medians over its own."""
    rows = {r["row"]: r for r in section["rows"]}
    assert list(rows) == names and section["anchor"] == names[0]
    for r in rows.values():
        assert len(r["cpu_ms_runs"]) == rounds and all(ms > 0 for ms in r["cpu_ms_runs"])
        assert r["cpu_ms"] == statistics.median(r["cpu_ms_runs"])
        assert r["cpu_ms_range"] == [min(r["cpu_ms_runs"]), max(r["cpu_ms_runs"])]
        assert r["speedup"] == pytest.approx(rows[names[0]]["cpu_ms"] / r["cpu_ms"])
        assert r["vs_window_off"] == pytest.approx(rows[window_off]["cpu_ms"] / r["cpu_ms"])
    assert rows[names[0]]["speedup"] == 1.0 and rows[window_off]["vs_window_off"] == 1.0
    return rows


@pytest.mark.slow
def test_crop_decode_benchmark_quick_run_writes_every_section(tmp_path):
    printed, result = run_benchmark("crop_decode.py", tmp_path, "--quick")
    assert "| feedline, window decode on |" in printed and "| feedline, window on, reduced on |" in printed
    machine = result["machine"]
    assert set(machine) >= {
        "cpu",
        "cores",
        "torch",
        "torchvision",
        "libjpeg_version",
        "libjpeg_loaded",
        "window_decoder_built",
    }
    rounds = result["args"]["rounds"]
    assert rounds == 1 and result["args"]["quick"]

    check_rows(result["kernel"], KERNEL, KERNEL[1], rounds)
    assert result["kernel"]["threads"] == 1 and result["kernel"]["images"] == result["args"]["images"]

    large = check_rows(result["large"], LARGE, LARGE[2], rounds)
    for r in large.values():  # CPU-ms per image: the process tree's CPU seconds over the images measured
        (run,) = r["runs"]
        assert r["cpu_ms_runs"] == [1000 * run["cpu_seconds"] / run["images"]] and run["images"] > 0
    assert result["large"]["mean_file_mb"] > 0
    target = result["large"]["target"]
    assert target["row"] == LARGE[3] and target["met"] == (large[LARGE[3]]["speedup"] >= 3.0)

    tolerance = result["tolerance"]
    if not machine["window_decoder_built"]:  # the extension was not built here: the section says so
        assert "skipped" in tolerance
        return
    draws = result["args"]["draws"]
    assert tolerance["draws"] == draws and sum(tolerance["draws_at_scale"].values()) == draws
    assert set(tolerance["scales"]) == {"2", "4", "8"}
    for denom, stats in tolerance["scales"].items():
        assert stats["draws"] == tolerance["draws_at_scale"][denom]
        if stats["draws"]:
            assert 0 <= stats["mean_abs_diff"] <= stats["max_abs_diff"] <= 255
    assert tolerance["unscaled_vs_torchvision"] == {"compared": draws, "mismatches": 0}

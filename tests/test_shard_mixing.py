"""benchmarks/shard_mixing.py: the chunk order's mixing against a global shuffle, on a tiny layout (the figures
come from the default, ImageNet-sized run in benchmarks/results/shard_mixing.json), and the default window is
what the benchmark's rule picks from that run."""

from __future__ import annotations

import json

import pytest

from feedline.datasets.options import ShardsOptions
from tests.conftest import ROOT_DIR
from tests.test_peers import benchmark

SAVED = ROOT_DIR / "benchmarks" / "results" / "shard_mixing.json"
WINDOWS = [1, 2, 4, 8]
TINY = [
    "--classes",
    "20",
    "--per-class",
    "60",
    "--per-chunk",
    "20",
    "--batch-size",
    "16",
    "--worlds",
    "1",
    "4",
]


@pytest.fixture(scope="module")
def tiny():
    """1200 samples of 20 classes in 60 chunks of 20: one class to a chunk when class-major."""
    mixing = benchmark("shard_mixing")
    result = mixing.run(mixing.parse([*TINY, "--windows", *map(str, WINDOWS)]))
    by = {(r["world"], r["window"]): r for r in result["rows"]}
    return mixing, result, by


@pytest.mark.parametrize("world", [1, 4])
def test_a_window_reads_few_chunks_and_more_with_k_a_global_shuffle_reads_them_all(tiny, world):
    mixing, result, by = tiny
    chunks, step = result["chunks"], 16 * world
    per_step = [by[world, k]["chunks_per_step"] for k in WINDOWS]
    assert per_step == sorted(per_step) and per_step[0] < per_step[-1]
    for k in WINDOWS:
        row = by[world, k]
        assert row["chunks_per_step_max"] <= row["chunk_bound"]
        assert row["resident_max"] <= row["chunk_bound"]
        if 20 * k >= step:  # a window holds a step: two windows at most
            assert row["chunk_bound"] == 2 * k
    glob = by[world, "global"]
    # a global shuffle draws nearly a chunk a sample, and holds every chunk open from start to end
    assert glob["chunks_per_step"] >= 0.9 * chunks * (1 - (1 - 1 / chunks) ** step)
    assert glob["chunks_per_step"] > per_step[-1]
    assert glob["resident_max"] == chunks


@pytest.mark.parametrize("world", [1, 4])
def test_shuffled_chunks_mix_as_well_as_a_global_shuffle_class_major_ones_do_not(tiny, world):
    mixing, result, by = tiny
    glob = by[world, "global"]["classes_per_batch"]
    for k in WINDOWS:
        assert by[world, k]["classes_vs_global"]["shuffled"] >= 0.9
    major = [by[world, k]["classes_per_batch"]["class-major"] for k in WINDOWS]
    for k, classes in zip(WINDOWS, major):  # every chunk holds one class: no more classes than chunks
        assert classes <= by[world, k]["chunks_per_step"] + 1e-9
    assert major[0] < 0.4 * glob["class-major"]
    assert major == sorted(major) and major[0] < major[-1]
    # batchmates meet again the next epoch far more often in a small window, less as it grows, until the
    # largest (8 of the 60 chunks) is within a few times a global shuffle
    again = [by[world, k]["repeat_vs_global"] for k in WINDOWS]
    assert again[0] > 3 > again[-1] and all(a > b for a, b in zip(again, again[1:]))


def test_the_benchmark_prints_its_table_and_writes_json(tmp_path, capsys):
    mixing = benchmark("shard_mixing")
    out = tmp_path / "mixing.json"
    result = mixing.main([*TINY, "--windows", "1", "4", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "| world | window |" in printed and f"default window: {mixing.pick_window(result)}" in printed
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(result["rows"]))


def test_the_default_window_is_what_the_rule_picks_from_the_saved_measurement():
    mixing = benchmark("shard_mixing")
    saved = json.loads(SAVED.read_text())
    defaults = vars(mixing.parse([]))
    assert {k: v for k, v in saved["args"].items() if k != "json"} == {
        k: v for k, v in defaults.items() if k != "json"
    }, "benchmarks/results/shard_mixing.json is not the default-size run"
    assert saved["rule"] == mixing.RULE
    assert ShardsOptions.window == mixing.pick_window(saved)

"""benchmarks/peers.py runs whichever peer loaders are installed beside feedline and reports the ratios
(a smoke test of the harness: tiny data, one round; no figure is checked, only that every row is measured)."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests.conftest import ROOT_DIR


def benchmark(name: str):
    """A script of benchmarks/, imported as its module (they import each other by their file names)."""
    sys.path.insert(0, str(ROOT_DIR / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT_DIR / "benchmarks"))


@pytest.mark.slow
def test_the_peer_benchmark_measures_every_installed_loader_against_feedline(tmp_path, capsys):
    peers = benchmark("peers")
    args = [
        "--images",
        "60",
        "--rounds",
        "1",
        "--batch-size",
        "8",
        "--data-dir",
        str(tmp_path),
        "--batches",
        "2",
    ]
    result = peers.main(args)
    measured = {row["loader"]: row for row in result["rows"]}
    expected = {n for n, (_, requirement, _) in peers.LOADERS.items() if peers.installed(requirement)}
    assert set(measured) == expected | {"feedline train.py", *peers.SCRIPTS}
    assert measured.pop("feedline train.py")["first_batch_s"] > 0  # read from train.py's own summary
    for (
        script
    ) in peers.SCRIPTS:  # the same step in a plain Lightning script: ImageFolder, feedline's datamodule
        assert measured.pop(script)["first_batch_s"] > 0, script
    for name, row in measured.items():  # tiny runs: CPU time can round to 0 at psutil's 10 ms resolution
        assert row["cpu_ms"] >= 0 and row["images_per_s"] > 0, name
        assert 0 < row["ready_s"] <= row["first_batch_s"] <= row["third_batch_s"], name  # from process start
    for ours in peers.OURS.values():
        assert measured[ours]["feedline_lead"] in (1.0, None)
    printed = capsys.readouterr().out
    assert "| feedline folder | JPEG tree |" in printed
    for name in set(peers.LOADERS) - expected:  # what is not installed is listed, with how to install it
        assert f"| {name} | {peers.LOADERS[name][0]} | not installed (" in printed


@pytest.mark.slow
def test_the_scaling_benchmark_reports_efficiency_per_worker_count(tmp_path, capsys):
    scaling = benchmark("scaling")
    args = ["--images", "60", "--rounds", "1", "--batch-size", "8", "--batches", "2", "--workers", "1,2,64"]
    result = scaling.main(
        [*args, "--loaders", "ImageFolder + PIL,feedline folder", "--data-dir", str(tmp_path)]
    )
    rows = {(r["loader"], r["workers"]): r for r in result["rows"]}
    assert set(rows) == {
        (name, n) for name in ("ImageFolder + PIL", "feedline folder") for n in (1, 2)
    }  # 64 > cores
    assert (
        rows[("feedline folder", 1)]["efficiency"] == 1.0
        and rows[("ImageFolder + PIL", 2)]["vs_imagefolder"] == 1.0
    )
    assert "efficiency vs linear" in capsys.readouterr().out


@pytest.mark.slow
def test_the_shards_benchmark_reads_the_same_images_four_ways_against_litdata_on_the_same_shards(
    tmp_path, capsys
):
    shards = benchmark("shards")
    args = [
        "--images",
        "100",
        "--rounds",
        "1",
        "--batch-size",
        "16",
        "--batches",
        "3",
        "--chunk-bytes",
        "400KB",
    ]
    result = shards.main([*args, "--data-dir", str(tmp_path)])
    rows = {row["loader"]: row for row in result["rows"]}
    assert set(rows) == set(shards.LOADERS)  # LitData is a dependency of feedline: the anchor always runs
    assert rows[shards.ANCHOR]["vs_anchor"] == 1.0 and rows[shards.HDF5]["vs_hdf5"] == 1.0
    for name, row in rows.items():
        assert row["images_per_s"] > 0 and 0 < row["first_batch_s"] <= row["third_batch_s"], name
        assert row["cpu_ms"] > 0, name  # 48 images: measured under psutil's 10 ms tick, not read as 0.00
    from feedline.datasets.shards.chunks import Chunks, dataset_dirs

    written = Chunks.of(dataset_dirs(str(tmp_path / "jpeg-100-shards-400KB")))
    assert written.total == 100 and len(written.files) > 2  # the shards both shards rows read, in chunks
    assert len(result["verdict"]) == 2  # each target stated against this run's own anchor
    printed = capsys.readouterr().out
    assert "| feedline shards | shards |" in printed and "(target <= 1.10x)" in printed


@pytest.mark.slow
def test_the_shards_benchmark_streams_the_same_shards_from_s3_cold_warm_limited_and_through_litdata(
    tmp_path, capsys
):
    shards = benchmark("shards")
    args = [
        "--images",
        "100",
        "--rounds",
        "1",
        "--batch-size",
        "16",
        "--chunk-bytes",
        "200KB",
        "--window",
        "1",
    ]
    result = shards.main([*args, "--s3", "--loaders", "feedline shards", "--data-dir", str(tmp_path)])
    rows = {row["loader"]: row for row in result["s3_rows"]}
    assert set(rows) == set(benchmark("shards_s3").ROWS)
    cold, warm, limited = (rows[n] for n in benchmark("shards_s3").ROWS[:3])
    data = sum(p.stat().st_size for p in (tmp_path / "jpeg-100-shards-200KB").glob("chunk-*"))
    assert cold["fetched"] == data and warm["fetched"] == 0  # the warm row reads the cold row's cache
    assert limited["limit"] == data // 2 and limited["fetched"] > data  # evicted, fetched again
    for row in rows.values():
        assert row["pass1_images_per_s"] > 0 and row["pass2_images_per_s"] > 0
    assert rows["feedline shards, local disk"]["fetched"] is None  # the warm rows' baseline fetches nothing
    assert all(row["peak"] > 0 for row in (cold, warm, limited))
    assert all(row["peak"] <= row["limit"] for row in (cold, warm, limited))
    assert len([line for line in result["verdict"] if "peak cache" in line]) == 3
    assert "| feedline shards, S3 limited |" in capsys.readouterr().out

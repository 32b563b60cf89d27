"""benchmarks/order_scale.py runs end to end on a 20k-sample simulation (its figures come from full-size runs)."""

from __future__ import annotations

from tests.test_benchmarks import run_benchmark

STAGES = {"source", "prepare", "setup", "loader", "resume", "first"}


def test_order_scale_measures_each_rank_and_a_resume_on_another_world(tmp_path):
    printed, result = run_benchmark("order_scale.py", tmp_path, "--quick")
    rows = result["rows"]
    assert result["equivalence"]["equal"] == {"permutation": True, "chunk windows": True}
    assert "lazy orders against their enumeration on 10,007 samples, 8 ranks: permutation equal" in printed
    assert "| to first indices (s) |" in printed
    assert {(r["kind"], r["row"].split(",")[0]) for r in rows} == {
        (kind, row)
        for kind in ("shards", "folder")
        for row in ("first start (writes the split cache)", "rank 0", "rank 7", "resume at half the epoch")
    } | {(kind, "a spawned worker of rank 7 (unpickles the train dataset)") for kind in ("shards", "folder")}
    workers = [r for r in rows if r["who"] == "worker"]
    assert all(r["stages"].keys() == {"worker"} and 0 < r["pickled_bytes"] < 100_000 for r in workers)
    assert {r["epoch_samples"] for r in workers} == {r["epoch_samples"] for r in rows if r["row"] == "rank 7"}
    for r in (r for r in rows if r["who"] != "worker"):
        assert set(r["stages"]) == STAGES and abs(r["seconds"] - sum(r["stages"].values())) < 1e-9
        assert r["peak"] >= r["imported"] > 0 and len(r["first"]) == 8
        assert r["epoch_samples"] == 18_000 if r["kind"] == "folder" else 0 < r["epoch_samples"] < 20_000
        assert all(0 <= i < r["epoch_samples"] for i in r["first"])
    for kind in ("shards", "folder"):
        own = {r["row"].split(",")[0]: r for r in rows if r["kind"] == kind}
        fresh, last, resumed = own["rank 0"], own["rank 7"], own["resume at half the epoch"]
        assert (
            fresh["first"] == own["first start (writes the split cache)"]["first"]
        )  # one order, cache or not
        assert fresh["first"] != last["first"] and fresh["first"] != resumed["first"]
        assert (
            resumed["world"] == 4 and resumed["batches"] > fresh["batches"]
        )  # a world of 4: twice the share

"""bench.py's verdict matches the run: each situation built on purpose, on fake time (no assertion depends on
the machine's load)."""

from __future__ import annotations

import pytest

from feedline.bench import bench
from feedline.diagnostics.in_force import (
    EVERY_CPU,
    FLOAT_ON_DEVICE,
    ONE_FILE,
    REDUCED_DECODE,
    UINT8_BATCHES,
    WINDOW_DECODE,
    WINDOW_DECODER,
)
from feedline.diagnostics.verdict import diagnose
from tests.helpers import simple_tree

QUICK = [
    "bench.batches=3",
    "bench.warmup=1",
    "bench.sample_items=12",
    "data.batch_size=4",
    "data.num_workers=0",
]
SLEEP = "transforms.train=[{_target_: tests.sleepy.Sleep, seconds: 0.008}]"


pytestmark = pytest.mark.usefixtures("fake_clock")  # conftest.py: bench on fake time


def run(make_cfg, tmp_path, *overrides, per_class=8, ext=".png"):
    tree = simple_tree(tmp_path / "tree", per_class=per_class, ext=ext)
    cfg = make_cfg(
        "source=folder",
        f"source.root={tree}",
        "transforms=none",
        *QUICK,
        f"bench.json_path={tmp_path / 'bench.json'}",
        "bench.plot_path=null",
        *overrides,
        config="bench",
    )
    return bench(cfg, show=False)


def test_a_model_slower_than_the_loader_is_model_bound(make_cfg, tmp_path):
    result = run(
        make_cfg,
        tmp_path,
        SLEEP,
        "bench.model_step=true",
        "model.net._target_=tests.sleepy.SlowNet",
        "+model.net.seconds=1.0",
    )
    verdict = result["verdict"]
    assert result["model"]["step_s"] == pytest.approx(1.0)
    assert verdict["verdict"] == "model-bound", verdict
    assert "keeps up" in verdict["reasons"][0]
    assert not any(
        "convert.py" in s for s in verdict["suggestions"]
    )  # no data advice when data is not the limit


def test_a_loader_slower_than_the_model_keeps_its_data_verdict(make_cfg, tmp_path):
    result = run(
        make_cfg,
        tmp_path,
        SLEEP,
        "bench.model_step=true",
        "model.net._target_=tests.sleepy.SlowNet",
        "+model.net.seconds=0.001",
    )
    assert result["verdict"]["verdict"] == "transform-bound"


def _breakdown(**share):
    return {"share": share, "end_to_end_s": 0.001, "formats": {"jpeg": 10}}


def test_advice_already_in_force_is_never_given():
    decode = _breakdown(read=0.1, decode=0.7, transform=0.1, collate=0.1)
    fresh = diagnose(decode, 1000, 1, 2)["suggestions"]
    assert any("reduced_decode" in s for s in fresh) and any("more workers" in s for s in fresh)
    done = diagnose(decode, 1000, 2, 2, done={REDUCED_DECODE, EVERY_CPU})["suggestions"]
    assert not any("reduced_decode" in s or "more workers" in s for s in done), done

    collate = _breakdown(read=0.1, decode=0.1, transform=0.1, collate=0.7)
    fresh = diagnose(collate, 1000, 1, 2)["suggestions"]
    assert any("collate=uint8" in s for s in fresh) and any("on the device" in s for s in fresh)
    done = diagnose(collate, 1000, 1, 2, done={UINT8_BATCHES, FLOAT_ON_DEVICE})["suggestions"]
    assert not any("collate=uint8" in s or "on the device" in s for s in done), done

    io = _breakdown(read=0.8, decode=0.1, transform=0.05, collate=0.05)
    assert any("convert.py" in s and "train.h5" in s for s in diagnose(io, 100, 1, 2)["suggestions"])
    assert not any("train.h5" in s for s in diagnose(io, 100, 1, 2, done={ONE_FILE})["suggestions"])


def test_shards_from_object_storage_are_not_told_to_convert_to_a_local_hdf5():
    """I/O-bound shards read from s3://: the advice is the node's chunk cache, not a local HDF5 or local disk."""
    from types import SimpleNamespace

    from feedline.diagnostics.in_force import OBJECT_STORE, SHARDS, in_force

    class ShardsSource(SimpleNamespace):  # in_force reads the source's type name and path only
        pass

    def datamodule(path):
        return SimpleNamespace(
            transforms=SimpleNamespace(train=None),
            reduced_decode=False,
            collate=None,
            source=ShardsSource(path=path),
        )

    assert OBJECT_STORE in in_force(datamodule("s3://bucket/train-shards"), 1, 2)
    assert OBJECT_STORE not in in_force(datamodule("/data/train-shards"), 1, 2)
    io = _breakdown(read=0.8, decode=0.1, transform=0.05, collate=0.05)
    remote = diagnose(io, 100, 1, 2, done={OBJECT_STORE})["suggestions"]
    assert not any("train.h5" in s or "put the data on local disk" in s for s in remote), remote
    assert any("source.cache_limit" in s for s in remote), remote
    assert not any("source.cache_limit" in s for s in diagnose(io, 100, 1, 2)["suggestions"])
    # decode-bound shards, local or in a bucket: re-encode as shards again, never "then source=hdf5"
    assert SHARDS in in_force(datamodule("s3://bucket/train-shards"), 1, 2)
    assert SHARDS in in_force(datamodule("/data/train-shards"), 1, 2)
    decode = _breakdown(read=0.05, decode=0.8, transform=0.1, collate=0.05)
    for done in ({SHARDS, OBJECT_STORE}, {SHARDS}):
        advice = diagnose(decode, 1000, 1, 2, done=done)["suggestions"]
        assert not any("source=hdf5" in s for s in advice), advice
        assert any("out.format=shards" in s and "out.max_side=256" in s for s in advice), advice
    assert any("source=hdf5" in s for s in diagnose(decode, 1000, 1, 2)["suggestions"])
    # I/O-bound shards: shrink them as shards (never out.mode=raw, which shards refuse, nor a local HDF5)
    for done in ({SHARDS, OBJECT_STORE}, {SHARDS}):
        advice = diagnose(io, 100, 1, 2, done=done)["suggestions"]
        assert not any("out.mode=raw" in s or "source=hdf5" in s for s in advice), advice
        assert any("out.format=shards" in s for s in advice), advice
    # a mix with a part in a bucket is read from object storage: the chunk cache's advice
    mix = SimpleNamespace(
        transforms=SimpleNamespace(train=None),
        reduced_decode=False,
        collate=None,
        source=SimpleNamespace(
            parts=[
                SimpleNamespace(source=SimpleNamespace(root="/data/tree")),
                SimpleNamespace(source=ShardsSource(path="s3://bucket/extra")),
            ]
        ),
    )
    assert {SHARDS, OBJECT_STORE} <= in_force(mix, 1, 2)


def test_bench_reads_what_the_pipeline_already_does(make_cfg, tmp_path):
    crop = (
        "transforms.train=[{_target_: feedline.transforms.crop.RandomResizedCrop, size: 8},"
        " {_target_: tests.sleepy.Sleep, seconds: 0.008}]"
    )
    result = run(make_cfg, tmp_path, crop, "collate=uint8", "data.reduced_decode=true")
    said = set(result["verdict"]["in_force"])
    assert {REDUCED_DECODE, UINT8_BATCHES, FLOAT_ON_DEVICE, WINDOW_DECODER, WINDOW_DECODE} <= said
    result = run(make_cfg, tmp_path, SLEEP, "collate=default", "data.reduced_decode=false")
    assert not {REDUCED_DECODE, UINT8_BATCHES, WINDOW_DECODE} & set(result["verdict"]["in_force"])
    result = run(make_cfg, tmp_path, crop, "data.window_decode=false")
    assert WINDOW_DECODE not in set(result["verdict"]["in_force"])


def test_a_decode_bound_png_tree_gets_no_jpeg_advice(make_cfg, tmp_path, monkeypatch):
    import feedline.datamodules.samples as samples
    from tests.sleepy import CLOCK

    decode = samples.SampleDataset.decode

    def slow_decode(self, payload, part=None):
        CLOCK.advance(0.01)  # large PNGs: decoding is the cost
        return decode(self, payload, part)

    monkeypatch.setattr(samples.SampleDataset, "decode", slow_decode)
    result = run(make_cfg, tmp_path, ext=".png")
    verdict = result["verdict"]
    assert verdict["verdict"] == "decode-bound"
    assert not any("reduced_decode" in s for s in verdict["suggestions"]), verdict  # JPEG-only advice
    assert "out.mode=raw" in verdict["suggestions"][0]


def test_a_sweep_on_too_few_samples_is_refused_with_what_it_needs(make_cfg, tmp_path):
    with pytest.raises(
        ValueError, match=r"bench.workers=sweep needs at least \d+ training samples .* has \d+"
    ):
        run(make_cfg, tmp_path, SLEEP, "bench.workers=sweep", per_class=4)


def test_a_sweep_is_judged_flat_only_on_workers_with_a_cpu_of_their_own():
    decode = _breakdown(read=0.03, decode=0.61, transform=0.02, collate=0.34)
    # 2 CPUs: the second worker shares a core with the training process, so 1 -> 2 workers cannot tell.
    two = diagnose(decode, 1527, 1, 2, {0: 158.0, 1: 1527.0, 2: 1394.0})
    assert two["verdict"] == "decode-bound", two
    assert not any("flat" in r for r in two["reasons"])
    # 4 CPUs: 1..3 workers each have one; the reason names the rates it compared.
    four = diagnose(decode, 330, 3, 4, {0: 200.0, 1: 310.0, 2: 320.0, 3: 330.0, 4: 290.0})
    assert four["verdict"] == "I/O-bound"
    assert "310 samples/s with 1 worker, 330 with 3" in four["reasons"][0]


def test_a_model_bound_sweep_names_the_fewest_workers_that_keep_up():
    decode = _breakdown(read=0.1, decode=0.7, transform=0.1, collate=0.1)
    # batch 4: the step takes 0.4 s (10 samples/s); the loader at 2 workers gives 1000 samples/s.
    model = {"step_s": 0.4, "loader_batch_s": 0.004, "device": "cpu"}
    swept = diagnose(decode, 1000, 2, 4, {0: 9.0, 1: 600.0, 2: 1000.0, 3: 990.0}, model)
    assert swept["verdict"] == "model-bound"
    assert not any("bench.workers=sweep" in s for s in swept["suggestions"]), swept  # it was swept
    assert any(s.startswith("data.num_workers=1 keeps up too") for s in swept["suggestions"]), swept
    unswept = diagnose(decode, 1000, 2, 4, None, model)["suggestions"]
    assert any("bench.workers=sweep shows which" in s for s in unswept)
    no_workers = diagnose(decode, 1000, 0, 4, None, model)["suggestions"]
    assert not any("fewer workers" in s for s in no_workers), no_workers


def test_a_swept_run_is_never_told_to_sweep():
    decode = _breakdown(read=0.1, decode=0.7, transform=0.1, collate=0.1)
    assert any("bench.workers=sweep" in s for s in diagnose(decode, 1000, 1, 4)["suggestions"])
    swept = diagnose(decode, 1000, 1, 4, {0: 200.0, 1: 1000.0, 2: 1900.0, 3: 2700.0})["suggestions"]
    assert not any("bench.workers=sweep" in s for s in swept), swept


def _report(**result):
    from rich.console import Console

    from feedline.diagnostics.report import print_report

    base = {
        "pipeline": "source=folder",
        "workers": 1,
        "loader": {"samples_per_s": 1000.0, "batches_per_s": 250.0},
        "mb_per_s": 20.0,
        "breakdown": {
            "items": 8,
            "stages_run": ["decode"],
            "per_sample_s": {"decode": 0.001},
            "share": {"decode": 1.0},
            "stages_sum_s": 0.001,
            "end_to_end_s": 0.001,
        },
        "verdict": {"verdict": "decode-bound", "reasons": [], "suggestions": []},
    }
    console = Console(record=True, width=120)
    print_report({**base, **result}, console)
    return console.export_text()


def test_the_report_prints_the_anchor_and_no_worker_count_already_set():
    printed = _report(
        sweep={0: 200.0, 1: 1000.0, 2: 980.0},
        recommended_workers=1,
        configured_workers=1,
        anchor={"workers": 1, "samples_per_s": 500.0, "ratio": 2.0},
    )
    assert "torchvision ImageFolder (the anchor): 500.0 samples/s with 1 worker(s)" in printed
    assert "2.00x its rate" in printed
    assert "<- recommended, as set" in printed
    assert "data.num_workers=1" not in printed  # already what the run uses
    printed = _report(sweep={0: 200.0, 1: 1000.0, 2: 980.0}, recommended_workers=1, configured_workers=2)
    assert "data.num_workers=1 (the fewest workers within 5% of the best rate)" in printed
    printed = _report(
        sweep={0: 200.0, 1: 1000.0, 2: 1980.0},
        recommended_workers=2,
        configured_workers=1,
        verdict={"verdict": "model-bound", "reasons": [], "suggestions": ["data.num_workers=1 keeps up too"]},
    )
    assert "fewest workers within 5%" not in printed  # model-bound: the fewest that keep up, not the fastest


def test_a_sweep_refused_for_too_few_samples_names_settings_that_fit():
    from feedline.bench import check_sweep_size
    from feedline.diagnostics.options import BenchOptions

    options = BenchOptions(warmup=3, sweep_batches=20)
    # the embedded digits: 1438 training samples, batch 64, 2 CPUs prefetching 2 batches each
    with pytest.raises(ValueError, match="bench.sweep_batches=15 .*, or data.batch_size=53 ") as refused:
        check_sweep_size(1438, 64, options, 2, 2)
    assert "needs at least 1728 training samples" in str(refused.value)
    with pytest.raises(
        ValueError, match=r"this train split has 54: use more data, or data.batch_size=2 "
    ) as refused:
        check_sweep_size(54, 64, options, 2, 2)  # too few for any sweep_batches at batch 64
    assert "bench.sweep_batches=" not in str(refused.value).split("use more data")[1]
    check_sweep_size(1408, 64, BenchOptions(warmup=3, sweep_batches=15), 2, 2)  # what it named fits

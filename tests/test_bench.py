"""bench.py on tiny trees: the breakdown adds up, and the verdict names what was made slow."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException

from feedline.bench import bench
from feedline.transforms.collate import Uint8Collate
from tests.conftest import ROOT_DIR
from tests.helpers import simple_tree

# transforms=none keeps the real work tiny, so the stage made slow on purpose dominates even on a busy machine.
QUICK = [
    "bench.batches=4",
    "bench.warmup=1",
    "bench.sample_items=24",
    "data.batch_size=4",
    "data.num_workers=0",
    "transforms=none",
]
SLEEP = "transforms.train=[{_target_: tests.sleepy.Sleep, seconds: 0.008}]"


pytestmark = pytest.mark.usefixtures("fake_clock")  # conftest.py: bench on fake time


def run(make_cfg, tmp_path, *overrides):
    tree = simple_tree(tmp_path / "tree", per_class=10)
    cfg = make_cfg(
        "source=folder",
        f"source.root={tree}",
        *QUICK,
        f"bench.json_path={tmp_path / 'bench.json'}",
        *overrides,
        config="bench",
    )
    return bench(cfg, show=False)


def test_breakdown_sums_to_the_total(make_cfg, tmp_path):
    result = run(make_cfg, tmp_path, SLEEP)
    stages = result["breakdown"]
    assert set(stages["per_sample_s"]) == {"read", "decode", "transform", "crop", "collate", "ipc"}
    assert "ipc" not in stages["stages_run"]  # data.num_workers=0: nothing crosses processes
    assert stages["per_sample_s"]["transform"] == pytest.approx(0.008)
    assert stages["stages_sum_s"] == pytest.approx(stages["end_to_end_s"])
    assert sum(stages["share"].values()) == pytest.approx(1.0)
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["loader"]["samples_per_s"] == pytest.approx(result["loader"]["samples_per_s"])
    assert written["mb_per_s"] > 0 and written["loader"]["batches"] == 4


def test_slow_reader_is_io_bound(make_cfg, tmp_path):
    result = run(make_cfg, tmp_path, "source._target_=tests.sleepy.SleepyFolderSource", "+source.delay=0.008")
    assert result["verdict"]["verdict"] == "I/O-bound"
    assert result["breakdown"]["share"]["read"] == pytest.approx(1.0)
    assert any("convert.py" in s for s in result["verdict"]["suggestions"])


def test_slow_transform_is_transform_bound(make_cfg, tmp_path):
    result = run(make_cfg, tmp_path, SLEEP)
    assert result["verdict"]["verdict"] == "transform-bound"
    assert result["breakdown"]["share"]["transform"] == pytest.approx(1.0)


def test_verdict_rules():
    from feedline.diagnostics.verdict import diagnose, recommend_workers

    def breakdown(**share):
        return {"share": share, "end_to_end_s": 0.001}

    assert (
        diagnose(breakdown(read=0.1, decode=0.7, transform=0.1, collate=0.1), 1000, 1, 2)["verdict"]
        == "decode-bound"
    )
    assert (
        diagnose(breakdown(read=0.1, decode=0.1, transform=0.1, collate=0.7), 1000, 1, 2)["verdict"]
        == "collate/IPC-bound"
    )
    # Two workers that could give 2000/s deliver 500/s: the main process is the bottleneck.
    ipc = diagnose(breakdown(read=0.1, decode=0.7, transform=0.1, collate=0.1), 500, 2, 2)
    assert ipc["verdict"] == "collate/IPC-bound" and any("collate=uint8" in s for s in ipc["suggestions"])
    # More workers, no more throughput: I/O-bound even when decode has the largest share.
    flat = {0: 300.0, 1: 310.0, 2: 320.0, 3: 330.0}
    assert (
        diagnose(breakdown(read=0.2, decode=0.6, transform=0.1, collate=0.1), 330, 3, 4, flat)["verdict"]
        == "I/O-bound"
    )
    shipping = breakdown(read=0.1, decode=0.2, transform=0.1, collate=0.1, ipc=0.5)
    assert diagnose(shipping, 1000, 1, 2)["verdict"] == "collate/IPC-bound"
    assert recommend_workers({0: 100.0, 1: 180.0, 2: 330.0, 3: 340.0}) == 2


def test_decode_bound_advice_fits_the_formats_measured(make_cfg, tmp_path):
    from feedline.diagnostics.in_force import WINDOW_DECODE, WINDOW_DECODER
    from feedline.diagnostics.verdict import diagnose

    measured = run(make_cfg, tmp_path, SLEEP)["breakdown"]["formats"]
    assert measured == {"png": 24}  # simple_tree writes PNGs

    def advice(formats, done=frozenset({WINDOW_DECODER, WINDOW_DECODE})):
        share = {"read": 0.1, "decode": 0.7, "transform": 0.1, "collate": 0.1}
        verdict = diagnose({"share": share, "end_to_end_s": 0.001, "formats": formats}, 1000, 1, 2, done=done)
        assert verdict["verdict"] == "decode-bound"
        return verdict["suggestions"]

    png = advice(measured, frozenset())
    assert png[0].startswith("skip decoding entirely") and not any("JPEGs decode" in s for s in png)
    assert not any("crop" in s for s in png)
    assert advice({"jpeg": 24})[0].startswith("keep data.reduced_decode=true")
    # the crop-window decoder: how to build it where it is not, how to use it where it is and the run does not
    assert "apt install" in advice({"jpeg": 24}, frozenset())[0]
    assert "data.window_decode=true" in advice({"jpeg": 24}, frozenset({WINDOW_DECODER}))[0]
    assert any("JPEGs decode" in s for s in advice({"jpeg": 20, "png": 4}))  # a mixed tree: both kinds


@pytest.mark.parametrize(
    "override, said",
    [
        ("bench.batches=0", r"bench\.batches=0 must be an integer >= 1"),
        ("bench.seconds=-1", r"bench\.seconds=-1\.0 must be a number of seconds > 0"),
        ("bench.seconds=nan", r"bench\.seconds=nan must be"),
        ("bench.sample_items=0", r"bench\.sample_items=0 must be an integer >= 1"),
        ("bench.sweep_batches=-2", r"bench\.sweep_batches=-2 must be an integer >= 1"),
        ("bench.warmup=-1", r"bench\.warmup=-1 must be an integer >= 0"),
        ("bench.workers=abc", r"bench\.workers='abc' must be an integer >= 0, 'sweep' .* or null"),
        ("bench.workers=-1", r"bench\.workers=-1 must be an integer >= 0"),
        ("bench.workers=100000", r"bench\.workers=100000 is more than 8 worker processes per CPU"),
    ],
)
def test_bench_values_out_of_range_are_refused_by_key_before_any_work(make_cfg, tmp_path, override, said):
    with pytest.raises(ValueError, match=said):
        run(make_cfg, tmp_path, override)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "bench.json").exists()  # nothing built


@pytest.mark.parametrize("override", ["bench.batches=abc", "bench.batchs=3", "bench.model_step=maybe"])
def test_bench_keys_of_the_wrong_type_or_name_fail_at_composition(make_cfg, override):
    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(override, config="bench")
    assert override.split("=")[0] in str(err.value) + str(err.value.__cause__)


def test_a_split_that_runs_out_before_the_batches_asked_for_is_said(make_cfg, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        result = run(make_cfg, tmp_path, SLEEP, "bench.batches=1000")  # 27 training samples: 7 batches of 4
    assert result["loader"]["batches"] == 6  # after one warm-up batch
    assert "ran out after 6 batch(es)" in caplog.text and "not bench.batches=1000" in caplog.text


@pytest.mark.slow
def test_bench_cli_sweeps_workers_and_times_a_model_step(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=12)
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "bench.py",
        "source=folder",
        "collate=default",  # its batches are copied into shared memory as they cross: an ipc stage
        f"source.root={tree}",
        "bench.workers=sweep",
        "bench.sweep_batches=3",
        "bench.batches=3",
        "bench.warmup=1",
        "bench.model_step=true",
        "data.batch_size=4",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"bench.json_path={out}",
    ]
    printed = subprocess.run(
        cmd, cwd=ROOT_DIR, capture_output=True, text=True, check=True, timeout=600
    ).stdout
    assert "verdict:" in printed and "worker sweep" in printed and "model step on cpu" in printed
    result = json.loads(out.read_text())
    assert set(result["sweep"]) == {str(w) for w in range(result["cpus"] + 1)}
    assert result["recommended_workers"] in range(result["cpus"] + 1)
    assert set(result["model"]) >= {"step_s", "loader_batch_s", "idle_share"}
    assert "ipc" in result["breakdown"]["stages_run"]  # the sweep runs workers: batches cross processes


def test_a_collate_that_reuses_shared_buffers_has_nothing_to_ship(tmp_path):
    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.folder.source import FolderSource
    from feedline.diagnostics.loader_bench import stage_breakdown

    tree = simple_tree(tmp_path / "tree", per_class=4)
    dataset = SampleDataset(FolderSource(tree, val_fraction=0, cache_dir=tmp_path / "c").split("train"), None)
    indices = list(range(8))
    reused = stage_breakdown(dataset, Uint8Collate(), indices, batch_size=4, workers=2)
    fresh = stage_breakdown(dataset, Uint8Collate(reuse_buffers=False), indices, batch_size=4, workers=2)
    assert "ipc" not in reused["stages_run"] and reused["per_sample_s"]["ipc"] == 0
    assert "ipc" in fresh["stages_run"]


def test_the_start_up_breakdown_follows_the_steps_to_the_third_batch(make_cfg, tmp_path):
    steps = run(make_cfg, tmp_path, SLEEP)["startup"]
    assert [row["step"] for row in steps] == [
        "interpreter, imports, config",
        "datamodule built",
        "prepare_data (index built or loaded)",
        "setup (splits)",
        "loader and workers started",
        "first batch",
        "third batch",
    ]
    since = [row["since_start"] for row in steps]
    assert since == sorted(since) and all(row["seconds"] >= 0 for row in steps)  # an order, not a duration


def test_the_process_start_time_is_read_from_proc():
    psutil = pytest.importorskip("psutil")
    from feedline.diagnostics.startup import process_start

    # The same instant psutil reads (a timestamp, not a duration); psutil rounds the boot time to the second.
    started = process_start()
    assert started is not None and abs(started - psutil.Process().create_time()) < 2.0


def corrupt_tree(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=10)
    (tmp_path / "tree" / "cat" / "003.png").write_bytes(b"garbage")
    return tree


def test_an_unreadable_file_is_skipped_and_named_in_the_breakdown_as_in_training(make_cfg, tmp_path, caplog):
    """The per-stage breakdown decodes each item itself: an unreadable one is left out of its timings and
    named, as training skips it, never a DecodeError that names no file."""
    cfg = make_cfg(
        "source=folder",
        f"source.root={corrupt_tree(tmp_path)}",
        *QUICK,
        SLEEP,
        "bench.sample_items=1000",  # every training sample, the bad one included
        "source.val_fraction=0",
        "data.max_bad_fraction=0.1",
        config="bench",
    )
    with caplog.at_level(logging.WARNING):
        result = bench(cfg, show=False)
    assert "cat/003.png" in caplog.text
    assert result["breakdown"]["items"] == 29 and result["breakdown"]["bad"] == 1  # 30 train samples, 1 bad


def test_an_unreadable_file_under_on_bad_sample_raise_stops_the_breakdown_naming_it(make_cfg, tmp_path):
    from feedline.datamodules.bad_samples import BadSampleError

    cfg = make_cfg(
        "source=folder",
        f"source.root={corrupt_tree(tmp_path)}",
        *QUICK,
        SLEEP,
        "bench.sample_items=1000",
        "source.val_fraction=0",
        "data.on_bad_sample=raise",
        "bench.warmup=0",
        config="bench",
    )
    with pytest.raises(BadSampleError, match=r"cat/003\.png"):
        bench(cfg, show=False)


def test_the_anchor_that_stops_at_an_unreadable_file_is_left_out_with_a_warning(make_cfg, tmp_path, caplog):
    """torchvision's ImageFolder, written as a user would, stops at a file it cannot read: bench says so and
    reports feedline's own figures."""
    cfg = make_cfg(
        "source=folder",
        f"source.root={corrupt_tree(tmp_path)}",
        *QUICK,
        SLEEP,
        "bench.batches=100",
        "source.val_fraction=0",
        "data.max_bad_fraction=0.1",
        "bench.anchor=true",
        config="bench",
    )
    with caplog.at_level(logging.WARNING):
        result = bench(cfg, show=False)
    assert result["anchor"] is None and result["loader"]["batches"] > 0
    assert "ImageFolder stopped" in caplog.text and "bench.anchor=false" in caplog.text


def test_the_anchor_is_printed_with_feedlines_rate_over_it(make_cfg, tmp_path):
    import io

    from rich.console import Console

    from feedline.diagnostics.report import print_report

    result = run(make_cfg, tmp_path, SLEEP, "bench.anchor=true")
    out = io.StringIO()
    print_report(result, Console(file=out, width=120))
    anchor = result["anchor"]
    assert (
        f"torchvision ImageFolder (the anchor): {anchor['samples_per_s']:.1f} samples/s with "
        f"{anchor['workers']} worker(s); feedline: {anchor['ratio']:.2f}x its rate" in out.getvalue()
    )


@pytest.mark.parametrize(("warmup", "size"), [(3, 16), (7, 4), (1, 32)])
def test_a_warm_up_that_leaves_no_batch_to_time_names_the_batches_and_both_keys(
    make_cfg, tmp_path, warmup, size
):
    """27 training samples: a warm-up of 3 with data.batch_size=16 (2 batches), of 7 with 4 (7 batches) or of
    1 with 32 (1 batch) leaves none, and the error says how many there are and what to set (never "0 or
    less": a negative warm-up is refused)."""
    batches = -(-27 // size)
    with pytest.raises(
        ValueError,
        match=rf"the train split has {batches} batch\(es\) of {size} \(27 samples\), and bench.warmup={warmup} "
        rf"skips {warmup}.*bench.warmup={batches - 1}.*data.batch_size",
    ) as raised:
        run(make_cfg, tmp_path, SLEEP, f"bench.warmup={warmup}", f"data.batch_size={size}")
    assert "bench.warmup=0 or less" not in str(raised.value)


class _ThreadsSeen:
    """A dataset of two blank images that records torch's intra-op thread count in each stage."""

    def __init__(self):
        self.threads = []

    def read_many(self, indices):
        return [(b"x", 0) for _ in indices]

    def __getitems__(self, indices):
        return [(self.augment(self.decode(p)), label) for p, label in self.read_many(indices)]

    def decode(self, payload):
        import torch

        self.threads.append(torch.get_num_threads())
        return torch.zeros(3, 4, 4, dtype=torch.uint8)

    def augment(self, image):
        return image


def test_the_breakdown_runs_on_one_thread_as_a_worker_does():
    import torch

    from feedline.diagnostics.loader_bench import stage_breakdown

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        dataset = _ThreadsSeen()
        stage_breakdown(dataset, Uint8Collate(), [0, 1], batch_size=2, workers=1)
        assert set(dataset.threads) == {1}  # a DataLoader worker's setting, not the main process's
        assert torch.get_num_threads() == 2  # restored
        dataset = _ThreadsSeen()
        stage_breakdown(dataset, Uint8Collate(), [0, 1], batch_size=2, workers=0)
        assert set(dataset.threads) == {2}  # no workers: the main process loads on its own threads
    finally:
        torch.set_num_threads(before)


def test_the_pipeline_names_the_preset_a_run_without_transforms_gets(make_cfg, tmp_path):
    from feedline.bench import preset_name

    assert preset_name("for_source/folder") == "imagenet" and preset_name("for_source/digits") == "digits"
    assert preset_name("cifar") == "cifar" and preset_name("for_source/mine") == "for_source/mine"
    tree = simple_tree(tmp_path / "tree", per_class=10)
    quick = [o for o in QUICK if not o.startswith("transforms=")]
    cfg = make_cfg(
        "source=folder",
        f"source.root={tree}",
        *quick,
        SLEEP,  # made slow on purpose: the fake clock advances only then
        f"bench.json_path={tmp_path / 'b.json'}",
        config="bench",
    )
    assert bench(cfg, show=False)["pipeline"].startswith("source=folder transforms=imagenet collate=uint8")


def test_a_mix_reports_each_parts_cost_and_names_the_slow_part(make_cfg, tmp_path):
    """source=mix: read, decode and transform per part; a part whose reads are slow (object storage, a
    network disk) is named as the bottleneck, in the report and in the verdict's reasons."""
    fast, slow = simple_tree(tmp_path / "fast", per_class=10), simple_tree(tmp_path / "slow", per_class=10)
    cfg = make_cfg(
        "source=mix",
        "+source/parts@source.parts.local=folder",
        f"source.parts.local.source.root={fast}",
        "+source/parts@source.parts.remote=folder",
        f"source.parts.remote.source.root={slow}",
        "source.parts.remote.source._target_=tests.sleepy.SleepyFolderSource",
        "+source.parts.remote.source.delay=0.008",
        *QUICK,
        f"bench.json_path={tmp_path / 'bench.json'}",
        config="bench",
    )
    result = bench(cfg, show=False)
    parts = result["breakdown"]["parts"]
    assert parts["slowest"] == "remote"
    assert parts["by_part"]["remote"]["per_sample_s"]["read"] == pytest.approx(0.008)
    assert parts["by_part"]["local"]["per_sample_s"]["read"] == pytest.approx(0.0)
    assert sum(row["items"] for row in parts["by_part"].values()) == result["breakdown"]["items"]
    assert any("part 'remote' of the mix is the bottleneck" in r for r in result["verdict"]["reasons"])


def test_a_one_time_first_read_is_not_charged_to_the_part_that_happens_to_be_read_first(make_cfg, tmp_path):
    """Two parts of the same data cost the same: a one-time cost of the process's first read (in bench.py the
    loader's workers read in other processes, so the breakdown's is the first) must not make whichever part
    the sample reads first the bottleneck."""
    from hydra.utils import instantiate

    from feedline.diagnostics.loader_bench import stage_breakdown
    from tests.sleepy import FirstReadRecords

    parts = []
    for name in ("a", "b"):  # two copies of one tree (a mix refuses one tree twice)
        parts += [
            f"+source/parts@source.parts.{name}=folder",
            f"source.parts.{name}.source.root={simple_tree(tmp_path / name, per_class=10)}",
            f"source.parts.{name}.source._target_=tests.sleepy.FirstReadFolderSource",
            f"+source.parts.{name}.source.delay=0.5",
        ]
    quick = [o for o in QUICK if not o.startswith("bench.")]
    datamodule = instantiate(make_cfg("source=mix", *parts, *quick, SLEEP).data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    dataset = datamodule.datasets["train"]
    FirstReadRecords.opened = False
    found = stage_breakdown(dataset, datamodule.collate, list(range(len(dataset))), batch_size=4)["parts"]
    assert found["slowest"] is None
    assert found["by_part"]["a"]["per_sample_s"]["read"] == found["by_part"]["b"]["per_sample_s"]["read"] == 0

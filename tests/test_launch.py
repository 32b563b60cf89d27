"""Launches from the command line, as users run them: DDP on CPU (ddp_sim), sweeps, SLURM config.

These run `python train.py ...` in a subprocess (Lightning's DDP launcher restarts the script once per
extra device), so they are marked slow; `make test` still runs them.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT_DIR
from tests.helpers import make_tree

N_TRAIN, N_VAL = 24, 10


def run_cli(
    *args: str, cwd=ROOT_DIR, env_extra=None, check=True, script="train.py"
) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    result = subprocess.run(
        [sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{script} {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def id_trees(tmp_path):
    """Every image its own class, so a label names the sample: train 0..23, val 0..9 (val classes a subset)."""
    train = make_tree(tmp_path / "train", {f"s{i:02d}": ["0.png"] for i in range(N_TRAIN)})
    val = make_tree(tmp_path / "val", {f"s{i:02d}": ["0.png"] for i in range(N_VAL)})
    return train, val


@pytest.mark.slow
def test_ddp_sim_sees_every_sample_once_per_epoch_and_leaves_one_output_dir(tmp_path):
    train, val = id_trees(tmp_path)
    out, probe, cache = tmp_path / "run", tmp_path / "probe", tmp_path / "cache"
    done = run_cli(
        "trainer=ddp_sim",
        "trainer.max_epochs=2",
        "source=folder",
        f"source.root={train}",
        f"source.val_root={val}",
        "transforms=digits",
        "data.global_batch_size=8",
        "data.num_workers=1",
        f"paths.cache_dir={cache}",
        f"hydra.run.dir={out}",
        "+callbacks.probe._target_=tests.probe.SampleRecorder",
        f"+callbacks.probe.dir={probe}",
    )
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2] and ranks[0]["pid"] != ranks[1]["pid"]

    # Exactly once per epoch across ranks (24 samples divide over 2 ranks: no DistributedSampler padding).
    for epoch in ("0", "1"):
        seen = ranks[0]["train"][epoch] + ranks[1]["train"][epoch]
        assert sorted(seen) == list(range(N_TRAIN)), f"epoch {epoch}: {sorted(seen)}"
        assert not set(ranks[0]["train"][epoch]) & set(ranks[1]["train"][epoch])
    assert ranks[0]["train"]["0"] != ranks[0]["train"]["1"]  # reshuffled per epoch
    # Validation covers every sample.
    assert sorted(set(ranks[0]["val"]["0"] + ranks[1]["val"]["0"])) == list(range(N_VAL))
    # data.global_batch_size=8 over 2 ranks: 4 per device.
    assert set(ranks[0]["batch_sizes"]) == set(ranks[1]["batch_sizes"]) == {4}

    # One run, one output directory: one .hydra, a log per rank, checkpoints and metrics from rank 0 only.
    assert ranks[0]["root_dir"] == ranks[1]["root_dir"] == str(out)
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".log")) == [
        "train.log",
        "train_ddp_process_1.log",
    ]
    assert (out / ".hydra" / "config.yaml").exists()
    assert not any(p.name == ".hydra" for p in out.rglob(".hydra") if p.parent != out)
    checkpoints = sorted(os.listdir(out / "checkpoints"))  # the best epoch and the last, written once
    assert (
        len(checkpoints) == 2
        and checkpoints[1] == "last.ckpt"
        and checkpoints[0] in ("epoch00.ckpt", "epoch01.ckpt")
    )
    assert len(list(out.rglob("metrics.csv"))) == 1 and (out / "summary.json").exists()
    assert not (tmp_path / "logs").exists()
    # The index was built once, by local rank 0, and mapped by the other rank.
    builds = [
        (name, line)
        for name in ("train.log", "train_ddp_process_1.log")
        for line in (out / name).read_text().splitlines()
        if "indexed" in line
    ]
    assert [name for name, _ in builds] == ["train.log", "train.log"], builds  # train root and val root
    # The console says each INFO line once (rank 0's); the other rank's are in its own log.
    assert (done.stdout + done.stderr).count("Instantiating data") == 1
    assert "Instantiating data" in (out / "train_ddp_process_1.log").read_text()


@pytest.mark.slow
def test_multirun_with_ddp_is_refused_with_what_to_do(tmp_path):
    result = run_cli(
        "-m",
        "trainer=ddp_sim",
        "trainer.max_epochs=1",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "seed=1,2",
        check=False,
    )
    assert result.returncode != 0
    assert "multirun (-m) cannot start a 2-process DDP job" in result.stderr + result.stdout
    assert "hydra/launcher=slurm" in result.stderr + result.stdout


@pytest.mark.slow
def test_backend_sweep_runs_three_jobs_over_the_same_data_and_writes_a_summary(tmp_path):
    sweep = tmp_path / "sweep"
    run_cli(
        "-m",
        "experiment=backends",
        "source=folder,lazy_folder,hdf5",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        "data.num_workers=0",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={sweep}",
    )
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["source"] for r in rows] == ["folder", "lazy_folder", "hdf5"]
    for row in rows:
        assert 0.0 < float(row["val_acc"]) <= 1.0 and float(row["samples_per_s"]) > 0
    # Same samples, same order, same seed: the three forms of the data train to the same accuracy.
    assert len({row["val_acc"] for row in rows}) == 1, rows
    assert "| source |" in (sweep / "summary.md").read_text()
    summaries = [json.loads((sweep / str(k) / "summary.json").read_text()) for k in range(3)]
    # The same validation samples in every form of the data.
    counts = {s["choices"]["source"]: s["samples"]["val"] for s in summaries}
    assert len(set(counts.values())) == 1, counts
    assert (tmp_path / "cache" / "digits.h5").exists() and (
        tmp_path / "cache" / "digits-lazy" / "0" / "0.png"
    ).exists()


@pytest.mark.slow
def test_slurm_launcher_config_ties_tasks_to_devices():
    result = run_cli(
        "--cfg", "hydra", "hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"
    )
    launcher = yaml.safe_load(result.stdout)["hydra"]["launcher"]
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert launcher["tasks_per_node"] == launcher["gpus_per_node"] == "${trainer.devices}"
    assert launcher["nodes"] == "${trainer.num_nodes}"
    # Lightning's auto-requeue listens for SIGUSR1: the job script must ask SLURM for it, not for USR2.
    from submitit.slurm.slurm import _make_sbatch_string

    script = _make_sbatch_string(
        command="python -m job",
        folder="/tmp/jobs",
        signal_delay_s=launcher["signal_delay_s"],
        additional_parameters=launcher["additional_parameters"],
    )
    assert "#SBATCH --signal=USR1@120" in script and "USR2" not in script


@pytest.mark.parametrize(("total", "world", "expected"), [(64, 1, 64), (64, 2, 32), (96, 3, 32), (8, 8, 1)])
def test_global_batch_size_divides_over_the_world(total, world, expected):
    from feedline.datamodules.knobs import per_device_batch_size

    assert per_device_batch_size(16, total, world) == expected
    assert per_device_batch_size(16, None, world) == 16  # data.batch_size is per device


@pytest.mark.parametrize(("total", "world"), [(10, 4), (3, 2), (0, 1)])
def test_global_batch_size_that_does_not_divide_is_refused(total, world):
    from feedline.datamodules.knobs import per_device_batch_size

    with pytest.raises(
        ValueError, match=rf"data.global_batch_size={total} does not divide over {world} device"
    ):
        per_device_batch_size(16, total, world)


def test_datamodule_splits_the_global_batch_by_the_trainers_world_size(make_cfg, tree):
    from types import SimpleNamespace

    from hydra.utils import instantiate

    cfg = make_cfg("source=folder", f"source.root={tree}", "data.global_batch_size=12", "data.num_workers=0")
    datamodule = instantiate(cfg.data)
    datamodule.trainer = SimpleNamespace(world_size=3, global_rank=2, num_devices=3, accelerator=None)
    assert datamodule.loader_settings()["batch_size"] == 4
    datamodule.trainer = SimpleNamespace(world_size=5, global_rank=0, num_devices=5, accelerator=None)
    with pytest.raises(ValueError, match="use a multiple of 5"):
        datamodule.loader_settings()


def test_ddp_trainer_config_builds_a_ddp_strategy(make_cfg):
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import DDPStrategy

    for name, extra in (("ddp", ["trainer.accelerator=cpu"]), ("ddp_sim", [])):
        trainer = instantiate(make_cfg(f"trainer={name}", *extra).trainer)
        assert isinstance(trainer.strategy, DDPStrategy) and trainer.num_devices == 2


def test_sweep_summary_lists_failed_jobs_and_ignores_sweeps_without_summaries(tmp_path):
    from feedline.callbacks.sweep_summary import collect, write_tables

    for job, summary in (
        (
            "0",
            {
                "val_acc": 0.5,
                "train_samples_per_s": 100.0,
                "choices": {"source": "folder"},
                "overrides": ["source=folder"],
            },
        ),
        ("1", None),
    ):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(
            f"- source={'folder' if job == '0' else 'hdf5'}\n"
        )
        if summary:
            (tmp_path / job / "summary.json").write_text(json.dumps(summary))
    rows = collect(tmp_path)
    assert [(r["job"], r["source"], r["val_acc"]) for r in rows] == [("0", "folder", 0.5), ("1", "", None)]
    assert rows[1]["overrides"] == "source=hdf5" and "the job failed" in rows[1]["output_dir"]
    assert "| 1 |  | source=hdf5 | n/a | n/a |" in write_tables(tmp_path, rows)
    (tmp_path / "0" / "summary.json").unlink()
    assert collect(tmp_path) == []


def test_sweep_summary_has_each_parts_val_accuracy_for_a_mix(tmp_path):
    from feedline.callbacks.sweep_summary import collect, write_tables

    (tmp_path / "0").mkdir()
    summary = {
        "val_acc": 0.6,
        "metrics": {"val/acc": 0.6, "val/acc/base": 0.7, "val/acc/hard": 0.25, "val/loss": 1.0},
        "drawn_per_epoch": {"base": 1800, "hard": 200},
        "choices": {"source": "mix"},
        "overrides": ["source.parts.hard.weight=0.1", "source.parts.hard.source.path=s3\\://b/ds"],
    }
    (tmp_path / "0" / "summary.json").write_text(json.dumps(summary))
    rows = collect(tmp_path)
    assert rows[0]["val_acc_by_part"] == "base 0.7000, hard 0.2500"
    # as typed, not as Hydra escapes a sweep job's values
    assert rows[0]["overrides"] == "source.parts.hard.weight=0.1 source.parts.hard.source.path=s3://b/ds"
    assert "| base 1800, hard 200 | base 0.7000, hard 0.2500 |" in write_tables(tmp_path, rows)


@pytest.mark.slow
def test_a_mix_under_ddp_sim_logs_each_parts_accuracy_without_lightnings_sync_warning(tmp_path):
    """val/acc/<part> is summed over ranks before it is logged; logging it must not make Lightning warn, on
    every rank, that an epoch-level value is not synced."""
    done = run_cli(
        "experiment=mix_demo",
        "trainer=ddp_sim",
        "trainer.max_epochs=1",
        "source.epoch_size=64",
        "data.num_workers=0",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert "sync_dist" not in done.stdout + done.stderr
    metrics = json.loads((tmp_path / "run" / "summary.json").read_text())["metrics"]
    assert {"val/acc/base", "val/acc/hard"} <= set(metrics)

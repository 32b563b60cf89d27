"""Train a model on any configured data pipeline.

python train.py                                   # the embedded digits default
python train.py source=folder source.root=/data/train transforms=imagenet
python train.py --cfg job                         # print the composed config
python train.py ... ckpt_path=last                # resume where the run stopped (mid-epoch included)
"""

from __future__ import annotations

import json
import logging
import os
import time

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from feedline.callbacks.throughput import ThroughputMonitor
from feedline.cli.checkpoints import loading_safely, resolve_ckpt_path, resuming_into_own_dir
from feedline.cli.help import register as register_help
from feedline.cli.instantiate import instantiate, instantiate_all, require, short_errors
from feedline.cli.run_dir import own_run_dir
from feedline.cli.secrets import from_command_line, hidden_overrides
from feedline.cli.trainer_keys import check_trainer_keys, trainer_arguments
from feedline.models.training import check_target

log = logging.getLogger("feedline")


def train(cfg: DictConfig) -> dict:
    """Fit ``cfg.model`` on ``cfg.data``; returns the run summary."""
    job_started = time.time()
    require(cfg, "source", "model")
    # before any work: Lightning rejects some values only mid-fit, and a misspelt key with a bare TypeError
    check_trainer_keys(cfg.trainer, trainer_arguments(cfg.trainer))
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), cfg.paths.output_dir)
    with own_run_dir(cfg.paths.output_dir, ckpt_path):  # one run at a time; no fresh start over checkpoints
        return _fit(cfg, ckpt_path, job_started)


def _fit(cfg: DictConfig, ckpt_path: str | None, job_started: float) -> dict:
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data, "data")
    datamodule.check_stages("fit")  # a missing or empty split fails here, before the model and trainer
    check_target(
        _model_class(cfg.model), datamodule
    )  # a classifier fed masks: refused now, with the model to pick
    model = instantiate(cfg.model, "model", num_classes=datamodule.num_classes)
    callbacks = instantiate_all(cfg.get("callbacks"), "callbacks")
    loggers = instantiate_all(cfg.get("logger"), "logger")
    trainer = instantiate(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False)
    check_launch(trainer)
    throughput = next((c for c in callbacks if isinstance(c, ThroughputMonitor)), None)
    in_sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if throughput is not None and in_sweep:  # a sweep's jobs share one process: time each from its own start
        throughput.started = job_started
    # a checkpoint loads tensors and plain containers only (what feedline's hold), and the types the run allows
    with resuming_into_own_dir(ckpt_path), loading_safely(ckpt_path, cfg.get("ckpt_safe_types")):
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    monitored = getattr(model, "checkpoint_monitor", None) or ("val/acc", "max")  # the model's own metric
    summary = {
        "val_acc": metrics.get("val/acc"),
        "val_metric": {"name": monitored[0], "value": metrics.get(monitored[0])},
        "train_samples_per_s": (
            round(throughput.samples_per_second, 1) if throughput and throughput.samples_per_second else None
        ),
        "first_batch_s": round(throughput.first_batch_s, 2)
        if throughput and throughput.first_batch_s
        else None,
        "first_batch_from": "job start" if in_sweep else "process start",
        "output_dir": os.path.abspath(cfg.paths.output_dir),
        "metrics": metrics,
        "samples": {split: len(dataset) for split, dataset in datamodule.datasets.items()},
        "drawn_per_epoch": datamodule.drawn(),  # source=mix: samples each part gives an epoch
        "skipped": {
            split: dataset.bad.count for split, dataset in datamodule.datasets.items() if dataset.bad
        },
        **_hydra_job(),
    }
    _report(summary)
    return summary


def _model_class(cfg):
    """The class ``cfg._target_`` names, or None where it names no importable class (its build will say)."""
    try:
        return hydra.utils.get_class(cfg.get("_target_"))
    except Exception:  # noqa: BLE001 - the model's own instantiation reports a bad target
        return None


def check_launch(trainer: L.Trainer) -> None:
    """Refuse Hydra multirun (-m) with a DDP launch that starts its own processes: Lightning restarts this
    script once per extra device with the same arguments, so every rank would start the whole sweep."""
    if trainer.world_size <= 1 or not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is not None and environment.creates_processes_externally:
        return  # SLURM (hydra/launcher=slurm), torchrun, ...: one process per device already exists
    raise RuntimeError(
        f"multirun (-m) cannot start a {trainer.world_size}-process DDP job from here: run each configuration "
        "as its own command without -m, use hydra/launcher=slurm (SLURM starts one process per "
        "device), or launch through torchrun"
    )


def _hydra_job() -> dict:
    """The job's config choices and overrides, for the sweep summary."""
    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    # an optional group named after a null choice (experiment_source@source: ${experiment}/${source} with no
    # experiment) is recorded as "None/..." although nothing was loaded
    choices = {
        k: v
        for k, v in hydra_cfg.runtime.choices.items()
        if not k.startswith("hydra") and not str(v).startswith("None/")
    }
    return {"choices": choices, "overrides": hidden_overrides(hydra_cfg.overrides.task)}


@rank_zero_only
def _report(summary: dict) -> None:
    os.makedirs(summary["output_dir"], exist_ok=True)
    with open(os.path.join(summary["output_dir"], "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    metric = summary["val_metric"]
    log.info(
        "summary: %s=%s  train samples/s=%s  first batch %s s after the %s  files skipped: %d  outputs: %s",
        "val_acc" if metric["name"] == "val/acc" else metric["name"],  # as the summary has always said it
        f"{metric['value']:.4f}" if metric["value"] is not None else "n/a",
        summary["train_samples_per_s"] if summary["train_samples_per_s"] is not None else "n/a",
        summary["first_batch_s"],
        "job started" if summary["first_batch_from"] == "job start" else "process started",
        sum(summary["skipped"].values()),
        summary["output_dir"],
    )
    skipped = {split: n for split, n in summary["skipped"].items() if n}
    if skipped:
        log.warning(
            "skipped unreadable files (each named above): %s",
            ", ".join(f"{n} in {split}" for split, n in skipped.items()),
        )


def console_for_this_rank() -> None:
    """Lightning restarts this script once per extra device of a node (``LOCAL_RANK`` set): on the console
    their INFO lines would repeat rank 0's, unlabelled (every "Instantiating ...", a resume said twice). Those
    ranks keep them in their own ``train_ddp_process_<r>.log``; their console shows warnings and errors."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(max(handler.level, logging.WARNING))


register_help()  # --help lists the config groups a user picks from, each with its line


@from_command_line  # a secret given by value moves into the environment before Hydra reads it
@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    console_for_this_rank()
    with short_errors():
        train(cfg)


if __name__ == "__main__":
    main()

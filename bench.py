"""How fast is the configured train loader, and why: throughput, a per-stage breakdown and a verdict.

python bench.py source=folder source.root=/data/train transforms=imagenet
python bench.py source=folder source.root=/data/train bench.workers=sweep
python bench.py source=hdf5 source.path=/data/train.h5 bench.model_step=true model=resnet18
"""

from __future__ import annotations

import logging
import os
import random
import re
from importlib import resources

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from feedline.cli.help import register as register_help
from feedline.cli.instantiate import instantiate, require, short_errors
from feedline.cli.secrets import from_command_line
from feedline.datamodules.epoch.train_loader import epoch_samples
from feedline.datasets.folder.scan import available_cpus
from feedline.diagnostics.anchor import anchor_root, imagefolder_loader, measure_anchor
from feedline.diagnostics.drawing import draw_bench
from feedline.diagnostics.in_force import in_force
from feedline.diagnostics.loader_bench import check_warmup, measure_loader, model_step, stage_breakdown
from feedline.diagnostics.options import SWEEP, BenchOptions
from feedline.diagnostics.report import print_report
from feedline.diagnostics.results import write_json
from feedline.diagnostics.startup import StartupClock
from feedline.diagnostics.verdict import diagnose, recommend_workers

log = logging.getLogger("feedline")


# feedline's datamodule, by its public path and where it is defined (a string compare: nothing is imported)
_DATAMODULE = ("feedline.datamodules.ImageDataModule", "feedline.datamodules.image.ImageDataModule")


def _without_lightning(data: DictConfig) -> dict:
    """feedline's datamodule is timed as its Lightning-free core (``ImageLoaders``: the same loaders), so the
    start-up breakdown is the data layer's own; a datamodule of the user's is built as configured."""
    return {"_target_": "feedline.datamodules.ImageLoaders"} if data.get("_target_") in _DATAMODULE else {}


def seed_everything(seed: int) -> None:
    """Seed ``random``, numpy and torch, and record the run's seed where the loaders look for it (as
    Lightning's ``seed_everything`` does, without importing Lightning)."""
    os.environ["PL_GLOBAL_SEED"] = str(int(seed))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def breakdown_indices(dataset, seed: int, n: int) -> list[int]:
    """The items the stage breakdown times: a seeded sample of the rows, or of a mix's epoch draw (each part
    in its share of the epoch, not of the rows: a small part of weight 0.5 is half the items)."""
    drawn = getattr(dataset.records, "drawn", None)
    if callable(drawn):
        order = dataset.records.epoch_order(seed, 0)
        at = random.Random(seed).sample(range(len(order)), min(n, len(order)))
        return [int(order[k]) for k in at]
    return random.Random(seed).sample(range(len(dataset)), min(n, len(dataset)))


def bench(cfg: DictConfig, show: bool = True) -> dict:
    """Measure ``cfg.data``'s train loader; returns (and writes to ``bench.json_path``) the result."""
    startup = StartupClock()
    require(cfg, "source")
    options = bench_options(cfg)
    seed_everything(cfg.seed)
    startup.mark("interpreter, imports, config")
    datamodule = instantiate(cfg.data, "data", **_without_lightning(cfg.data))
    startup.mark("datamodule built")
    datamodule.prepare_data()
    startup.mark("prepare_data (index built or loaded)")
    datamodule.setup("fit")
    startup.mark("setup (splits)")
    first_batches(datamodule, startup)
    dataset = datamodule.datasets["train"]
    settings = datamodule.loader_settings()
    workers, batch_size, cpus = settings["num_workers"], settings["batch_size"], available_cpus()

    check_warmup(datamodule.train_dataloader(), options.warmup)  # before the breakdown: it takes a while
    sweep_mode = options.workers == SWEEP
    if sweep_mode:
        check_sweep_size(epoch_samples(dataset), batch_size, options, cpus, datamodule.prefetch_factor)
    if options.workers is not None and not sweep_mode:
        datamodule.num_workers = workers = options.workers
    indices = breakdown_indices(dataset, cfg.seed, options.sample_items)
    # ipc is timed when batches will cross processes (workers > 0, or a sweep that includes workers)
    breakdown = stage_breakdown(
        dataset, datamodule.collate, indices, batch_size, workers=int(workers or sweep_mode)
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} batches"),
        TimeElapsedColumn(),
        disable=not show,
        transient=True,
    ) as progress:

        def run(n_workers: int, batches: int, label: str) -> dict:
            datamodule.num_workers = n_workers
            task = progress.add_task(label, total=batches if options.seconds is None else None)
            loader = datamodule.train_dataloader()
            return measure_loader(
                loader, batches, options.seconds, options.warmup, lambda n: progress.advance(task, n)
            )

        sweep = None
        if sweep_mode:
            sweep = {
                w: run(w, options.sweep_batches, f"num_workers={w}")["samples_per_s"] for w in range(cpus + 1)
            }
            workers = recommend_workers(sweep)
        loader = run(workers, options.batches, f"measuring with num_workers={workers}")
        anchor = None
        if options.anchor:
            task = progress.add_task("torchvision ImageFolder (the anchor)", total=options.batches)
            anchor_loader = imagefolder_loader(
                anchor_root(datamodule.source), datamodule.transforms.train, batch_size, workers
            )
            anchor = measure_anchor(
                anchor_loader,
                options.batches,
                options.seconds,
                options.warmup,
                lambda n: progress.advance(task, n),
            )
            if anchor is not None:
                anchor.update(workers=workers, ratio=loader["samples_per_s"] / anchor["samples_per_s"])

    result = {
        "pipeline": f"{_choices(cfg)}, {len(dataset)} samples, batch {batch_size}",
        "startup": startup.rows(),
        "workers": workers,
        "cpus": cpus,
        "loader": loader,
        "mb_per_s": loader["samples_per_s"] * breakdown["payload_bytes"] / 1e6,
        "breakdown": breakdown,
        "sweep": sweep,
        "anchor": anchor,
        "recommended_workers": recommend_workers(sweep) if sweep else None,
        "configured_workers": settings["num_workers"],  # data.num_workers as the run resolves it
    }
    if options.model_step:
        result["model"] = _model_step(cfg, datamodule, loader["samples_per_s"], batch_size)
    done = in_force(datamodule, workers, cpus)
    result["verdict"] = diagnose(
        breakdown, loader["samples_per_s"], workers, cpus, sweep, result.get("model"), done
    )
    if show:
        print_report(result)
    write_json(options.json_path, result)
    if options.plot_path:
        draw_bench(result, options.plot_path)
    log.info(
        "bench: %.1f samples/s, %s; written to %s%s",
        loader["samples_per_s"],
        result["verdict"]["verdict"],
        options.json_path,
        f", drawn in {options.plot_path}" if options.plot_path else "",
    )
    return result


def bench_options(cfg: DictConfig) -> BenchOptions:
    """``cfg.bench``, checked before any work starts: a value out of range is an error naming its key."""
    node = cfg.get("bench") or {}
    values = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    unknown = sorted(set(values) - set(BenchOptions.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'bench.{k}' for k in unknown)}: see conf/bench.yaml")
    return BenchOptions(**values).check(available_cpus())


def check_sweep_size(samples: int, batch_size: int, options, cpus: int, prefetch_factor: int | None) -> None:
    """A sweep point times ``bench.sweep_batches`` batches of one epoch after ``bench.warmup``; the batches
    that n workers prefetch come ready-made, so an epoch shorter than all of them measures start-up and
    prefetch rather than the rate (a 270-sample epoch "scales" 3.3x from one worker to two)."""
    prefetched = cpus * (prefetch_factor or 2)
    needed = (options.warmup + options.sweep_batches + prefetched) * batch_size
    if samples < needed:
        most_batches = samples // batch_size - options.warmup - prefetched
        largest_batch = samples // (options.warmup + options.sweep_batches + prefetched)
        fixes = (
            [f"bench.sweep_batches={most_batches} (the most this split gives)"] if most_batches >= 1 else []
        )
        if largest_batch >= 1:
            fixes.append(f"data.batch_size={largest_batch} (the largest that gives {options.sweep_batches})")
        raise ValueError(
            f"bench.workers=sweep needs at least {needed} training samples to measure each worker count "
            f"(bench.warmup={options.warmup} + bench.sweep_batches={options.sweep_batches} batches + the "
            f"{prefetched} that {cpus} workers prefetch, of data.batch_size={batch_size}); this train split has "
            f"{samples}: use more data" + "".join(f", or {fix}" for fix in fixes)
        )


def first_batches(datamodule, startup: StartupClock) -> None:
    """Start the train loader as training would and take three batches, marking each step."""
    loader = datamodule.train_dataloader()
    batches = iter(loader)
    startup.mark("loader and workers started")
    for n, _ in zip(range(3), batches):
        if n in (0, 2):
            startup.mark("first batch" if n == 0 else "third batch")
    del batches, loader  # its workers stop; the measurements below start their own


def _choices(cfg: DictConfig) -> str:
    if HydraConfig.initialized():
        choices = dict(HydraConfig.get().runtime.choices)
        if "transforms" in choices:
            choices["transforms"] = preset_name(choices["transforms"])
        return " ".join(
            f"{group}={choices[group]}" for group in ("source", "transforms", "collate") if group in choices
        )
    return f"source={cfg.source._target_}"


_PRESET = re.compile(r"^\s*-\s*/transforms/([\w.-]+)@_here_\s*$", re.M)


def preset_name(choice: str) -> str:
    """The transforms preset a run without ``transforms=`` gets, by the name a user would type
    (``for_source/folder`` -> ``imagenet``); any other choice as it is."""
    if not choice.startswith("for_source/"):
        return choice
    path = resources.files("feedline.conf") / "transforms" / f"{choice}.yaml"
    found = _PRESET.findall(path.read_text()) if path.is_file() else []
    return found[0] if len(found) == 1 else choice


def _model_step(cfg: DictConfig, datamodule, samples_per_s: float, batch_size: int) -> dict:
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    device = torch.device(
        "cuda" if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available() else "cpu"
    )
    model = instantiate(cfg.model, "model", num_classes=datamodule.num_classes)
    datamodule.num_workers = 0
    batch = next(iter(datamodule.train_dataloader()))
    step = model_step(model, batch, device, lambda b: datamodule.device_batch(b, training=True))
    loader_batch = batch_size / samples_per_s
    return {
        "device": str(device),
        "batch_size": len(batch[1]),  # the batch the step was timed on
        "step_s": step,
        "loader_batch_s": loader_batch,
        "covered": min(1.0, step / loader_batch),
        "idle_share": max(0.0, 1 - step / loader_batch),
    }


register_help()  # --help lists the config groups a user picks from, each with its line


@from_command_line  # a secret given by value moves into the environment before Hydra reads it
@hydra.main(version_base="1.3", config_path="conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    with short_errors():
        bench(cfg)


if __name__ == "__main__":
    main()

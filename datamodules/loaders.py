"""ImageLoaders: source + transform stacks + collate -> DataLoaders, without Lightning.

The whole data layer of ``ImageDataModule`` (``image.py``, which adds Lightning's hooks and checkpointed
hyper-parameters): a plain PyTorch loop, or another framework, uses it as it is and never imports Lightning,
so a process that only loads data starts sooner.

__init__                   builds source/transforms/collate from their config (``config`` rebuilds it)
prepare_data()             once per node: source.prepare() scans and caches
check_stages(*stages)      before a run: prepare, then build every split the stages use (errors come first)
setup(stage)               source.split() -> RecordSet -> SampleDataset
                           (fit: train+val, validate: val, test: test, predict: data.predict_root)
train_dataloader()         shuffled by (seed, epoch), split over the ranks, resumable (``datamodules/epoch/train_loader.py``)
*_dataloader()             DataLoader with the resolved loader knobs
device_batch()             the batch stack on the device (uint8 -> float, normalise), mix on training batches,
                           one memory format for every split (``device_batch.py``)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from feedline.datamodules.bad_samples import check_max_bad_fraction
from feedline.datamodules.checkpoint.parts import build, unrebuildable
from feedline.datamodules.checkpoint.trusted import check_rebuilt
from feedline.datamodules.device_batch import DeviceBatch
from feedline.datamodules.epoch.checks import (
    check_resume_mode,
)
from feedline.datamodules.epoch.sampler import Position
from feedline.datamodules.epoch.train_loader import TrainLoader
from feedline.datamodules.knobs import (
    check_batch_size,
    check_max_pixels,
    check_multiprocessing_context,
    check_prefetch_factor,
    check_seed,
    parse_memory_format,
    per_device_batch_size,
    resolve_num_workers,
    resolve_pin_memory,
)
from feedline.datamodules.options import DataConfig, OnBadSample, parse_on_bad_sample
from feedline.datamodules.predict import PredictLoader
from feedline.datamodules.sample_fields import layout_of
from feedline.datamodules.samples import SampleDataset
from feedline.datamodules.split_dataset import split_dataset
from feedline.datamodules.workers import WorkerInit
from feedline.datasets.fields import Fields, check_classes, fields_of
from feedline.datasets.paths import require_dir
from feedline.datasets.records import Source
from feedline.moved import old_names
from feedline.transforms.collate import Collate, DefaultCollate, WithParts, WithPaths
from feedline.transforms.stacks import TransformStacks

log = logging.getLogger(__name__)

_DEFAULTS = DataConfig  # the data.* defaults are written once, in the typed schema
_STAGES = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}


def check_stage_names(stages, key: str) -> tuple[str, ...]:
    if isinstance(stages, str):
        stages = [stages]
    unknown = [stage for stage in stages if stage not in _STAGES]
    if unknown:
        raise ValueError(f"{key}: unknown stage {unknown[0]!r}; the stages are {', '.join(_STAGES)}")
    return tuple(stages)


class ImageLoaders(TrainLoader, DeviceBatch):
    """``source`` + ``transforms`` + ``collate`` and the loader knobs (``data.*``, see DataConfig).

    ``source``, ``transforms`` and ``collate`` are objects, or their configs (a mapping with ``_target_``),
    which the loaders build; ``config`` holds what rebuilds them (``ImageDataModule`` saves it in checkpoints).
    """

    trainer = None  # a Lightning Trainer, when ImageDataModule runs under one

    def __init__(
        self,
        source: Source | dict[str, Any],
        transforms: TransformStacks | dict[str, Any] | None = None,
        collate: Collate | dict[str, Any] | None = None,
        batch_size: int = _DEFAULTS.batch_size,
        global_batch_size: int | None = _DEFAULTS.global_batch_size,
        num_workers: int | str = _DEFAULTS.num_workers,
        pin_memory: bool | str = _DEFAULTS.pin_memory,
        persistent_workers: bool = _DEFAULTS.persistent_workers,
        prefetch_factor: int | None = _DEFAULTS.prefetch_factor,
        on_bad_sample: str | OnBadSample = _DEFAULTS.on_bad_sample,
        max_bad_fraction: float = _DEFAULTS.max_bad_fraction,
        multiprocessing_context: str | None = _DEFAULTS.multiprocessing_context,
        drop_last: bool = _DEFAULTS.drop_last,
        reduced_decode: bool = _DEFAULTS.reduced_decode,
        window_decode: bool = _DEFAULTS.window_decode,
        max_pixels: int | None = _DEFAULTS.max_pixels,
        predict_root: str | None = _DEFAULTS.predict_root,
        memory_format: str = _DEFAULTS.memory_format,
        seed: int | None = _DEFAULTS.seed,
        resume: str = _DEFAULTS.resume,
        stages: list[str] | None = _DEFAULTS.stages,
    ):
        super().__init__()
        parts = {"source": source, "transforms": transforms, "collate": collate}
        check_rebuilt(
            parts
        )  # a checkpoint's recorded parts name only code that may run (datamodules/checkpoint/trusted.py)
        missing = unrebuildable(parts)
        if missing:
            raise ValueError(
                f"{', '.join(f'data.{k}' for k in missing)} {'was' if len(missing) == 1 else 'were'} given as "
                "Python objects that no config rebuilds when this checkpoint was written, so it holds their "
                f"description only: pass {', '.join(f'{k}=...' for k in missing)} to rebuild the datamodule"
            )
        self.source, source_config = build(source, "source")
        if self.source is None:
            raise ValueError(
                "data.source is required: pick one (source=folder source.root=...) or pass a source"
            )
        self.transforms, transforms_config = build(transforms, "transforms")
        # No stack given: images reach the model as float in 0..1 (not normalised), never as uint8.
        self.transforms = self.transforms or TransformStacks(batch=[v2.ToDtype(torch.float32, scale=True)])
        self.collate, collate_config = build(collate, "collate")
        self.collate = self.collate or DefaultCollate()
        check_batch_size(batch_size, global_batch_size)
        self.batch_size = int(batch_size)
        self.global_batch_size = global_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = bool(persistent_workers)
        self.prefetch_factor = check_prefetch_factor(prefetch_factor)
        self.on_bad_sample = parse_on_bad_sample(on_bad_sample)
        self.max_bad_fraction = check_max_bad_fraction(max_bad_fraction)
        self.multiprocessing_context = check_multiprocessing_context(multiprocessing_context)
        self.drop_last = bool(drop_last)
        self.reduced_decode = bool(reduced_decode)
        self.window_decode = bool(window_decode)
        self.max_pixels = check_max_pixels(max_pixels)
        self.predict_root = require_dir(predict_root, "data.predict_root") if predict_root else None
        self.memory_format = parse_memory_format(memory_format)
        self.seed = check_seed(seed)
        self.resume = check_resume_mode(resume)
        self._stages_ahead = check_stage_names(stages or (), "data.stages")  # built by the first setup()
        self.position = Position()  # the train loader's, in its epoch; saved through the loader's state_dict
        resolve_num_workers(num_workers)  # fail on a bad value now, not when the first loader is built
        resolve_pin_memory(pin_memory, False)
        self.datasets: dict[str, SampleDataset] = {}
        self._prepared_early = False
        self._train_digest: str | None = None  # of the train split's rows, for resume checks
        self._remember(
            {
                "source": source_config,
                "transforms": transforms_config,
                "collate": collate_config,
                "batch_size": self.batch_size,
                "global_batch_size": global_batch_size,
                "num_workers": num_workers,
                "pin_memory": pin_memory,
                "persistent_workers": self.persistent_workers,
                "prefetch_factor": self.prefetch_factor,
                "on_bad_sample": self.on_bad_sample.value,
                "max_bad_fraction": self.max_bad_fraction,
                "multiprocessing_context": multiprocessing_context,
                "drop_last": self.drop_last,
                "reduced_decode": self.reduced_decode,
                "window_decode": self.window_decode,
                "max_pixels": max_pixels,
                "predict_root": self.predict_root,
                "memory_format": memory_format,
                "seed": seed,
                "resume": self.resume,
                "stages": list(stages) if stages else None,
            }
        )

    def _remember(self, config: dict) -> None:
        """What rebuilds these loaders: the parts' configs and every knob."""
        self.config = config

    @property
    def classes(self) -> list[str]:
        return self.source.classes

    @property
    def fields(self) -> Fields:
        """What a sample holds (``datasets/fields.py``): the source's fields, or image and class."""
        return fields_of(self.source)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label, as torchvision's ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.classes)}

    def prepare_data(self) -> None:
        if self._prepared_early:  # by check_stages in this process, just before the run: once is enough
            self._prepared_early = False
            return
        self.source.prepare()

    def check_stages(self, *stages: str) -> None:
        """Build now every split that ``stages`` ("fit", "validate", "test", "predict") will use, so that a
        missing or empty one (no test split, no ``data.predict_root``) fails before any work starts, not after
        ``fit``. Runs ``prepare_data()`` first, in the calling process (the first ``prepare_data()`` after it is
        then skipped); the splits built here are the ones the run uses."""
        check_stage_names(stages, "check_stages")
        self.prepare_data()
        self._prepared_early = True
        for stage in stages:
            self.setup(stage)

    def setup(self, stage: str | None = None) -> None:
        ahead, self._stages_ahead = self._stages_ahead, ()
        for declared in ahead:  # data.stages: every split the run will use, at the first setup()
            self.setup(declared)
        self._bind_mix()
        if callable(
            getattr(self.collate, "check_fields", None)
        ):  # a collate for one kind (detection): before any batch
            self.collate.check_fields(self.fields)
        if not self.fields.is_classification:
            check_classes(self.source, self.fields)
            if hasattr(self.collate, "bind"):
                self.collate.bind(layout_of(self.fields))  # each kind of field has its own way into a batch
        for split in _STAGES.get(stage or "fit", ("train", "val")):
            if split not in self.datasets:
                self.datasets[split] = self._dataset(split)
                dataset = self.datasets[split]
                epoch = getattr(dataset.records, "epoch_samples", None) if split == "train" else None
                if callable(epoch) and getattr(dataset.records, "counts", None) is not None:
                    # source=mix: the rows are the parts' train splits together; an epoch draws another number
                    log.info(
                        "%s split: %d samples in all parts; an epoch draws %d (source.epoch_size)",
                        split,
                        len(dataset),
                        epoch(),
                    )
                else:
                    log.info("%s split: %d samples", split, len(dataset))

    def _dataset(self, split: str) -> SampleDataset:
        return split_dataset(self, split)

    def part_names(self, split: str = "val") -> list[str] | None:
        """The parts of a mix (``source=mix``) that ``split`` holds, as ``batch.part`` numbers them; None for
        any other source."""
        dataset = self.datasets.get(split)
        return list(dataset.records.names) if dataset is not None and dataset.with_parts else None

    def drawn(self) -> dict[str, int] | None:
        """A mix's samples per part per epoch (``source=mix``); None for any other source."""
        dataset = self.datasets.get("train")
        drawn = getattr(dataset.records, "drawn", None) if dataset is not None else None
        return drawn() if callable(drawn) else None

    def val_dataloader(self):
        if not len(self._split("val")):
            return []  # source.val_fraction=0 and no val_root: nothing to validate on
        return self._loader("val", shuffle=False, drop_last=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False, drop_last=False)

    def predict_dataloader(self) -> DataLoader:
        """Batches of ``data.predict_root``'s images in sorted path order; ``batch.paths`` names each."""
        return self._loader("predict", shuffle=False, drop_last=False)

    # -- knobs resolved against the world -------------------------------------------------------
    def _world(self) -> tuple[int, int, int, bool]:
        """(world size, rank, devices, on a GPU): a plain loop's; ImageDataModule asks its Trainer."""
        return 1, 0, 1, torch.cuda.is_available()  # pin when a GPU is there to copy to

    def loader_settings(self) -> dict:
        world_size, rank, devices, on_gpu = self._world()
        workers = resolve_num_workers(self.num_workers, devices)
        settings = {
            "batch_size": per_device_batch_size(self.batch_size, self.global_batch_size, world_size),
            "num_workers": workers,
            "pin_memory": resolve_pin_memory(self.pin_memory, on_gpu),
            "collate_fn": self.collate,
        }
        if workers:
            settings["persistent_workers"] = self.persistent_workers
            settings["prefetch_factor"] = self.prefetch_factor
            settings["multiprocessing_context"] = self.multiprocessing_context
            # Seeds from (loader seed, worker, rank), with or without a Trainer; the run's log files.
            settings["worker_init_fn"] = WorkerInit(rank)
        return settings

    def _split(self, split: str) -> SampleDataset:
        if split not in self.datasets:
            self.setup({"train": "fit", "val": "validate"}.get(split, split))
        return self.datasets[split]

    def _loader(self, split: str, shuffle: bool, drop_last: bool) -> DataLoader:
        dataset = self._split(split)
        dataset.share_bad_samples()
        settings = self.loader_settings()
        if split == "predict":  # batches name their files; one of unreadable files only is skipped
            settings["collate_fn"] = WithPaths(settings["collate_fn"])
            return PredictLoader(dataset, shuffle=shuffle, drop_last=drop_last, **settings)
        if dataset.with_parts:  # a mix's val/test batches say each sample's part (batch.part)
            settings["collate_fn"] = WithParts(settings["collate_fn"])
        return DataLoader(dataset, shuffle=shuffle, drop_last=drop_last, **settings)


__getattr__ = old_names(__name__)  # names that moved to another module keep working for one release

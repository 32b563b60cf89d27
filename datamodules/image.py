"""ImageDataModule: source + transform stacks + collate -> Lightning's data hooks.

prepare_data()             once per node (local rank 0): source.prepare() scans and caches
setup(stage)               every rank: source.split() -> RecordSet -> SampleDataset
*_dataloader()             DataLoader with the resolved loader knobs
on_after_batch_transfer()  the batch stack, on the device: uint8 -> float, normalise
"""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader

from feedline.datamodules.bad_samples import check_max_bad_fraction
from feedline.datamodules.knobs import (
    check_prefetch_factor,
    check_steps,
    per_device_batch_size,
    resolve_num_workers,
    resolve_pin_memory,
)
from feedline.datamodules.options import DataConfig, OnBadSample, parse_on_bad_sample
from feedline.datamodules.samples import SampleDataset
from feedline.datamodules.workers import WorkerInit
from feedline.transforms.collate import Batch, DefaultCollate
from feedline.transforms.stacks import TransformStacks

log = logging.getLogger(__name__)

_DEFAULTS = DataConfig  # the data.* defaults are written once, in the typed schema


class ImageDataModule(L.LightningDataModule):
    """``source`` + ``transforms`` + ``collate`` and the loader knobs (``data.*``, see DataConfig)."""

    def __init__(
        self,
        source,
        transforms: TransformStacks | None = None,
        collate=None,
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
        max_pixels: int | None = _DEFAULTS.max_pixels,
    ):
        super().__init__()
        self.source = source
        self.transforms = transforms or TransformStacks()
        self.collate = collate or DefaultCollate()
        self.batch_size = int(batch_size)
        self.global_batch_size = global_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = bool(persistent_workers)
        self.prefetch_factor = check_prefetch_factor(prefetch_factor)
        self.on_bad_sample = parse_on_bad_sample(on_bad_sample)
        self.max_bad_fraction = check_max_bad_fraction(max_bad_fraction)
        self.multiprocessing_context = multiprocessing_context
        self.drop_last = bool(drop_last)
        self.reduced_decode = bool(reduced_decode)
        self.max_pixels = max_pixels
        resolve_num_workers(num_workers)  # fail on a bad value now, not when the first loader is built
        resolve_pin_memory(pin_memory, False)
        self.datasets: dict[str, SampleDataset] = {}

    @property
    def classes(self) -> list[str]:
        return self.source.classes

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label, as torchvision's ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.classes)}

    def _bind_mix(self) -> None:
        if getattr(self.transforms.mix, "num_classes", 0) is None:
            self.transforms.mix.num_classes = self.num_classes  # mixup/cutmix: soft labels need the count

    def prepare_data(self) -> None:
        self.source.prepare()

    def setup(self, stage: str | None = None) -> None:
        self._bind_mix()
        wanted = {"fit": ("train", "val"), "validate": ("val",)}.get(stage or "fit", ("train", "val"))
        for split in wanted:
            if split not in self.datasets:
                transform = self.transforms.train if split == "train" else self.transforms.eval
                self.datasets[split] = SampleDataset(
                    self.source.split(split),
                    transform,
                    self.on_bad_sample,
                    self.reduced_decode,
                    self.max_pixels,
                    self.max_bad_fraction,
                )
                log.info("%s split: %d samples", split, len(self.datasets[split]))
                if split == "train" and not len(self.datasets[split]):
                    raise ValueError(
                        f"the train split of {self.source!r} is empty: lower source.val_fraction, or check the data"
                    )

    def train_dataloader(self) -> DataLoader:
        loader = self._loader("train", shuffle=True, drop_last=self.drop_last)
        check_steps(len(loader.dataset), loader.batch_size, self._world()[0], self.drop_last)
        return loader

    def val_dataloader(self):
        if not len(self.datasets["val"]):
            return []  # source.val_fraction=0 and no val_root: nothing to validate on
        return self._loader("val", shuffle=False, drop_last=False)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        training = self.trainer is not None and self.trainer.training
        return self.device_batch(batch, training) if isinstance(batch, Batch) else batch

    def device_batch(self, batch: Batch, training: bool) -> Batch:
        """What happens to a batch once it is on the device: the batch stack (uint8 -> float, normalise),
        then, for training batches, the batch-level augmentation (``transforms.mix``: mixup/cutmix)."""
        self._bind_mix()
        image, label = self.transforms.on_device(batch.image, batch.label, training)
        return batch._replace(image=image, label=label)

    # -- knobs resolved against the trainer -------------------------------------------------------
    def _world(self) -> tuple[int, int, int, bool]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0, 1, False
        on_gpu = isinstance(trainer.accelerator, CUDAAccelerator)
        return trainer.world_size, trainer.global_rank, max(1, trainer.num_devices), on_gpu

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

    def _loader(self, split: str, shuffle: bool, drop_last: bool) -> DataLoader:
        if split not in self.datasets:
            self.setup("fit")
        self.datasets[split].share_bad_samples()
        return DataLoader(
            self.datasets[split], shuffle=shuffle, drop_last=drop_last, **self.loader_settings()
        )

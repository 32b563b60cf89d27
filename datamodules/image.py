"""ImageDataModule: feedline's loaders (``loaders.ImageLoaders``) as a LightningDataModule.

__init__                   ImageLoaders' arguments; the parts' configs and knobs are saved as hyper-parameters,
                           so a checkpoint rebuilds the datamodule
prepare_data(), setup(), *_dataloader()
                           ImageLoaders', with the world size, rank and accelerator of the Trainer; an epoch
                           shorter than trainer.log_every_n_steps lowers it to the epoch's batches
on_after_batch_transfer()  device_batch: the batch stack on the device (uint8 -> float, normalise), mix
                           on training batches, one memory format for every split
"""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator

from feedline.datamodules.loaders import ImageLoaders
from feedline.datamodules.notices import quiet_lightning
from feedline.datamodules.resume import batch_seed
from feedline.transforms.collate import Batch

quiet_lightning()
log = logging.getLogger(__name__)


class ImageDataModule(ImageLoaders, L.LightningDataModule):
    """``ImageLoaders`` under Lightning: same arguments (``source``, ``transforms``, ``collate`` and the
    ``data.*`` knobs); Lightning's hooks call its loaders and move each batch through ``device_batch``."""

    def _remember(self, config: dict) -> None:
        super()._remember(config)
        self.save_hyperparameters(config)

    def train_dataloader(self):
        loader = super().train_dataloader()
        self._log_each_epoch(len(loader))
        return loader

    def _log_each_epoch(self, batches: int) -> None:
        """An epoch shorter than ``trainer.log_every_n_steps`` would log no training step in most epochs (and
        Lightning warns about it): log every epoch's last step at least."""
        trainer = self.trainer
        if trainer is None or trainer.fast_dev_run:
            return
        limit = trainer.limit_train_batches
        if isinstance(limit, int):
            batches = min(batches, limit)
        elif isinstance(limit, float) and limit < 1.0:
            batches = int(batches * limit)
        if 0 < batches < trainer.log_every_n_steps:
            log.debug(
                "trainer.log_every_n_steps %d -> %d: the epoch's batches", trainer.log_every_n_steps, batches
            )
            trainer.log_every_n_steps = batches

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        training = self.trainer is not None and self.trainer.training
        seed = None
        if training:  # one more training batch consumed: the position a checkpoint taken now records
            seed = batch_seed(self.run_seed(), self.position.epoch, self.position.batches, self._world()[1])
            self.position.batches += 1
        return self.device_batch(batch, training, seed=seed) if isinstance(batch, Batch) else batch

    def _world(self) -> tuple[int, int, int, bool]:
        trainer = self.trainer
        if trainer is None:
            return super()._world()
        on_gpu = isinstance(trainer.accelerator, CUDAAccelerator)
        return trainer.world_size, trainer.global_rank, max(1, trainer.num_devices), on_gpu

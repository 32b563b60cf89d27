"""ImageDataModule: feedline's loaders (``loaders.ImageLoaders``) as a LightningDataModule.

__init__                   ImageLoaders' arguments; the parts' configs and knobs are saved as hyper-parameters,
                           so a checkpoint rebuilds the datamodule
prepare_data(), setup(), *_dataloader()
                           ImageLoaders', with the world size, rank and accelerator of the Trainer; an epoch
                           shorter than trainer.log_every_n_steps lowers it to the epoch's batches
on_after_batch_transfer()  device_batch: the batch stack on the device (uint8 -> float, normalise), mix
                           on training batches, one memory format for every split
state_dict()               a copy of the train loader's state, which Lightning hands back on every resume
                           (it hands the loader its own only inside an epoch): the first train loader of a
                           resumed fit checks it, or says what is missing (``resume.py``)
load_from_checkpoint()     Lightning's, building only what a checkpoint may name (``datamodules/checkpoint/trusted.py``)
"""

from __future__ import annotations

import logging
import os

import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.utilities.model_helpers import _restricted_classmethod

from feedline.datamodules.checkpoint.trusted import PARTS, rebuilding
from feedline.datamodules.epoch.resume import Resuming
from feedline.datamodules.epoch.sampler import batch_seed
from feedline.datamodules.loaders import ImageLoaders
from feedline.datamodules.notices import quiet_lightning
from feedline.transforms.collate import Batch

quiet_lightning()
log = logging.getLogger(__name__)


class ImageDataModule(ImageLoaders, L.LightningDataModule):
    """``ImageLoaders`` under Lightning: same arguments (``source``, ``transforms``, ``collate`` and the
    ``data.*`` knobs); Lightning's hooks call its loaders and move each batch through ``device_batch``."""

    _fit_begins = False  # set by setup("fit"): the next train loader is the first of a fit
    _train_loader = None
    _restored_state = None  # the train loader state of the checkpoint this fit resumes from, if it holds one

    @_restricted_classmethod
    def load_from_checkpoint(
        cls, checkpoint_path, map_location=None, hparams_file=None, trusted_targets=(), **kwargs
    ):
        """Lightning's ``load_from_checkpoint`` (``weights_only=True`` and every other argument included): the
        datamodule built again from the checkpoint's recorded config, with ``kwargs`` in place of what they
        name. A recorded part may name only feedline's data layer and torchvision's transforms, plus
        ``trusted_targets`` (``["mypkg.MyTransform"]``, or ``["mypkg."]`` for all of a package): anything else
        is refused before anything is built (``datamodules/checkpoint/trusted.py``); a part passed again is not checked."""
        name = checkpoint_path if isinstance(checkpoint_path, (str, os.PathLike)) else None
        where = str(name or getattr(checkpoint_path, "name", "(a file object)"))
        if hparams_file is not None:
            where += f" (with hparams_file {hparams_file})"
        given = [key for key in PARTS if key in kwargs]
        with rebuilding(where, trusted_targets, given):
            # None: the datamodule is built by its own __init__, never by an instantiator the checkpoint names
            # (LightningCLI's would hand the recorded parts to jsonargparse, which builds them first)
            kwargs["_instantiator"] = None
            return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, **kwargs)

    def _remember(self, config: dict) -> None:
        super()._remember(config)
        self.save_hyperparameters(config)

    def _pin_seed(self, seed: int) -> None:
        super()._pin_seed(seed)
        self.hparams["seed"] = seed  # checkpoints record the seed the run used, not null

    def setup(self, stage: str | None = None) -> None:
        """Lightning calls it at the start of every fit, validate, test and predict, before it restores a
        checkpoint (and with it ``load_state_dict``)."""
        super().setup(stage)
        self._restored_state = None
        self._fit_begins = stage in (None, "fit")

    def train_dataloader(self):
        self._train_loader = super().train_dataloader()
        self._log_each_epoch(len(self._train_loader))
        return self._train_loader

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

    def state_dict(self) -> dict:
        loader = self._train_loader
        return (
            {"train_loader": loader.state_dict()} if loader is not None and self.trainer is not None else {}
        )

    def load_state_dict(self, state_dict: dict) -> None:
        self._restored_state = state_dict.get("train_loader")

    def _resuming(self) -> Resuming | None:
        begins, self._fit_begins = self._fit_begins, False
        state, self._restored_state = self._restored_state, None
        trainer = self.trainer
        if not begins or trainer is None or trainer.state.fn != "fit" or trainer.ckpt_path is None:
            return None
        return Resuming(str(trainer.ckpt_path), bool(trainer.fit_loop.restarting), state)

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

"""What every feedline LightningModule does alike: scale a uint8 batch, log a step's loss, and the optimiser.

The models differ in their loss and metric only (``classifier.py``, ``segmenter.py``, ``multilabel.py``,
``regressor.py``); each takes ``lr`` and ``weight_decay`` and gets AdamW with a cosine schedule over the run.
"""

from __future__ import annotations

import lightning as L
import torch


def scaled(x: torch.Tensor) -> torch.Tensor:
    """The input as floats: a uint8 batch (no batch stack configured, transforms=none) is scaled to [0, 1]."""
    return x.float().div_(255) if x.dtype == torch.uint8 else x


def log_loss(module: L.LightningModule, stage: str, loss: torch.Tensor, batch_size: int) -> None:
    """``<stage>/loss``: per step in training (on the progress bar), per epoch and over every rank otherwise."""
    on_epoch = stage != "train"
    module.log(
        f"{stage}/loss",
        loss,
        prog_bar=stage == "train",
        on_epoch=on_epoch,
        sync_dist=on_epoch,
        batch_size=batch_size,
    )


def adamw_cosine(module: L.LightningModule) -> dict:
    """AdamW at ``hparams.lr`` and ``hparams.weight_decay``, annealed to zero over ``trainer.max_epochs``."""
    optimizer = torch.optim.AdamW(
        module.parameters(), lr=module.hparams.lr, weight_decay=module.hparams.weight_decay
    )
    trainer = module.trainer
    epochs = trainer.max_epochs if trainer and trainer.max_epochs and trainer.max_epochs > 0 else 1
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    return {"optimizer": optimizer, "lr_scheduler": scheduler}


# What a run should pick for each kind of target, when the model it picked trains on another kind.
MODEL_FOR = {
    "class": "model=small_cnn (or resnet18)",
    "classes": "model=multilabel",
    "mask": "model=segmenter",
    "boxes": "model=detector",
    "number": "model=regressor",
    "vector": "model=regressor",
    "text": "a model of your own (docs/tasks.md shows one for captions)",
    "json": "a model of your own",
    "image": "a model of your own",
}


def check_target(model, datamodule) -> None:
    """Refuse, before any work, a model (class or instance) whose ``target_kinds`` does not hold the kind of the
    data's target (``datamodule.fields``): a classifier fed masks fails deep in its loss, naming nothing."""
    kinds = getattr(model, "target_kinds", None)
    fields = getattr(datamodule, "fields", None)
    if not kinds or fields is None:
        return
    target = fields[fields.target]
    if target.kind not in kinds:
        name = model.__name__ if isinstance(model, type) else type(model).__name__
        raise ValueError(
            f"{name} trains on a target of kind {' or '.join(kinds)}, and source.target={target.name!r} is of kind "
            f"{target.kind}: use {MODEL_FOR.get(target.kind, 'a model of your own')}, or set source.target to a "
            f"field of kind {kinds[0]}"
        )


class ChecksTarget:
    """A mixin for feedline's LightningModules: ``setup`` checks the data's target kind (``check_target``)."""

    target_kinds: tuple[str, ...] = ()

    def setup(self, stage: str) -> None:
        check_target(self, getattr(self.trainer, "datamodule", None))

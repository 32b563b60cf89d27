"""The train loader of ``ImageLoaders``: shuffled by (seed, epoch), split over the ranks here rather than by
Lightning, and resumable mid-epoch, on the same world or another (``resume.py``, ``order.py``).

A mixin of ``ImageLoaders`` (``loaders.py``): it reads the split, the loader settings and the world from it.
"""

from __future__ import annotations

import os

from feedline.datamodules.epoch.checks import (
    class_names_digest,
    counted_in,
    lightning_position,
    shift_batches,
)
from feedline.datamodules.epoch.order import ORDER_RULE
from feedline.datamodules.epoch.resume import ResumableLoader, Resuming
from feedline.datamodules.epoch.sampler import EpochSampler
from feedline.datamodules.knobs import check_steps
from feedline.datamodules.samples import SampleDataset


def epoch_samples(dataset: SampleDataset) -> int:
    """The samples an epoch reads: the split's, or what a source's own draw gives (a mix's epoch_size)."""
    own = getattr(dataset.records, "epoch_samples", None)
    return int(own()) if callable(own) else len(dataset)


def _label_identity(dataset: SampleDataset) -> str:
    own = getattr(dataset.records, "label_identity", None)  # a mix: each part's class_map
    return own() if callable(own) else ""


class TrainLoader:
    def train_dataloader(self) -> ResumableLoader:
        """Shuffled by (seed, epoch), split over the ranks here rather than by Lightning, and resumable
        mid-epoch (``resume.py``)."""
        dataset = self._split("train")
        dataset.share_bad_samples()
        settings = self.loader_settings()
        world_size, rank = self._world()[:2]
        size = epoch_samples(dataset)
        check_steps(size, settings["batch_size"], world_size, self.drop_last)
        seed = self.run_seed()
        self._pin_seed(seed)
        # The epoch training is at (Lightning builds the first iterator before it calls set_epoch).
        epoch = self.trainer.fit_loop.epoch_progress.current.processed if self.trainer is not None else 0
        sampler = EpochSampler(
            size,
            world_size,
            rank,
            True,
            seed,
            self.drop_last,
            self.position,
            epoch,
            epoch_order=getattr(dataset.records, "epoch_order", None),  # a source's own order, if it has one
            drawn=getattr(dataset.records, "drawn", None),  # a mix: what each part gives an epoch, logged
        )
        return ResumableLoader(
            dataset,
            sampler=sampler,
            checks=self._resume_checks(dataset, settings["batch_size"], world_size, seed),
            mode=self.resume,
            progress=self._fit_progress,
            shift=self._shift_batches,
            resuming=self._resuming(),
            drop_last=self.drop_last,
            **settings,
        )

    def _resume_checks(self, dataset: SampleDataset, batch_size: int, world_size: int, seed: int) -> dict:
        if self._train_digest is None:  # once: one pass over the split's row array
            digest = getattr(dataset.records, "digest", None)
            self._train_digest = digest() if callable(digest) else ""
        counts = {
            "samples": epoch_samples(dataset),
            "classes": self.num_classes,
            "class_names": class_names_digest(self.classes, _label_identity(dataset)),
            "batch_size": batch_size,
        }
        identity = getattr(
            dataset.records, "order_identity", None
        )  # a source's own order: what it draws from
        counts["order"] = identity() if callable(identity) else None
        counts["order_rule"] = ORDER_RULE
        content = getattr(dataset.records, "content_digest", None)  # a table's rows, beside the fields
        # in words where they say what changed (names, kinds, class counts), a digest for the rest (class
        # names, columns), and the table's content apart: a refusal then says which of them to undo
        said = f"{self.fields.describe()}; digest {self.fields.digest()}"
        counts["fields"] = said + (f"; table content {content()}" if callable(content) else "")
        return counted_in(self.source, self._train_digest, counts, world_size, seed, self.drop_last)

    def _fit_progress(self) -> tuple[int, int] | None:
        """(epoch, batches) that a resume from a checkpoint taken now goes on from, as Lightning counts them."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit":
            return None
        return lightning_position(trainer.fit_loop)

    def _shift_batches(self, delta: int) -> None:
        """A resume on another world or batch size: Lightning's count of the epoch's batches moves with it."""
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == "fit":
            shift_batches(trainer.fit_loop, delta)

    def _resuming(self) -> Resuming | None:
        """What the first train loader of a resumed fit checks (``ImageDataModule``'s); no Trainer: none."""
        return None

    def _pin_seed(self, seed: int) -> None:
        """The seed the train order uses from now on, and what rebuilds these loaders records (not null)."""
        self.seed = seed
        self.config["seed"] = seed

    def run_seed(self) -> int:
        """``data.seed``, else the run's (``seed_everything`` sets PL_GLOBAL_SEED), else 0."""
        if self.seed is not None:
            return int(self.seed)
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

"""Mid-epoch resume: the train loader's position is part of the checkpoint, and restoring it costs O(1).

The train order of an epoch is a pure function of (seed, epoch): a seeded permutation, padded or cut to a
multiple of the world size like ``DistributedSampler``, each rank taking every ``world_size``-th entry. So a
position is two numbers, the epoch and the batches this rank has consumed in it, and resuming is slicing the
rank's order, with no sample read, decoded or even listed on the way.

Each index travels with a seed of its own, a function of (seed, epoch, index): ``SampleDataset`` seeds torch's
generator with it before the per-sample transforms, so a sample's augmentation does not depend on which
worker drew it or on whether the run was interrupted. The batch-level mix on the device is seeded per batch
the same way, from (seed, epoch, batch, rank).

Lightning saves ``ResumableLoader.state_dict()`` with the checkpoint and hands it back through
``load_state_dict`` before the first ``iter()`` of the resumed fit (its stateful-loader interface).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from torch.utils.data import DataLoader, DistributedSampler

log = logging.getLogger(__name__)

STATE_FORMAT = 1
RESUME_MODES = ("strict", "lenient")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # odd: index -> seed offset is a bijection mod 2**64


def _epoch_key(seed: int, epoch: int, salt: int) -> np.uint64:
    return np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), salt]).generate_state(1, np.uint64)[0]


def batch_seed(seed: int, epoch: int, batch: int, rank: int) -> int:
    """The seed of the device-side batch transforms (mix) of one training batch."""
    return int(
        np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), int(batch), int(rank), 2]).generate_state(
            1
        )[0]
    )


@dataclass
class Position:
    """Where the train loader of this rank stands: the epoch, and the batches consumed in it."""

    epoch: int = 0
    batches: int = 0


class EpochSampler(DistributedSampler):
    """This rank's train order for each epoch, from (seed, epoch) alone; it yields ``(index, seed)`` pairs
    and starts wherever ``start`` says (one slice, O(1) in the samples skipped). A ``DistributedSampler``,
    so Lightning keeps it rather than wrapping it in one of its own."""

    def __init__(
        self,
        size: int,
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        position=None,
        epoch: int = 0,
    ):
        super().__init__(
            range(size), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.size = int(size)
        self.start = 0  # samples of this rank's epoch order to skip on the next iter(), once
        self.position = position if position is not None else Position()
        # A new loader starts its epoch from the beginning, at the epoch training is at when the loader is made:
        # Lightning builds its first iterator before it calls set_epoch (on a fresh start, and on a resume from
        # a checkpoint taken when an epoch was over), and that iterator must already read this epoch's order.
        self.epoch = int(epoch)
        self.position.epoch, self.position.batches = self.epoch, 0

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts from its beginning (Lightning calls this at every epoch start, and again, with
        the same epoch, after a resume has set the position)."""
        if epoch != self.epoch:
            self.start = 0
            self.position.epoch, self.position.batches = epoch, 0
        super().set_epoch(epoch)

    def order(self) -> np.ndarray:
        """This rank's indices for ``self.epoch``, in the order they are read."""
        if self.shuffle:
            rows = np.random.default_rng([int(self.seed) & 0xFFFFFFFF, int(self.epoch), 1]).permutation(
                self.size
            )
        else:
            rows = np.arange(self.size, dtype=np.int64)
        if self.drop_last:
            rows = rows[: self.total_size]
        elif self.total_size > self.size:  # pad by repeating from the start, as DistributedSampler does
            rows = np.concatenate([rows, np.resize(rows, self.total_size - self.size)])
        return rows[self.rank : self.total_size : self.num_replicas]

    def seeds(self, rows: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (_epoch_key(self.seed, self.epoch, 0) + rows.astype(np.uint64) * _GOLDEN) >> np.uint64(1)

    def __iter__(self):
        start, self.start = self.start, 0
        rows = self.order()[start:]
        return zip(rows.tolist(), self.seeds(rows).tolist())


class ResumeError(RuntimeError):
    pass


class ResumableLoader(DataLoader):
    """The train loader, with Lightning's stateful-loader interface: its state is this rank's position and
    what that position means (the samples, classes, batch size, world size and seed it counts in)."""

    def __init__(self, dataset, *, sampler: EpochSampler, checks: dict, mode: str, progress=None, **kwargs):
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.position = sampler.position
        self.checks = dict(checks)
        self.mode = check_resume_mode(mode)
        # () -> (epoch, batches) that training goes on from, or None without a Trainer (ImageDataModule's)
        self.progress = progress

    def state_dict(self) -> dict:
        """Where training goes on from: under a Trainer, the batches Lightning counts as processed (it replays
        from there, whether the checkpoint was taken after a step or inside one, as SLURM's signal handler
        does); an epoch that is over is recorded as the start of the next."""
        where = self.progress() if self.progress is not None else None
        epoch, batches = where if where is not None else (self.position.epoch, self.position.batches)
        return {"format": STATE_FORMAT, "epoch": epoch, "batches": batches, **self.checks}

    def load_state_dict(self, state: dict) -> None:
        epoch, batches = int(state.get("epoch", 0)), int(state.get("batches", 0))
        problem = self._mismatch(state)
        if problem:
            if self.mode == "strict":
                raise ResumeError(
                    f"cannot resume the train loader mid-epoch: {problem}. Resume with the data, "
                    "data.batch_size, world size and seed the checkpoint was written with, or set "
                    "data.resume=lenient to go on in this run's order"
                )
            log.warning(
                "data.resume=lenient: %s; epoch %d goes on after batch %d in this run's order, so it may repeat "
                "or miss samples; the epochs after it are whole",
                problem,
                epoch,
                batches,
            )
        batches = min(batches, len(self))
        self.sampler.set_epoch(epoch)
        self.position.epoch, self.position.batches = epoch, batches
        self.sampler.start = batches * self.batch_size
        if batches:
            log.info("train loader resumes epoch %d at batch %d of %d", epoch, batches, len(self))

    def _mismatch(self, state: dict) -> str | None:
        if state.get("format") != STATE_FORMAT:
            return f"the checkpoint's loader state has format {state.get('format')!r}, this feedline reads {STATE_FORMAT}"
        said = {
            "samples": "training samples",
            "classes": "classes",
            "batch_size": "data.batch_size (per device)",
            "world_size": "processes (world size)",
            "seed": "seed",
            "drop_last": "data.drop_last",
        }
        differences = [
            f"{what} {state.get(key)!r} then, {self.checks[key]!r} now"
            for key, what in said.items()
            if state.get(key) != self.checks[key]
        ]
        if differences:
            return "the run changed since the checkpoint: " + "; ".join(differences)
        return None


def check_resume_mode(value) -> str:
    if value not in RESUME_MODES:
        raise ValueError(f"data.resume={value!r} is not one of: {', '.join(RESUME_MODES)}")
    return value

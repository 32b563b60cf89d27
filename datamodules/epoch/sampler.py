"""The train sampler: an epoch's order from (seed, epoch), this rank's share of it from a position on, and
each index's seed, so a sample's augmentation does not depend on the worker, rank or batch that drew it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from torch.utils.data import DistributedSampler

from feedline.datamodules.epoch.order import epoch_order, rank_positions, segment_length
from feedline.datasets.orders import Order, as_order

log = logging.getLogger(__name__)

# positions read at a time: the first block small (the first batches wait on it), then larger ones
FIRST_BLOCK, BLOCK = 4096, 65536
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
    """Where the train loader of this rank stands: the epoch and the batches consumed in it, as Lightning
    counts them; and the segment of the epoch's order this world reads (``order.Segment``): from ``start``
    samples consumed, begun when the count was ``base`` (both 0 unless the epoch was resumed)."""

    epoch: int = 0
    batches: int = 0
    start: int = 0
    base: int = 0


class EpochSampler(DistributedSampler):
    """This rank's train order for each epoch, from (seed, epoch) alone (``order.py``); it yields
    ``(index, seed)`` pairs and starts wherever ``start`` says: the samples of the epoch's order consumed
    before, by whatever world (one slice, O(1) in the samples skipped). A ``DistributedSampler``, so Lightning
    keeps it rather than wrapping it in one of its own; its length is a whole epoch's share."""

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
        epoch_order=None,
        drawn=None,
    ):
        super().__init__(
            range(size), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        # (seed, epoch) -> the epoch's rows in order: a source's own (records.epoch_order: shards draw chunk by
        # chunk), else a seeded permutation (order.epoch_order)
        self.epoch_order = epoch_order
        self.drawn = drawn  # () -> {part: samples}: a mix's draw, logged as each epoch starts
        self.size = int(size)
        self.start = 0  # samples of the epoch's order consumed before the next iter() (once)
        self.position = position if position is not None else Position()
        # A new loader starts its epoch from the beginning, at the epoch training is at when the loader is made:
        # Lightning builds its first iterator before it calls set_epoch (on a fresh start, and on a resume from
        # a checkpoint taken when an epoch was over), and that iterator must already read this epoch's order.
        self.epoch = int(epoch)
        self.position.epoch, self.position.batches, self.position.start, self.position.base = (
            self.epoch,
            0,
            0,
            0,
        )

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts from its beginning (Lightning calls this at every epoch start, and again, with
        the same epoch, after a resume has set the position)."""
        if epoch != self.epoch:
            self.start = 0
            self.position.epoch, self.position.batches, self.position.start, self.position.base = (
                epoch,
                0,
                0,
                0,
            )
        super().set_epoch(epoch)

    def epoch_rows(self) -> Order:
        """``self.epoch``'s whole order, read by position (``datasets/orders.py``); nothing is built."""
        if self.epoch_order is not None and self.shuffle:
            order = as_order(self.epoch_order(self.seed, self.epoch))
            if len(order) != self.size:
                raise ValueError(
                    f"the source's epoch order holds {len(order)} samples, but its epoch has {self.size}: its "
                    "records' epoch_order and epoch_samples (or len) disagree; a source must draw exactly the "
                    "samples it counts"
                )
            return order
        return epoch_order(self.size, self.seed, self.epoch, self.shuffle)

    def order(self) -> np.ndarray:
        """This rank's indices for ``self.epoch`` from ``start`` on, in the order they are read, as one array
        (for a look at a small split: iterating reads them a block at a time)."""
        rows = [rows for rows, _ in self._blocks(self.epoch_rows(), self.start, self._key())]
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)

    def remaining(self, start: int) -> int:
        """The samples this rank reads of its epoch from ``start`` samples consumed on (no order built)."""
        return segment_length(self.size, start, self.num_replicas, self.drop_last) // self.num_replicas

    def seeds(self, rows: np.ndarray, key: np.uint64 | None = None) -> np.ndarray:
        """Each row's seed in ``self.epoch`` (or the epoch of ``key``, ``_key()``)."""
        key = self._key() if key is None else key
        with np.errstate(over="ignore"):
            return (key + rows.astype(np.uint64) * _GOLDEN) >> np.uint64(1)

    def _key(self) -> np.uint64:
        return _epoch_key(self.seed, self.epoch, 0)

    def _blocks(self, order: Order, start: int, key: np.uint64):
        """(rows, their seeds) of this rank's share from ``start`` on, ``BLOCK`` at a time: the first block is
        one of the first batches, so the first indices wait on no more than that. Everything it reads is fixed
        when it is made (a ``set_epoch`` while it is read changes nothing of it)."""
        size, world, rank = self.size, self.num_replicas, self.rank
        count, first, step = self.remaining(start), 0, FIRST_BLOCK
        while first < count:
            stop = min(count, first + step)
            rows = order.take(rank_positions(size, start, world, rank, first, stop))
            yield rows, self.seeds(rows, key)
            first, step = stop, BLOCK

    def __iter__(self):
        if self.drawn is not None and self.rank == 0:
            drawn = self.drawn()
            log.info(
                "epoch %d draws %s (source=mix)", self.epoch, ", ".join(f"{k} {v}" for k, v in drawn.items())
            )
        blocks = self._blocks(self.epoch_rows(), self.start, self._key())
        self.start = 0
        return (pair for rows, seeds in blocks for pair in zip(rows.tolist(), seeds.tolist()))

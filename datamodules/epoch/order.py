"""An epoch's order and who reads what of it: pure functions of (seed, epoch), the world and a position.

    order     the epoch's global order: a permutation of the split's rows from (seed, epoch); a source may
              bring its own, ``records.epoch_order(seed, epoch)`` (shards draw chunk by chunk): any
              permutation that is a pure function of (seed, epoch) keeps every guarantee below
    segment   the part of that order one world reads: from ``start`` (samples of the order consumed before,
              by whatever world read them) to the end, padded with the order's first rows to a multiple of
              the world size (``DistributedSampler``'s padding), or cut to one (``drop_last``)
    rank      rank r of W reads every W-th entry of the segment, from entry r

Rank r's first k batches of B are entries r, r+W, ... of the segment, so after k batches on every rank the
consumed samples are the segment's first k*B*W entries, whatever the world: a position is one number, the
samples of the order consumed (``Segment.consumed``). A resume on another world size or batch size starts a
new segment there; every sample not yet consumed is read once, and none twice but the padding.

None of these is ever built whole: an order is read by position (``datasets/orders.py``: a Feistel
permutation, or a source's own, such as the shards' chunk windows), and a rank reads its share a block of
positions at a time (``rank_positions``), so a rank's start costs the same at a thousand samples or a billion.
``ORDER_RULE`` names the rule: a checkpoint of another rule stands in another order (``checks.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from feedline.datasets.orders import Identity, Order, Permutation

# The rule that draws an epoch's order from (seed, epoch). 2: read by position (Feistel permutations; shards
# windows shuffled by one each); checkpoints without it were written under rule 1 (orders built whole).
ORDER_RULE = 2


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool = True) -> Order:
    """The rows of a split of ``size`` in the order epoch ``epoch`` reads them, read by position
    (``datasets/orders.py``): a seeded bijection of [0, size), never built whole."""
    return Permutation(size, seed, epoch) if shuffle else Identity(size)


def segment_length(size: int, start: int, world_size: int, drop_last: bool) -> int:
    """Entries of the segment a world of ``world_size`` reads from ``start`` on (see ``segment_rows``)."""
    rest = size - min(int(start), size)
    return rest - rest % world_size if drop_last else rest + -rest % world_size


def rank_positions(size: int, start: int, world_size: int, rank: int, first: int, stop: int) -> np.ndarray:
    """The positions in the epoch's order of rank ``rank``'s entries ``first`` .. ``stop`` of its share of
    the segment from ``start`` on: segment entry j is position ``start + j`` while the order lasts, then the
    padding, position ``j - rest`` (mod the order: ``np.resize`` repeats it); what ``rank_rows(segment_rows(
    order, ...))`` gives, one block at a time."""
    rest = size - min(int(start), size)
    j = rank + world_size * np.arange(first, stop, dtype=np.int64)
    return np.where(j < rest, start + j, (j - rest) % max(size, 1))


def segment_rows(order: np.ndarray, start: int, world_size: int, drop_last: bool) -> np.ndarray:
    """The entries of a whole ``order`` a world of ``world_size`` reads from ``start`` on: the rest of the
    order, cut to a multiple of the world size (``drop_last``) or padded to one with the order's first rows.
    The definition ``rank_positions`` follows without building the order (tests compare the two)."""
    rest = order[min(int(start), len(order)) :]
    if drop_last:
        return rest[: len(rest) - len(rest) % world_size]
    pad = -len(rest) % world_size
    return np.concatenate([rest, np.resize(order, pad)]) if pad else rest


def rank_rows(segment: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s share of a segment, in the order it reads it."""
    return segment[rank::world_size]


def rank_batches(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else -(-samples // batch_size)


@dataclass
class Segment:
    """The part of an epoch's order this world reads: from ``start`` samples consumed, by ``world_size``
    ranks of ``batch_size``; ``base`` is the batch count (as Lightning counts the epoch's batches) at which it
    began, so ``batches`` counted in the epoch map back to samples consumed."""

    epoch: int = 0
    start: int = 0
    base: int = 0
    world_size: int = 1
    batch_size: int = 1

    def consumed(self, batches: int, size: int) -> int:
        """Samples of the epoch's order consumed once the epoch's batch count reaches ``batches``."""
        done = max(0, int(batches) - self.base) * self.batch_size * self.world_size
        return min(size, self.start + done)

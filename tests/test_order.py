"""The epoch order and its partition: every sample once per epoch across ranks, on any world, from any
position; a position reached on one world goes on on another without a sample repeated or missed."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest

from feedline.datamodules.epoch.order import Segment, epoch_order, rank_batches, rank_rows, segment_rows


def read(order, segment: Segment, batches: int, drop_last: bool = False) -> list[list[int]]:
    """What each rank of ``segment``'s world reads in its first ``batches`` batches (all of them: None)."""
    rows = segment_rows(np.asarray(order), segment.start, segment.world_size, drop_last)
    out = []
    for rank in range(segment.world_size):
        mine = rank_rows(rows, rank, segment.world_size).tolist()
        out.append(mine if batches is None else mine[: batches * segment.batch_size])
    return out


def test_the_order_is_a_pure_function_of_seed_and_epoch():
    assert np.array_equal(epoch_order(50, 7, 3), epoch_order(50, 7, 3))
    assert not np.array_equal(epoch_order(50, 7, 3), epoch_order(50, 7, 4))
    assert sorted(np.asarray(epoch_order(50, 7, 3)).tolist()) == list(range(50))


@pytest.mark.parametrize("size", [1, 7, 40, 41])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_one_epoch_reads_every_sample_and_ranks_have_equal_batches(size, world):
    order = epoch_order(size, 0, 0)
    shares = read(order, Segment(world_size=world, batch_size=4), None)
    assert len({len(s) for s in shares}) == 1  # equal samples, so equal batches
    seen = collections.Counter(itertools.chain.from_iterable(shares))
    assert set(seen) == set(range(size))
    assert sum(seen.values()) - size == -size % world  # only the padding is read twice


CHANGES = [(2, 4, 1, 4), (2, 4, 1, 3), (1, 5, 2, 4), (2, 3, 3, 2), (3, 2, 2, 5), (2, 4, 2, 4), (2, 4, 2, 7)]


@pytest.mark.parametrize(("world", "batch", "new_world", "new_batch"), CHANGES)
@pytest.mark.parametrize("size", [37, 48])
def test_a_position_goes_on_on_another_world_without_a_sample_repeated_or_missed(
    size, world, batch, new_world, new_batch
):
    order = np.asarray(epoch_order(size, 3, 1))
    first = Segment(epoch=1, world_size=world, batch_size=batch)
    for k in range(rank_batches(-(-size // world), batch, False)):
        before = list(itertools.chain.from_iterable(read(order, first, k)))
        consumed = first.consumed(k, size)
        assert sorted(before) == sorted(
            order[:consumed].tolist()
        )  # a prefix of the order, whatever the world
        second = Segment(epoch=1, start=consumed, base=k, world_size=new_world, batch_size=new_batch)
        after = read(order, second, None)
        assert len({len(s) for s in after}) == 1
        seen = collections.Counter(before + list(itertools.chain.from_iterable(after)))
        assert set(seen) == set(range(size))
        repeated = sum(seen.values()) - size
        assert repeated == -(size - consumed) % new_world  # the new world's padding, and nothing else


def test_the_same_world_goes_on_with_the_very_samples_of_an_uninterrupted_epoch():
    order = epoch_order(41, 5, 2)
    whole = read(order, Segment(epoch=2, world_size=3, batch_size=4), None)
    for k in range(4):
        resumed = read(
            order,
            Segment(
                epoch=2, start=Segment(2, 0, 0, 3, 4).consumed(k, 41), base=k, world_size=3, batch_size=4
            ),
            None,
        )
        assert all(w[k * 4 :] == r for w, r in zip(whole, resumed))


def test_a_segment_counts_its_own_batches_from_its_base():
    segment = Segment(epoch=0, start=24, base=3, world_size=2, batch_size=5)
    assert (
        segment.consumed(3, 100) == 24 and segment.consumed(5, 100) == 44 and segment.consumed(99, 100) == 100
    )


def test_a_source_brings_its_own_order_and_keeps_every_guarantee():
    from feedline.datamodules.epoch.sampler import EpochSampler

    def reversed_order(seed, epoch):  # any permutation that is a pure function of (seed, epoch)
        return np.arange(20)[::-1] if epoch % 2 else np.arange(20)

    for epoch in (0, 1):
        shares = []
        for rank in range(2):
            sampler = EpochSampler(20, 2, rank, True, 0, False, epoch_order=reversed_order)
            sampler.set_epoch(epoch)
            shares.append([i for i, _ in sampler])
        assert shares[0] == reversed_order(0, epoch)[0::2].tolist()
        assert sorted(shares[0] + shares[1]) == list(range(20))
    resumed = EpochSampler(20, 1, 0, True, 0, False, epoch_order=reversed_order)
    resumed.set_epoch(1)
    resumed.start = 6
    assert [i for i, _ in resumed] == list(range(13, -1, -1))  # the rest of its own order

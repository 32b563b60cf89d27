"""Orders read by position (``datasets/orders.py``, ``datasets/shards/order.py``): enumerated on small sizes
they are permutations, any position's row equals the enumeration's, and a rank reading its share a block at a
time reads exactly what the whole order's segment gives it (``order.segment_rows``, ``rank_rows``)."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.datamodules.epoch import sampler as sampler_module
from feedline.datamodules.epoch.order import epoch_order, rank_rows, segment_rows
from feedline.datamodules.epoch.sampler import EpochSampler
from feedline.datasets.orders import Identity, Permutation, feistel, half_bits, round_keys
from feedline.datasets.shards.order import ChunkWindows, chunk_order

SIZES = [0, 1, 2, 3, 4, 5, 7, 16, 17, 255, 1000, 4097]


def enumerated(order) -> np.ndarray:
    rows = order.take(np.arange(len(order), dtype=np.int64))
    assert rows.dtype == np.int64
    return rows


@pytest.mark.parametrize("size", SIZES)
def test_a_permutation_is_a_bijection_and_any_position_reads_its_own_row(size):
    order = Permutation(size, 7, 3)
    rows = enumerated(order)
    assert sorted(rows.tolist()) == list(range(size))
    at = np.random.default_rng(size).integers(0, max(size, 1), 50) if size else np.zeros(0, np.int64)
    assert np.array_equal(order.take(at), rows[at])  # random access, in any order, with repeats
    assert np.array_equal(enumerated(Permutation(size, 7, 3)), rows)  # a pure function of (seed, epoch)
    if size >= 7:
        assert not np.array_equal(enumerated(Permutation(size, 7, 4)), rows)
        assert not np.array_equal(enumerated(Permutation(size, 8, 3)), rows)


def test_positions_far_past_memory_are_read_in_memory_of_the_positions():
    size = 10**12 + 39  # no array of it could exist
    at = np.array([0, 1, 2, size - 1, size // 2, 12345678901], dtype=np.int64)
    rows = Permutation(size, 0, 0).take(at)
    assert ((rows >= 0) & (rows < size)).all() and len(set(rows.tolist())) == len(at)


def test_half_bits_are_exact_at_every_power_of_two():
    sizes = np.array([1, 2, 3, 4, 5, 15, 16, 17, 2**31, 2**31 + 1, 2**62, 2**62 + 1], dtype=np.int64)
    domains = 4 ** half_bits(sizes).astype(object)
    assert all(d >= s and (d // 4 < s or d == 4) for d, s in zip(domains, sizes.tolist()))


def test_one_call_shuffles_windows_of_different_sizes_as_separate_calls_would():
    sizes = np.array([5, 1, 300, 17], dtype=np.int64)
    keys = np.stack([round_keys(1, 2, 3 + k) for k in range(len(sizes))], axis=1)
    at = np.concatenate([np.arange(s) for s in sizes])
    which = np.repeat(np.arange(len(sizes)), sizes)
    together = feistel(at, sizes[which], keys[:, which])
    for k, size in enumerate(sizes):
        alone = feistel(np.arange(size), int(size), keys[:, k])
        assert np.array_equal(together[which == k], alone)
        assert sorted(alone.tolist()) == list(range(size))


def test_a_permutation_mixes_positions_and_rows():
    size = 1 << 16
    rows = enumerated(Permutation(size, 0, 0)).astype(np.float64)
    positions = np.arange(size, dtype=np.float64)
    assert abs(np.corrcoef(positions, rows)[0, 1]) < 0.02
    assert abs(np.corrcoef(rows[:-1], rows[1:])[0, 1]) < 0.02  # neighbours in the order are not neighbours
    assert np.count_nonzero(rows == positions) < 10  # a random permutation has about one fixed point


CHUNKS = [
    [3, 0, 5, 1, 4, 4, 0, 9, 2],  # uneven, with empty chunks (a split that took no sample of them)
    [1],
    [600] * 5,
    [],
]


@pytest.mark.parametrize("sizes", CHUNKS)
@pytest.mark.parametrize("window", [1, 3, 10**6])
def test_chunk_windows_are_a_permutation_whose_windows_hold_their_own_chunks(sizes, window):
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    order = chunk_order(bounds, window, 5, 2)
    rows = enumerated(order)
    assert sorted(rows.tolist()) == list(range(int(bounds[-1])))
    at = np.random.default_rng(0).integers(0, max(len(rows), 1), 40) if len(rows) else np.zeros(0, np.int64)
    assert np.array_equal(order.take(at), rows[at])
    assert np.array_equal(order[3:9], rows[3:9]) and (not len(rows) or order[-1] == rows[-1])
    # the chunks are read a window at a time: window w's stretch of the order holds exactly its chunks' samples
    chunk_of = np.searchsorted(bounds, np.arange(bounds[-1]), side="right") - 1
    chunks = np.random.default_rng([5, 2, 2]).permutation(len(sizes))  # the epoch's chunk permutation
    span = min(window, max(len(sizes), 1))
    begin = 0
    for w in range(0, len(sizes), span):
        mine = chunks[w : w + span]
        count = int(np.sum(np.asarray(sizes, dtype=np.int64)[mine]))
        assert set(chunk_of[rows[begin : begin + count]].tolist()) == {c for c in mine if sizes[c]}
        begin += count
    if len(rows) >= 7:
        assert not np.array_equal(enumerated(chunk_order(bounds, window, 5, 3)), rows)


def test_windows_of_one_size_are_each_shuffled_their_own_way():
    bounds = np.arange(0, 81, 10, dtype=np.int64)  # 8 chunks of 10: 4 windows of 20
    rows = enumerated(ChunkWindows(bounds, 2, 0, 0))
    chunks = np.random.default_rng([0, 0, 2]).permutation(8)
    shuffles = set()
    for w in range(4):
        mine = chunks[2 * w : 2 * w + 2].tolist()
        shuffles.add(tuple(mine.index(r // 10) * 10 + r % 10 for r in rows[20 * w : 20 * w + 20].tolist()))
    assert len(shuffles) == 4


def test_chunk_windows_hold_memory_of_the_chunks_not_the_samples():
    bounds = np.arange(0, 600 * 20_000 + 1, 600, dtype=np.int64) * 1000  # 12 billion samples, 20k chunks
    order = ChunkWindows(bounds, 32, 0, 0)
    held = sum(a.nbytes for a in vars(order).values() if isinstance(a, np.ndarray))
    assert len(order) == 12 * 10**9 and held < 100 * len(bounds)
    rows = order.take(np.array([0, 1, len(order) - 1], dtype=np.int64))
    assert ((rows >= 0) & (rows < len(order))).all()


ORDERS = {
    "permutation": lambda size: Permutation(size, 3, 1),
    "identity": Identity,
    "chunks": lambda size: chunk_order(np.unique(np.r_[0, np.arange(0, size, 7), size]), 2, 3, 1),
}


@pytest.mark.parametrize("kind", sorted(ORDERS))
@pytest.mark.parametrize("size", [1, 5, 61])
@pytest.mark.parametrize("world", [1, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_rank_reading_blocks_reads_what_the_whole_orders_segment_gives_it(
    kind, size, world, drop_last, monkeypatch
):
    monkeypatch.setattr(sampler_module, "FIRST_BLOCK", 2)  # many blocks, of two sizes
    monkeypatch.setattr(sampler_module, "BLOCK", 5)
    order = ORDERS[kind](size)
    whole = enumerated(order)
    for start in sorted({0, 1, size // 2, size - 1, size}):
        for rank in range(world):
            sampler = EpochSampler(
                size, world, rank, True, 3, drop_last, epoch=1, epoch_order=lambda s, e: order
            )
            sampler.start = start
            read = [row for row, _ in sampler]
            expected = rank_rows(segment_rows(whole, start, world, drop_last), rank, world)
            assert read == expected.tolist(), (start, rank)
            assert len(read) == sampler.remaining(start)


def test_the_samplers_own_order_is_the_permutation_and_its_seeds_follow_the_rows():
    sampler = EpochSampler(50, 2, 1, True, 7, False, epoch=3)
    pairs = list(sampler)
    assert [row for row, _ in pairs] == np.asarray(epoch_order(50, 7, 3))[1::2].tolist()
    rows = np.array([row for row, _ in pairs])
    assert [seed for _, seed in pairs] == sampler.seeds(rows).tolist()
    unshuffled = EpochSampler(10, 1, 0, False, 7, False)
    assert [row for row, _ in unshuffled] == list(range(10))

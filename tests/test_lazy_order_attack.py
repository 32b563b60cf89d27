"""Orders read by position, attacked at their edges: every sample once per epoch on any world size and at any
resume point, sizes at the Feistel domain's edges and near the integer limits, seeds and epochs out of the
usual range, chunk windows of empty chunks, a mix over a chunk-aware part, the order-rule resume check with
forged states, the sampler's generator under set_epoch and a DataLoader's workers, and the permutations'
statistics."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import signal

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from feedline.datamodules.epoch import sampler as sampler_module
from feedline.datamodules.epoch.checks import other_order_rule, state_problems
from feedline.datamodules.epoch.order import (
    ORDER_RULE,
    rank_positions,
    segment_length,
    segment_rows,
)
from feedline.datamodules.epoch.sampler import EpochSampler
from feedline.datasets.mix.order import mix_order, part_seed
from feedline.datasets.orders import (
    SMALL_ROUNDS,
    Identity,
    Materialized,
    Permutation,
    feistel,
    half_bits,
    round_keys,
    window_keys,
)
from feedline.datasets.shards.order import chunk_order


def whole(order) -> np.ndarray:
    return order.take(np.arange(len(order), dtype=np.int64))


def chunks(sizes) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)


def check_once(read: list[int], size: int, start: int, world: int, drop_last: bool, before=()) -> None:
    """``before`` (the samples consumed) and ``read`` (the rest, by a world of ``world``) hold every sample
    once: but the padding (repeats of the order's first rows) or the cut tail (drop_last)."""
    rest = size - min(start, size)
    counts = np.bincount(np.asarray([*before, *read], dtype=np.int64), minlength=size)
    assert len(read) == segment_length(size, start, world, drop_last)
    if drop_last:
        assert counts.max(initial=0) <= 1 and int((counts == 0).sum()) == rest % world
    else:
        assert counts.min(initial=1) >= 1 and int(counts.sum()) - size == -rest % world


# -- every sample once, on any world ---------------------------------------------------------------------
TINY_AND_EDGES = [0, 1, 2, 3, 5, 15, 16, 17, 63, 64, 65, 257]


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_world_from_1_to_64_reads_each_sample_once_at_any_size(drop_last):
    for size in TINY_AND_EDGES:
        rows = whole(Permutation(size, 11, 2))
        for world in range(1, 65):
            for start in sorted({0, size // 3, size - 1, size + 3} - {-1}):
                count = segment_length(size, start, world, drop_last) // world
                read = [
                    rows[rank_positions(size, start, world, rank, 0, count)].tolist() for rank in range(world)
                ]
                # the rank that reads segment entry j is j % world: zip them back into the segment
                segment = [r for step in itertools.zip_longest(*read) for r in step if r is not None]
                check_once(segment, size, start, world, drop_last, before=rows[: min(start, size)].tolist())
                expected = segment_rows(rows, start, world, drop_last)
                assert segment == expected.tolist(), (size, world, start)


ORDERS = {
    "permutation": lambda size: Permutation(size, -3, 7),
    "chunks": lambda size: chunk_order(chunks([0, 3, 0, 1, 5] * (size // 9) + [size % 9]), 2, 2**40 + 1, 3),
    "chunks, one window": lambda size: chunk_order(chunks([size // 2, 0, size - size // 2]), 99, 5, 0),
    "identity": Identity,
}


@pytest.mark.parametrize("kind", sorted(ORDERS))
@pytest.mark.parametrize("drop_last", [False, True])
def test_samplers_of_many_worlds_read_each_sample_once_across_blocks(kind, drop_last, monkeypatch):
    monkeypatch.setattr(sampler_module, "FIRST_BLOCK", 3)
    monkeypatch.setattr(sampler_module, "BLOCK", 4)
    for size in [0, 1, 2, 5, 16, 17, 40]:
        order = ORDERS[kind](size)
        assert len(order) == size
        for world in [1, 2, 3, 7, 16, 64]:
            reads = []
            for rank in range(world):
                sampler = EpochSampler(
                    size, world, rank, True, 9, drop_last, epoch=3, epoch_order=lambda s, e, o=order: o
                )
                reads.append([row for row, _ in sampler])
                assert len(reads[-1]) == len(sampler) == sampler.remaining(0)
            segment = [r for step in itertools.zip_longest(*reads) for r in step if r is not None]
            check_once(segment, size, 0, world, drop_last)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_resume_on_another_world_reads_the_rest_once(drop_last, monkeypatch):
    """Consumed: a prefix of the order (k batches of B on W ranks), resumed on W' ranks in the middle of a
    block, at the last sample, at the end and past it."""
    monkeypatch.setattr(sampler_module, "FIRST_BLOCK", 2)
    monkeypatch.setattr(sampler_module, "BLOCK", 3)
    size = 23
    rows = whole(Permutation(size, 4, 1))
    for start in [0, 1, 5, 7, 12, 21, 22, 23, 30]:
        for world in [1, 2, 4, 5, 8, 31, 64]:
            read = []
            for rank in range(world):
                sampler = EpochSampler(size, world, rank, True, 4, drop_last, epoch=1)
                sampler.start = start
                read.append([row for row, _ in sampler])
                assert sampler.start == 0  # the position is used once
            segment = [r for step in itertools.zip_longest(*read) for r in step if r is not None]
            check_once(segment, size, start, world, drop_last, before=rows[: min(start, size)].tolist())


# -- sizes at the Feistel domain's edges and near the integer limits -----------------------------------------
def test_sizes_around_every_power_of_two_and_four_are_permutations():
    sizes = sorted({s for k in range(1, 15) for s in (2**k - 1, 2**k, 2**k + 1)})
    for size in sizes:
        rows = whole(Permutation(size, 2**33 + 5, 1))
        assert np.array_equal(np.sort(rows), np.arange(size)), size
    # the domain is the smallest power of 4 holding the size
    for size in sizes:
        h = int(half_bits(size))
        assert 4**h >= size and (h == 1 or 4 ** (h - 1) < size)


@pytest.mark.parametrize(
    "size", [2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 1, 2**62, 2**62 + 1, 2**63 - 1]
)
def test_sizes_near_the_integer_limits_map_positions_into_range_one_to_one(size):
    order = Permutation(size, 1, 1)
    at = np.concatenate([np.arange(2000), size - 1 - np.arange(2000), size // 2 + np.arange(2000)]).astype(
        np.int64
    )
    rows = order.take(at)
    assert rows.dtype == np.int64 and ((rows >= 0) & (rows < size)).all()
    assert len(np.unique(rows)) == len(at)  # a bijection: distinct positions, distinct rows
    assert order[size - 1] == rows[2000] and order[-1] == rows[2000]
    with pytest.raises(IndexError):
        order[size]


def test_a_rank_resuming_at_the_end_of_a_huge_epoch_reads_its_last_rows_and_the_padding():
    size = 2**62 + 1
    for drop_last in (False, True):
        rows = []
        for rank in range(4):
            sampler = EpochSampler(size, 4, rank, True, 0, drop_last, epoch=5)
            sampler.start = size - 5
            rows.append([row for row, _ in sampler])
        flat = [r for step in itertools.zip_longest(*rows) for r in step if r is not None]
        order = Permutation(size, 0, 5)
        tail = order.take(np.arange(size - 5, size, dtype=np.int64)).tolist()
        head = order.take(np.arange(3, dtype=np.int64)).tolist()
        assert flat == (tail[:4] if drop_last else tail + head)


# -- seeds and epochs ------------------------------------------------------------------------------------
def test_seeds_are_taken_mod_2_to_the_32_as_the_earlier_order_did_and_epochs_must_be_non_negative():
    base = whole(Permutation(100, 5, 0))
    # as before (default_rng([seed & 0xFFFFFFFF, ...])): seed and seed + 2**32 draw the same order
    assert np.array_equal(whole(Permutation(100, 5 + 2**32, 0)), base)
    assert np.array_equal(whole(Permutation(100, -1, 0)), whole(Permutation(100, 2**32 - 1, 0)))
    assert not np.array_equal(whole(Permutation(100, 6, 0)), base)
    huge = whole(Permutation(100, 5, 10**30))  # an epoch past 64 bits is a key like any other
    assert np.array_equal(np.sort(huge), np.arange(100)) and not np.array_equal(huge, base)
    with pytest.raises(ValueError):
        Permutation(100, 5, -1)
    with pytest.raises(ValueError):
        chunk_order(chunks([3, 4]), 1, 5, -1)


# -- chunk windows ---------------------------------------------------------------------------------------
CHUNK_CASES = [
    [0, 0, 0, 0],
    [],
    [7],
    [0, 0, 6, 0, 0],
    [2, 0, 0, 0, 0, 0, 3],
    [1] * 9,
    [5, 0, 5, 0],
]


@pytest.mark.parametrize("sizes", CHUNK_CASES)
@pytest.mark.parametrize("window", [1, 2, 3, 100, 2**70])
def test_chunk_windows_of_empty_and_lone_chunks_are_permutations_read_by_any_position(sizes, window):
    bounds = chunks(sizes)
    order = chunk_order(bounds, window, -7, 4)
    rows = whole(order)
    assert np.array_equal(np.sort(rows), np.arange(int(bounds[-1])))
    if len(rows):
        at = np.arange(len(rows) - 1, -1, -1)
        assert np.array_equal(order.take(at), rows[at])
    sampler = EpochSampler(len(rows), 3, 1, True, -7, False, epoch=4, epoch_order=lambda s, e: order)
    assert [row for row, _ in sampler] == segment_rows(rows, 0, 3, False)[1::3].tolist()


def test_a_windows_shuffle_is_keyed_by_its_index_and_the_epoch():
    keys = round_keys(3, 1, 3)
    cols = window_keys(keys, np.arange(4))
    assert cols.shape == (SMALL_ROUNDS + 1, 4) and len({tuple(c) for c in cols.T.tolist()}) == 4
    shuffles = {tuple(feistel(np.arange(50), 50, cols[:, w]).tolist()) for w in range(4)}
    assert len(shuffles) == 4
    other_epoch = window_keys(round_keys(3, 2, 3), np.arange(4))
    assert not np.array_equal(other_epoch, cols)


# -- a mix over a chunk-aware part ------------------------------------------------------------------------
def test_a_mix_over_a_chunk_aware_part_is_a_pure_function_of_seed_and_epoch():
    bounds = chunks([4, 0, 6, 3, 7])  # 20 samples
    lazy = [lambda s, k: chunk_order(bounds, 2, s, k), lambda s, k: Permutation(9, s, k)]
    arrays = [lambda s, k: np.asarray(chunk_order(bounds, 2, s, k)), lambda s, k: whole(Permutation(9, s, k))]
    for counts in ([20, 9], [13, 30]):  # each part read whole; undersampled and oversampled
        counts = np.array(counts, dtype=np.int64)
        for epoch in range(3):
            order = mix_order(lazy, [20, 9], [0, 20], counts, 2**35 + 1, epoch)
            assert np.array_equal(order, mix_order(lazy, [20, 9], [0, 20], counts, 2**35 + 1, epoch))
            assert np.array_equal(order, mix_order(arrays, [20, 9], [0, 20], counts, 2**35 + 1, epoch))
            if counts[0] == 20:
                assert np.array_equal(np.sort(order), np.arange(29))
            shards = order[order < 20]
            assert len(shards) == counts[0] and len(np.unique(shards)) == len(
                shards
            )  # undersampled: no repeat
    first = np.asarray(chunk_order(bounds, 2, part_seed(0, 0), 0))
    order = mix_order(lazy, [20, 9], [0, 20], np.array([20, 9]), 0, 0)
    assert order[order < 20].tolist() == first.tolist()  # the part keeps its own chunk-aware order
    sampler = EpochSampler(29, 2, 0, True, 0, False, epoch=0, epoch_order=lambda s, e: order)
    assert [row for row, _ in sampler] == order[0::2].tolist()  # read through Materialized


def test_an_order_is_indexed_as_bench_and_the_benchmarks_index_it():
    order = Permutation(1000, 3, 0)
    rows = whole(order)
    assert order[7] == rows[7] and isinstance(order[7], int) and order[np.int64(7)] == rows[7]
    assert order[-1] == rows[-1] and np.array_equal(order[10:20], rows[10:20])
    assert np.array_equal(np.asarray(order, dtype=np.int64), rows)
    marks = np.zeros(1000, dtype=np.int64)
    marks[np.asarray(order)] = np.arange(1000)  # as benchmarks/shard_mixing.py measures an order
    assert np.array_equal(marks[rows], np.arange(1000))
    assert np.array_equal(Materialized(rows)[[3, 4]], rows[[3, 4]])
    with pytest.raises(IndexError):
        order[1000]


# -- statistics -------------------------------------------------------------------------------------------
def many_seeds(size: int, seeds: int, epoch: int = 0) -> np.ndarray:
    """(seeds, size): the permutation of every seed in 0 .. seeds, in one vectorised call."""
    keys = np.stack([round_keys(s, epoch, 1) for s in range(seeds)], axis=1)  # (SMALL_ROUNDS + 1, seeds)
    at = np.tile(np.arange(size, dtype=np.int64), seeds)
    return feistel(at, size, np.repeat(keys, size, axis=1)).reshape(seeds, size)


def parities(perms: np.ndarray) -> set[int]:
    out = set()
    for p in perms.tolist():
        seen, parity = [False] * len(p), 0
        for i in range(len(p)):
            length, j = 0, i
            while not seen[j]:
                seen[j], j, length = True, p[j], length + 1
            parity ^= max(length - 1, 0) & 1
        out.add(parity)
    return out


def test_every_permutation_of_tiny_sizes_is_reachable_over_seeds():
    for size in (2, 3, 4):
        perms = many_seeds(size, 3000)
        assert len({tuple(p) for p in perms.tolist()}) == math.factorial(size)
    assert parities(many_seeds(5, 200)) == {0, 1} and parities(many_seeds(17, 200)) == {0, 1}


def test_a_split_whose_size_is_a_power_of_four_reaches_odd_permutations():
    for size in (16, 64):
        assert parities(many_seeds(size, 200)) == {0, 1}, size


def test_position_to_row_is_uniform_over_seeds_on_a_small_size():
    seeds = 20000
    perms = many_seeds(5, seeds)
    freq = (perms == np.arange(5)).mean(axis=0)  # P(row p at position p)
    sigma = math.sqrt(0.2 * 0.8 / seeds)
    assert np.abs(freq - 0.2).max() < 5 * sigma, freq


def test_epochs_seeds_and_position_bits_are_uncorrelated():
    size = 1 << 14
    at = np.arange(size)
    rows = whole(Permutation(size, 0, 0))
    for other in (Permutation(size, 0, 1), Permutation(size, 1, 0), Permutation(size, 2**32 + 1, 0)):
        assert abs(np.corrcoef(rows, whole(other))[0, 1]) < 0.05
        assert np.count_nonzero(rows == whole(other)) < 10
    for bits in (1, 3, 255):  # low bits of the position do not leak into the row's
        agree = np.mean((rows & bits) == (at & bits))
        assert abs(agree - 1 / (bits + 1)) < 0.03
    assert np.count_nonzero(np.abs(np.diff(rows)) == 1) < 12  # neighbours are not neighbours


# -- the sampler's generator ------------------------------------------------------------------------------
def pairs(sampler) -> list[tuple[int, int]]:
    return list(sampler)


def test_iter_twice_and_a_start_set_after_iter_read_the_positions_of_iter_time(monkeypatch):
    monkeypatch.setattr(sampler_module, "FIRST_BLOCK", 2)
    monkeypatch.setattr(sampler_module, "BLOCK", 3)
    sampler = EpochSampler(30, 3, 2, True, 1, False, epoch=2)
    full = pairs(sampler)
    sampler.start = 9
    it = iter(sampler)
    sampler.start = 21  # a later start, before the first next(): the iterator keeps the start of iter()
    resumed = list(it)
    assert resumed == full[3:]
    assert pairs(sampler) == full[-3:]  # this iter() reads from 21, then the start is spent
    assert pairs(sampler) == full
    sampler.set_epoch(3)
    other = pairs(sampler)
    assert other != full and pairs(EpochSampler(30, 3, 2, True, 1, False, epoch=3)) == other


def test_set_epoch_while_an_iterator_is_live_leaves_its_rows_and_seeds_as_of_iter(monkeypatch):
    monkeypatch.setattr(sampler_module, "FIRST_BLOCK", 2)
    monkeypatch.setattr(sampler_module, "BLOCK", 3)
    sampler = EpochSampler(30, 1, 0, True, 1, False, epoch=2)
    expected = pairs(EpochSampler(30, 1, 0, True, 1, False, epoch=2))
    it = iter(sampler)
    first = [next(it) for _ in range(2)]
    sampler.set_epoch(3)
    assert first + list(it) == expected


class Echo(Dataset):
    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, key):
        row, seed = key
        return torch.tensor([row, seed & 0xFFFFFFFF], dtype=torch.int64)


def test_a_loader_with_persistent_workers_reads_each_epoch_in_its_order(monkeypatch):
    monkeypatch.setattr(sampler_module, "FIRST_BLOCK", 4)
    monkeypatch.setattr(sampler_module, "BLOCK", 7)
    sampler = EpochSampler(37, 3, 1, True, 8, False, epoch=0)
    loader = DataLoader(Echo(), batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True)
    for epoch, start in ((0, 0), (1, 10), (2, 0)):
        sampler.set_epoch(epoch)
        sampler.start = start
        got = torch.cat(list(loader)).tolist() if sampler.remaining(start) else []
        fresh = EpochSampler(37, 3, 1, True, 8, False, epoch=epoch)
        fresh.start = start
        assert [tuple(x) for x in got] == [(r, s & 0xFFFFFFFF) for r, s in fresh]


# -- the order-rule resume check ----------------------------------------------------------------------------
def state(**over) -> dict:
    base = {
        "format": 3,
        "epoch": 2,
        "batches": 1,
        "consumed": 6,
        "segment": [0, 0],
        "samples": 10,
        "world_size": 3,
        "batch_size": 2,
        "drop_last": False,
        "seed": 1,
    }
    return {**base, **over}


NOW = {
    "samples": 10,
    "world_size": 3,
    "batch_size": 2,
    "drop_last": False,
    "seed": 1,
    "order_rule": ORDER_RULE,
}


@pytest.mark.parametrize("forged", ["2", None, 0, 1, 99, True, False, 2.5, [2]])
def test_a_forged_order_rule_inside_an_epoch_is_refused_by_name(forged):
    position, problems = state_problems(state(order_rule=forged), NOW, None)
    assert position == (2, 1, 6)
    assert len(problems) == 1 and f"rule {forged!r}" in problems[0] and f"rule {ORDER_RULE}" in problems[0]


def test_the_rule_is_only_checked_where_something_of_the_epoch_was_read_and_something_is_left():
    earlier = {k: v for k, v in state().items()}  # no order_rule: written under rule 1
    assert state_problems(earlier, NOW, None)[1]
    assert not state_problems({**earlier, "order_rule": ORDER_RULE}, NOW, None)[1]
    assert not state_problems({**earlier, "order_rule": np.int64(ORDER_RULE)}, NOW, None)[1]
    at_start = {**earlier, "batches": 0, "consumed": 0}
    assert not state_problems(at_start, NOW, None)[1]
    at_end = {**earlier, "batches": 2, "consumed": 10}  # 2 batches of 2 on 3 ranks: the epoch padded, read
    assert not state_problems(at_end, NOW, None)[1]
    assert other_order_rule(at_end, {**NOW, "samples": None}, (2, 2, 10))  # an epoch of unknown length
    assert other_order_rule(earlier, {**NOW, "order_rule": None}, (2, 1, 6)) is None  # a run that cannot tell


def test_a_checkpoint_of_the_earlier_rule_after_the_last_batch_of_a_drop_last_epoch_resumes():
    done = state(drop_last=True)  # batches 1 = every batch of the epoch on its world
    position, problems = state_problems(done, {**NOW, "drop_last": True}, None)
    assert position == (2, 1, 6) and problems == []


def test_lenient_skips_the_rest_of_an_earlier_rules_epoch_with_workers(tmp_path, caplog):
    from tests.helpers import simple_tree
    from tests.test_resume import digests, small_dm

    tree = simple_tree(tmp_path / "tree", per_class=2)  # 6 samples, 2 batches of 3
    first = small_dm(tree, num_workers=0).train_dataloader()
    digests(first, 1)
    earlier = {k: v for k, v in first.state_dict().items() if k != "order_rule"}
    lenient = small_dm(tree, resume="lenient", num_workers=1).train_dataloader()
    with caplog.at_level(logging.WARNING):
        lenient.load_state_dict(earlier)
    assert "the rest of epoch 0 is skipped" in caplog.text
    assert digests(lenient) == []
    lenient.sampler.set_epoch(1)
    assert len(digests(lenient)) == 2


# -- positions outside the order ---------------------------------------------------------------------------
@contextlib.contextmanager
def deadline(seconds: float):
    """A TimeoutError raised inside the block after ``seconds`` (the cycle-walk is a Python loop)."""

    def expire(*_):
        raise TimeoutError(f"still walking after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_position_past_a_chunk_windows_order_is_an_index_error():
    with deadline(5), pytest.raises(IndexError):
        chunk_order(chunks([3, 2]), 1, 0, 0).take(np.array([5]))
    with deadline(5), pytest.raises(ValueError, match="epoch order holds 8 samples, but its epoch has 10"):
        list(
            EpochSampler(
                10, 1, 0, True, 0, False, epoch_order=lambda s, e: chunk_order(chunks([4, 4]), 1, s, e)
            )
        )


@pytest.mark.parametrize("case", ["take", "sampler"])
def test_a_position_outside_a_permutation_or_an_order_shorter_than_the_epoch_is_refused(case):
    if case == "take":
        for p in (5, 6, 16, -1):
            with deadline(1), pytest.raises((IndexError, ValueError)):
                Permutation(5, 0, 0).take(np.array([p]))
    else:
        with deadline(1), pytest.raises((IndexError, ValueError)):
            list(EpochSampler(10, 1, 0, True, 0, False, epoch_order=lambda s, e: Permutation(8, s, e)))

"""A mix's epoch: how many samples each part gives, which ones, and in what order. Pure functions of
(seed, epoch), so an epoch's draw is the same in every rank, worker and resumed run, and a position in it is
one number (``datamodules/epoch/order.py``).

    quotas      samples per part per epoch: a part's ``samples``, as given; the rest of the epoch shared by
                ``weight``, rounded so the counts add up exactly (largest remainder)
    stream      a part's samples, read as an endless run of passes: pass k is the part's own order for
                (its seed, k), a permutation (a shards part's is chunk-aware). Epoch e takes the part's next
                ``quota`` entries, from ``e * quota``: without replacement while the part lasts, then on into
                the next pass, so over epochs every sample of an undersampled part comes before any comes
                twice, and an oversampled part repeats each sample ``quota / size`` times, give or take one;
                an undersampled part's epoch that straddles two passes takes no sample twice (``adjusted_pass``)
    interleave  which part each slot of the epoch reads: the parts' quotas shuffled together from
                (seed, epoch); each part's samples keep their stream's order in its slots

The epoch's global order is then part offset + the part's row, slot by slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

PartOrder = Callable[[int, int], np.ndarray]  # (seed, pass) -> a permutation of the part's rows


def quotas(
    sizes: Sequence[int],
    weights: Sequence[float | None],
    samples: Sequence[int | None],
    epoch_size: int | None,
) -> np.ndarray:
    """Samples each part gives an epoch. A part has a ``weight`` or a fixed ``samples`` count. The epoch:
    ``epoch_size``, or (null) the weighted parts' sizes plus the fixed counts."""
    fixed = sum(int(s) for s in samples if s is not None)
    weighted = [k for k, s in enumerate(samples) if s is None]
    total = int(epoch_size) if epoch_size is not None else fixed + sum(int(sizes[k]) for k in weighted)
    share = total - fixed
    if share > 0 and not weighted:
        raise ValueError(
            f"source.epoch_size={epoch_size} cannot be filled: every part has a fixed count (samples), so an "
            f"epoch is exactly {fixed}; set it to that, or to null, or give a part a weight instead"
        )
    if share < 0:
        raise ValueError(
            f"source.epoch_size={epoch_size} does not match the parts' fixed counts (samples: {fixed} in all): "
            f"set it to at least that, or to null"
        )
    out = np.array([int(s) if s is not None else 0 for s in samples], dtype=np.int64)
    if weighted:
        w = np.array([float(weights[k]) for k in weighted], dtype=np.float64)
        w = w / w.max()  # shares of the largest: weights of 1e308 cannot overflow the sum
        exact = share * w / w.sum()
        counts = np.floor(exact).astype(np.int64)
        left = share - int(counts.sum())
        counts[np.argsort(-(exact - counts), kind="stable")[:left]] += 1
        out[weighted] = counts
    return out


# passes one pass's adjustment may look back (``adjusted_pass``; more for a small part: 2**20 rows)
CHAIN = 32


def _avoid(own: np.ndarray, taken: np.ndarray, head: int) -> np.ndarray:
    """``own`` with its first ``head`` entries clear of ``taken``: those of ``taken`` among them move to just
    after them, the rest stays in place (still a permutation, still in the part's own order but for them)."""
    clash = np.isin(own, taken)
    if not clash[:head].any():
        return own
    end = int(np.flatnonzero(~clash)[head - 1]) + 1  # own[:end] holds head entries clear of taken
    first, moved = own[:end], clash[:end]
    return np.concatenate([first[~moved], first[moved], own[end:]])


def adjusted_pass(part_order: PartOrder, size: int, seed: int, quota: int, k: int) -> np.ndarray:
    """Pass ``k`` of a part read ``quota`` (at most its size) an epoch: its own order, except where an epoch
    straddles passes k - 1 and k: the pass's first entries then skip the samples that epoch took from the end
    of pass k - 1 (they come right after), so no epoch takes a sample twice. Pass k depends on pass k - 1's end
    only where its own skips reached there; the walk back stops at a pass read as drawn, or every ``CHAIN``
    passes (2**20 rows for a small part; there the previous end is taken as drawn, and an epoch of a part read
    nearly its size an epoch may take a sample twice)."""

    def straddle(j: int) -> int:  # entries of pass j - 1 that the epoch reading the start of pass j takes
        return (j * size) % quota if j > 0 else 0

    chain = max(CHAIN, (1 << 20) // size)
    start = k
    while True:
        r = straddle(start)
        if r == 0 or start % chain == 0 or start == 1 or straddle(start - 1) == 0 or quota + r <= size:
            break  # pass start - 1's end is as drawn (its skips stayed in its first quota entries), or none
        start -= 1
    current = None
    for j in range(start, k + 1):
        drawn = np.asarray(part_order(seed, j), dtype=np.int64)
        r = straddle(j)
        if r:
            before = current if j > start else np.asarray(part_order(seed, j - 1), dtype=np.int64)
            drawn = _avoid(drawn, before[size - r :], quota - r)
        current = drawn
    return current


def stream(
    part_order: PartOrder, size: int, seed: int, start: int, count: int, quota: int | None = None
) -> np.ndarray:
    """Entries ``start`` .. ``start + count`` of a part's endless run of passes (each ``part_order(seed,
    k)``): the rows it gives. ``quota``: read that many an epoch, at most the part's size: passes adjusted so
    that no epoch takes a sample twice (``adjusted_pass``)."""
    if count <= 0 or size <= 0:
        return np.zeros(0, dtype=np.int64)
    first, last = start // size, (start + count - 1) // size
    if quota is not None and quota <= size:
        passes = [adjusted_pass(part_order, size, seed, quota, k) for k in range(first, last + 1)]
    else:
        passes = [np.asarray(part_order(seed, k), dtype=np.int64) for k in range(first, last + 1)]
    run = np.concatenate(passes) if len(passes) > 1 else passes[0]
    offset = start - first * size
    return run[offset : offset + count]


def interleave(counts: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The part each slot of the epoch reads: ``counts[p]`` slots of part p, shuffled from (seed, epoch)."""
    slots = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 7]).permutation(slots)


def part_seed(seed: int, part: int) -> int:
    """The seed of part ``part``'s passes: its own, so two parts never walk in step."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(part), 11]).generate_state(1)[0])


def mix_order(
    part_orders: Sequence[PartOrder],
    sizes: Sequence[int],
    offsets: Sequence[int],
    counts: np.ndarray,
    seed: int,
    epoch: int,
) -> np.ndarray:
    """The epoch's global order: part offset + row, slot by slot (int64, ``counts.sum()`` entries)."""
    slots = interleave(counts, seed, epoch)
    out = np.empty(len(slots), dtype=np.int64)
    for p, (order, size) in enumerate(zip(part_orders, sizes)):
        count = int(counts[p])
        rows = stream(order, int(size), part_seed(seed, p), int(epoch) * count, count, quota=count)
        out[slots == p] = int(offsets[p]) + rows
    return out

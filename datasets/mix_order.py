"""A mix's epoch: how many samples each part gives, which ones, and in what order. Pure functions of
(seed, epoch), so an epoch's draw is the same in every rank, worker and resumed run, and a position in it is
one number (``datamodules/order.py``).

    quotas      samples per part per epoch: a part's ``samples``, as given; the rest of the epoch shared by
                ``weight``, rounded so the counts add up exactly (largest remainder)
    stream      a part's samples, read as an endless run of passes: pass k is the part's own order for
                (its seed, k), a permutation (a shards part's is chunk-aware). Epoch e takes the part's next
                ``quota`` entries, from ``e * quota``: without replacement while the part lasts, then on into
                the next pass, so over epochs every sample of an undersampled part comes before any comes
                twice, and an oversampled part repeats each sample ``quota / size`` times, give or take one
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


def stream(part_order: PartOrder, size: int, seed: int, start: int, count: int) -> np.ndarray:
    """Entries ``start`` .. ``start + count`` of a part's endless run of passes (each ``part_order(seed,
    k)``): the rows it gives."""
    if count <= 0 or size <= 0:
        return np.zeros(0, dtype=np.int64)
    first, last = start // size, (start + count - 1) // size
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
        rows = stream(order, int(size), part_seed(seed, p), int(epoch) * int(counts[p]), int(counts[p]))
        out[slots == p] = int(offsets[p]) + rows
    return out

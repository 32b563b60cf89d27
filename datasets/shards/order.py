"""The epoch order of a split kept in chunks: a pure function of (seed, epoch), touching few chunks at a time.

A global shuffle reads every chunk in every batch. Here the chunks are permuted per epoch, cut into windows
of ``window`` consecutive chunks of that permutation, and the samples of each window are shuffled together
by a bijection of the window's own (a Feistel network keyed by (seed, epoch, window), ``datasets/orders.py``).
Nothing of the epoch is built: any position's sample is found from the chunk permutation (O(chunks)) alone,
so a rank reads only the positions it reads.
A stretch of the order no longer than a window's samples touches at most two windows, ``2 * window``
chunks; a batch of B on each of W ranks is such a stretch of B * W entries (``datamodules/epoch/order.py``).
Mixing inside a window is as good as the chunks are mixed: the shards writer writes in a seeded random
order (``out.shuffle``), so every chunk already holds a sample of the classes.

Measured (``benchmarks/shard_mixing.py``: ImageNet-like, 1.28M samples in 2,209 chunks of 580, batch 256):
on shuffled chunks a batch draws as many classes as a global shuffle's (226) at every window; what a small
window keeps is the company: of a sample's 255 batchmates, 81.6 (window 1), 1.7 (8), 0.16 (32) share its batch
again the next epoch, against 0.05 for a global shuffle. On chunks sorted by class a batch draws 2 (window 1),
12 (8), 43 (32), 76 (64) classes. The default, 32, is the smallest window within 4x of a global shuffle's
repeats, at 64 chunks (4 GiB of 64 MB chunks) held at once.
"""

from __future__ import annotations

import numpy as np

from feedline.datasets.orders import Order, check_positions, feistel, half_bits, round_keys, window_keys


def check_window(value, key: str = "source.window") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise ValueError(
            f"{key}={value!r} must be an integer >= 1: the chunks whose samples are shuffled together"
        )
    return int(value)


class ChunkWindows(Order):
    """The split's samples in the order epoch ``epoch`` reads them, read by position: O(chunks) memory.

    The chunks are permuted (``rng.permutation``, O(C)); window w holds the samples of permuted chunks
    ``w * window`` .. ``(w + 1) * window``, shuffled by a bijection of its own (``feistel``, keyed by
    (seed, epoch, w)), so any position's sample is two binary searches and a few rounds of integer mixing."""

    def __init__(self, bounds: np.ndarray, window: int, seed: int, epoch: int):
        bounds = np.asarray(bounds, dtype=np.int64)
        sizes = np.diff(bounds)
        window = min(int(window), max(1, len(sizes)))  # a window of every chunk (or more) is a global shuffle
        chunks = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 2]).permutation(len(sizes))
        self.starts = bounds[:-1][chunks]  # the split's first sample of each permuted chunk
        self.cum = np.zeros(len(sizes) + 1, dtype=np.int64)  # where each permuted chunk begins in the order
        np.cumsum(sizes[chunks], out=self.cum[1:])
        self.windows = self.cum[np.append(np.arange(0, len(sizes), window), len(sizes))]
        wsizes = np.diff(self.windows)
        self.bits = half_bits(wsizes)
        self.wsizes = wsizes
        self.keys = round_keys(seed, epoch, 3)

    def __len__(self) -> int:
        return int(self.cum[-1])

    def take(self, positions: np.ndarray) -> np.ndarray:
        at = check_positions(positions, len(self))
        w = np.searchsorted(self.windows, at, side="right") - 1
        begin = self.windows[w]
        shuffled = begin + feistel(at - begin, self.wsizes[w], window_keys(self.keys, w), self.bits[w])
        k = np.searchsorted(self.cum, shuffled, side="right") - 1
        return self.starts[k] + (shuffled - self.cum[k])


def chunk_order(bounds: np.ndarray, window: int, seed: int, epoch: int) -> ChunkWindows:
    """The split's samples in the order epoch ``epoch`` reads them. ``bounds`` (C + 1): chunk c holds the
    split's samples ``bounds[c]:bounds[c + 1]`` (a split's rows are sorted, so each chunk's are a run)."""
    return ChunkWindows(bounds, window, seed, epoch)

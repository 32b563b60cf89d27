"""The epoch order of a split kept in chunks: a pure function of (seed, epoch), touching few chunks at a time.

A global shuffle reads every chunk in every batch. Here the chunks are permuted per epoch, cut into windows
of ``window`` consecutive chunks of that permutation, and the samples of each window are shuffled together.
A stretch of the order no longer than a window's samples touches at most two windows, ``2 * window``
chunks; a batch of B on each of W ranks is such a stretch of B * W entries (``datamodules/epoch/order.py``).
Mixing inside a window is as good as the chunks are mixed: the shards writer writes in a seeded random
order (``out.shuffle``), so every chunk already holds a sample of the classes.

Measured (``benchmarks/shard_mixing.py``: ImageNet-like, 1.28M samples in 2,209 chunks of 580, batch 256):
on shuffled chunks a batch draws as many classes as a global shuffle's (226) at every window; what a small
window keeps is the company: of a sample's 255 batchmates, 82 (window 1), 1.7 (8), 0.16 (32) share its batch
again the next epoch, against 0.05 for a global shuffle. On chunks sorted by class a batch draws 2 (window 1),
12 (8), 43 (32), 76 (64) classes. The default, 32, is the smallest window within 4x of a global shuffle's
repeats, at 64 chunks (4 GiB of 64 MB chunks) held at once.
"""

from __future__ import annotations

import numpy as np


def check_window(value, key: str = "source.window") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise ValueError(
            f"{key}={value!r} must be an integer >= 1: the chunks whose samples are shuffled together"
        )
    return int(value)


def chunk_order(bounds: np.ndarray, window: int, seed: int, epoch: int) -> np.ndarray:
    """The split's samples in the order epoch ``epoch`` reads them (int64). ``bounds`` (C + 1): chunk c holds
    the split's samples ``bounds[c]:bounds[c + 1]`` (a split's rows are sorted, so each chunk's are a run)."""
    bounds = np.asarray(bounds, dtype=np.int64)
    sizes = np.diff(bounds)
    window = min(int(window), max(1, len(sizes)))  # a window of every chunk (or more) is a global shuffle
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 2])
    chunks = rng.permutation(len(sizes))
    lengths = sizes[chunks]
    # the samples of the permuted chunks, one run each: start of its run + position within it
    starts = np.repeat(bounds[chunks], lengths)
    offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    samples = starts + offsets
    windows = np.repeat(np.arange(len(chunks), dtype=np.int64) // int(window), lengths)
    return samples[np.lexsort((rng.random(len(samples)), windows))]

"""Seeded, stratified train/val splits, cached as index arrays next to the index they split.

The split depends only on the per-class counts, the fraction and the seed, so every backend that holds
the same samples in the same class-major order (a folder tree, its lazy layout, its HDF5 conversion)
validates on the same samples.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def check_fraction(value) -> float:
    """``source.val_fraction`` as a float in [0, 1), or an error naming the key."""
    fraction = float(value)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"source.val_fraction={value} must be in [0, 1)")
    return fraction


def stratified_split(counts, fraction: float, seed: int, order=None) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) sample indices, each sorted.

    Class c holds ``counts[c]`` samples: consecutive indices in class-major order, or, when ``order``
    is given (``argsort(labels, kind="stable")`` of data that is not class-major), the indices
    ``order[start_c : start_c + counts[c]]``. Each class gives ``round(fraction * count)`` samples to val,
    chosen by a generator seeded with ``seed``.
    """
    check_fraction(fraction)
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    val = []
    for start, n in zip(starts, counts):
        k = int(round(fraction * n))
        if k:
            val.append(start + rng.choice(n, size=k, replace=False))
    total = int(counts.sum())
    val_idx = np.concatenate(val) if val else np.zeros(0, dtype=np.int64)
    if order is not None:
        val_idx = np.asarray(order, dtype=np.int64)[val_idx]
    val_idx = np.sort(val_idx)
    mask = np.ones(total, dtype=bool)
    mask[val_idx] = False
    return np.flatnonzero(mask).astype(np.int64), val_idx.astype(np.int64)


def cached_split(directory, counts, fraction: float, seed: int, name: str, order=None) -> Path:
    """Path of the ``name`` ("train"/"val") index array for this split, written atomically once."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tag = f"split-{seed}-{fraction:.6g}"
    path = directory / f"{tag}-{name}.npy"
    if not path.exists():
        for part, arr in zip(("train", "val"), stratified_split(counts, fraction, seed, order)):
            fd, tmp = tempfile.mkstemp(prefix=f".{tag}-{part}", suffix=".npy", dir=directory)
            with os.fdopen(fd, "wb") as f:
                np.save(f, arr)
            os.replace(tmp, directory / f"{tag}-{part}.npy")
    return path

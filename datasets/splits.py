"""Seeded, stratified train/val splits, cached as index arrays next to the index they split."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def stratified_split(counts, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split class-major sample ranges (class c holds ``counts[c]`` consecutive indices).

    Each class gives ``round(fraction * count)`` samples to val, chosen by a generator seeded with
    ``seed``, so the val set keeps the class balance and is the same on every rank and every run.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"source.val_fraction={fraction} must be in [0, 1)")
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    val = []
    for start, n in zip(starts, counts):
        k = int(round(fraction * n))
        if k:
            val.append(start + rng.choice(n, size=k, replace=False))
    total = int(np.sum(counts))
    val_idx = np.sort(np.concatenate(val)) if val else np.zeros(0, dtype=np.int64)
    mask = np.ones(total, dtype=bool)
    mask[val_idx] = False
    return np.flatnonzero(mask).astype(np.int64), val_idx.astype(np.int64)


def cached_split(directory, counts, fraction: float, seed: int, name: str) -> Path:
    """Path of the ``name`` ("train"/"val") index array for this split, written atomically once."""
    directory = Path(directory)
    tag = f"split-{seed}-{fraction:.6g}"
    path = directory / f"{tag}-{name}.npy"
    if not path.exists():
        train, val = stratified_split(counts, fraction, seed)
        for part, arr in (("train", train), ("val", val)):
            fd, tmp = tempfile.mkstemp(prefix=f".{tag}-{part}", suffix=".npy", dir=directory)
            with os.fdopen(fd, "wb") as f:
                np.save(f, arr)
            os.replace(tmp, directory / f"{tag}-{part}.npy")
    return path

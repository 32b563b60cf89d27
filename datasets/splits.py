"""Seeded, stratified train/val splits, cached as row arrays next to the cache of the data they split.

The split depends only on the per-class counts, the fraction and the seed, so every backend that holds
the same samples in the same class-major order (a folder tree, its lazy layout, its HDF5 conversion)
validates on the same samples.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from feedline.datasets.cache import check_array, save_array
from feedline.datasets.records import InMemoryArray, LazyArray

log = logging.getLogger(__name__)


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


def split_rows(name: str, counts, fraction: float, seed: int, directory=None, order=None):
    """The rows of split ``name`` ("train" or "val"): a LazyArray over a file in ``directory``, written
    atomically the first time, or, with no ``directory``, an InMemoryArray. Same arguments, same rows."""
    if name not in ("train", "val"):
        raise ValueError(f"a seeded split is 'train' or 'val', not {name!r}")
    if directory is None:
        return InMemoryArray(stratified_split(counts, fraction, seed, order)[name == "val"])
    directory = Path(directory)
    tag = f"split-{seed}-{fraction:.6g}"
    paths = {part: directory / f"{tag}-{part}.npy" for part in ("train", "val")}
    first_use = not any(p.exists() or p.with_name(p.name + ".sum").exists() for p in paths.values())
    if first_use or not _sound(paths, counts, fraction):
        for part, rows in zip(("train", "val"), stratified_split(counts, fraction, seed, order)):
            save_array(paths[part], rows)
    return LazyArray(paths[name])


def _sound(paths: dict, counts, fraction: float) -> bool:
    """Whether the cached train/val rows can be trusted: both read back, sorted, in range, with the sizes
    the split must have. O(samples) in numpy, a few ms at 1M; a damaged pair is rewritten with a warning."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    val_size = int(sum(round(fraction * int(n)) for n in counts))
    try:
        for path in paths.values():
            reason = check_array(path)
            if reason:
                raise ValueError(reason)
        train, val = (np.load(paths[part], mmap_mode="r") for part in ("train", "val"))
        for part, rows, size in (("train", train, total - val_size), ("val", val, val_size)):
            if rows.shape != (size,) or rows.dtype != np.int64:
                raise ValueError(f"{part}: shape {rows.shape}, dtype {rows.dtype}; expected ({size},) int64")
            if size and (rows[0] < 0 or rows[-1] >= total or np.any(rows[1:] <= rows[:-1])):
                raise ValueError(f"{part}: rows out of order or out of range")
    except (OSError, ValueError, EOFError) as err:
        log.warning("split cache %s is damaged (%s); rebuilding it", paths["train"].parent, err)
        return False
    return True


SPLITS = ("train", "val", "all")  # all: every sample of the source, in its order (what conversions read)


def check_split(name: str) -> str:
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; sources have {', '.join(SPLITS)}")
    return name


def subset_for(name: str, counts, fraction: float, seed: int, directory=None, order=None):
    """The rows of split ``name`` of one source: None for every row ("all", or "train" without a val
    share), else the seeded split's rows (``split_rows``)."""
    check_split(name)
    if name == "all" or (name == "train" and not fraction):
        return None
    return split_rows(name, counts, fraction, seed, directory, order)

"""Seeded, stratified train/val/test splits, cached as row arrays next to the cache of the data they split.

The split depends only on the per-class counts, the fraction and the seed, so every backend that holds
the same samples in the same class-major order (a folder tree, its lazy layout, its HDF5 conversion)
validates on the same samples.
"""

from __future__ import annotations

import hashlib
import logging
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np

from feedline.datasets.arrays import InMemoryArray, LazyArray
from feedline.datasets.cache import (
    add_to_record,
    array_record,
    check_array,
    check_record,
    save_array,
    save_blocks,
)

log = logging.getLogger(__name__)


def check_fraction(value, key: str = "source.val_fraction") -> float:
    """A held-out share as a float in [0, 1), or an error naming the key."""
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r} is not a number") from None
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"{key}={value} must be in [0, 1)")
    return fraction


def check_seed(value, key: str = "source.seed") -> int:
    """A split seed: an integer from 0 to 2**64 - 1 (numpy's generators refuse negative ones), or an error
    naming the key."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < 2**64:
        raise ValueError(f"{key}={value!r} must be an integer from 0 to 2**64 - 1 (it seeds the split)")
    return int(value)


def check_fractions(val, test) -> tuple[float, float]:
    """``source.val_fraction`` and ``source.test_fraction``, which must leave samples to train on."""
    val, test = check_fraction(val), check_fraction(test, "source.test_fraction")
    if val + test >= 1.0:
        raise ValueError(
            f"source.val_fraction={val} + source.test_fraction={test} must stay below 1: nothing is left to train on"
        )
    return val, test


PARTS = ("train", "val", "test")
SHOWN = 10  # classes named per warning
RULE = "-halfup"  # in the cache file names: splits cached under the earlier rounding are not read back


def _round_half_up(fraction: float, counts) -> list[int]:
    """``fraction * n`` rounded half up, on the fraction as written (``0.29`` is 29/100, not the float
    just below it), so ``0.5`` of 3 is 2 and of 5 is 3, whatever the float arithmetic would say."""
    share = Fraction(str(fraction))
    p, q = share.numerator, share.denominator
    return [(2 * p * int(n) + q) // (2 * q) for n in counts]


def _rounded(counts, fraction: float, test_fraction: float):
    counts = np.asarray(counts, dtype=np.int64)
    val, test = (
        np.asarray(_round_half_up(f, counts), dtype=np.int64).reshape(counts.shape)
        for f in (fraction, test_fraction)
    )
    return counts, val, test


def held_out(counts, fraction: float, test_fraction: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per class, how many samples go to val and how many to test (the rest train).

    The rule: class c gives ``fraction * counts[c]`` to val and ``test_fraction * counts[c]`` to test,
    each rounded half up; when that would leave the class nothing to train on, its test share, then its
    val share, gives one back, so every class with a sample keeps at least one for training."""
    counts, val, test = _rounded(counts, fraction, test_fraction)
    over = np.maximum(
        val + test - counts + np.minimum(counts, 1), 0
    )  # one past what leaves a training sample
    back = np.minimum(test, over)
    return val - (over - back), test - back


def warn_untrained(classes, counts, fraction: float, test_fraction: float = 0.0) -> None:
    """Warn, naming them, about classes that get no training sample (they have none), and about those that
    keep one only because ``held_out`` gave it back from their held-out shares."""
    counts, val, test = _rounded(counts, fraction, test_fraction)
    empty = np.flatnonzero(counts == 0).tolist()
    kept = np.flatnonzero((counts > 0) & (val + test >= counts)).tolist()
    names = list(classes) if classes is not None else [str(c) for c in range(len(counts))]

    def shown(indices: list[int]) -> str:
        listed = ", ".join(f"'{names[c]}' ({int(counts[c])})" for c in indices[:SHOWN])
        return listed + (f" and {len(indices) - SHOWN} more" if len(indices) > SHOWN else "")

    if empty:
        log.warning("%d class(es) get no training sample, having none: %s", len(empty), shown(empty))
    if kept:
        keys = f"source.val_fraction={fraction}" + (
            f" + source.test_fraction={test_fraction}" if test_fraction else ""
        )
        log.warning(
            "%s, rounded half up, would hold out every sample of %d class(es) (samples in brackets): %s; "
            "each keeps one for training instead (taken back from test first, then val). Lower the "
            "fractions, or give these classes more samples",
            keys,
            len(kept),
            shown(kept),
        )


BLOCK = 1 << 22  # rows per block where a split file is written or read whole


def stratified_split(counts, fraction: float, seed: int, order=None, test_fraction: float = 0.0):
    """(train, val, test) sample indices, each sorted.

    Class c holds ``counts[c]`` samples: consecutive indices in class-major order, or, when ``order``
    is given (``argsort(labels, kind="stable")`` of data that is not class-major), the indices
    ``order[start_c : start_c + counts[c]]``; ``order`` may be a callable that returns ``order[idx]`` for the
    class-major indices ``idx`` drawn (called only here, where a split is drawn: no argsort of every label,
    ``shards/labels.class_order_at``). Each
    class gives ``held_out`` samples to val and to test, drawn together by a generator seeded with ``seed``
    (without a test share the draws, and so val, are those of a train/val split).
    """
    val, test = _held(counts, fraction, seed, order, test_fraction)
    total = int(np.asarray(counts, dtype=np.int64).sum())
    blocks = list(_complement(total, (val, test)))
    train = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
    return train, val, test


def _held(counts, fraction: float, seed: int, order, test_fraction: float) -> list[np.ndarray]:
    """[val, test]: ``stratified_split``'s held-out rows, each sorted (int64)."""
    check_fractions(fraction, test_fraction)
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    val, test = [], []
    for start, n, k, t in zip(starts, counts, *held_out(counts, fraction, test_fraction)):
        k, t = int(k), int(t)
        if k + t:
            drawn = start + rng.choice(n, size=k + t, replace=False)
            val.append(drawn[:k])
            test.append(drawn[k:])
    idx = [np.concatenate(part) if part else np.zeros(0, dtype=np.int64) for part in (val, test)]
    if callable(order) and len(idx[0]) + len(idx[1]):  # both at once: one pass over what it reads
        rows = np.asarray(order(np.concatenate(idx)), dtype=np.int64)
        idx = [rows[: len(idx[0])], rows[len(idx[0]) :]]
    elif order is not None and not callable(order):
        idx = [np.asarray(order, dtype=np.int64)[part] for part in idx]
    return [np.sort(part).astype(np.int64) for part in idx]


def _complement(total: int, held, block: int | None = None):
    """The rows of ``[0, total)`` in none of the sorted arrays ``held`` (the train rows), a block at a time:
    O(block) memory besides ``held``."""
    block = block or BLOCK
    for a in range(0, total, block):
        b = min(a + block, total)
        keep = np.ones(b - a, dtype=bool)
        for idx in held:
            lo, hi = np.searchsorted(idx, [a, b])
            keep[idx[lo:hi] - a] = False
        rows = np.flatnonzero(keep).astype(np.int64, copy=False)
        rows += a
        yield rows


def split_digest(total: int, blocks) -> str:
    """``Records.digest`` of a split of ``total`` rows whose row array is the concatenation of ``blocks``: which
    rows of how many, as 16 hex digits."""
    h = hashlib.blake2b(str(int(total)).encode(), digest_size=8)
    for block in blocks:
        h.update(np.ascontiguousarray(block, dtype=np.int64).data)
    return h.hexdigest()


def recorded_digest(rows, total: int) -> str | None:
    """The digest recorded beside a split's cached row file (``split_rows``: when it was written, or first found
    sound), where ``rows`` is one (a LazyArray) and its record is of this file and ``total``; else None. O(1)."""
    path = getattr(rows, "path", None)
    record = array_record(path) if path is not None else None
    known = record.get("rows") if record else None
    if not isinstance(known, dict) or known.get("total") != int(total) or not known.get("digest"):
        return None
    return None if check_record(path, record) else str(known["digest"])


def _sizes(counts, fraction: float, test_fraction: float) -> dict[str, int]:
    val, test = (int(part.sum()) for part in held_out(counts, fraction, test_fraction))
    total = int(np.asarray(counts, dtype=np.int64).sum())
    return {"train": total - val - test, "val": val, "test": test}


def split_paths(counts, fraction: float, seed: int, directory, test_fraction=0.0) -> dict[str, Path]:
    """Where ``split_rows`` caches each part of this split in ``directory``."""
    # The counts are in the name: a split drawn for other counts (the data changed, another process shares
    # the cache) is never read back as this one, even where its sizes happen to agree.
    drawn_for = zlib.crc32(np.asarray(counts, dtype=np.int64).tobytes())
    tag = f"split-{seed}-{fraction!r}" + (f"-test-{test_fraction!r}" if test_fraction else "") + RULE
    tag += f"-{drawn_for:08x}"
    parts = PARTS if test_fraction else PARTS[:2]
    return {part: Path(directory) / f"{tag}-{part}.npy" for part in parts}


def split_rows(name: str, counts, fraction: float, seed: int, directory=None, order=None, test_fraction=0.0):
    """The rows of split ``name`` ("train", "val" or "test"): a LazyArray over a file in ``directory``,
    written atomically the first time, or, with no ``directory``, an InMemoryArray. Same arguments,
    same rows. ``order`` (see ``stratified_split``) may be a callable: it is called only where a split is drawn,
    never where the cached one is read back."""
    if name not in PARTS:
        raise ValueError(f"a seeded split is one of {', '.join(PARTS)}, not {name!r}")
    if directory is None:
        return InMemoryArray(
            stratified_split(counts, fraction, seed, order, test_fraction)[PARTS.index(name)]
        )
    paths = split_paths(counts, fraction, seed, directory, test_fraction)
    first_use = not any(p.exists() or p.with_name(p.name + ".sum").exists() for p in paths.values())
    if first_use or not _sound(paths, counts, fraction, test_fraction):
        _draw(paths, counts, fraction, seed, order, test_fraction)
    rows = LazyArray(paths[name])
    rows.array  # noqa: B018 - mapped now: workers inherit this very file, or refuse one that replaced it
    return rows


def _draw(paths: dict, counts, fraction: float, seed: int, order, test_fraction: float) -> None:
    """Draw the split and write its parts, the train rows a block at a time (never held whole). Each file's
    record says what its rows were made to be (sorted, in range, of ``total``) and their digest, so a reader
    checks O(1) things and reads no row to digest them."""
    total = int(np.asarray(counts, dtype=np.int64).sum())
    held = _held(counts, fraction, seed, order, test_fraction)
    for part, rows in zip(PARTS[1:], held):
        if part in paths:
            save_array(paths[part], rows, {"rows": {"total": total, "digest": split_digest(total, [rows])}})
    h = hashlib.blake2b(str(total).encode(), digest_size=8)

    def blocks():
        for block in _complement(total, held):
            h.update(block.data)
            yield block

    save_blocks(
        paths["train"],
        np.int64,
        total - sum(len(rows) for rows in held),
        blocks(),
        lambda: {"rows": {"total": total, "digest": h.hexdigest()}},
    )


def _sound(paths: dict, counts, fraction: float, test_fraction: float) -> bool:
    """Whether the cached split rows can be trusted: each is the file written (its stat record), with the
    size the split must have, its first and last rows in range; sorted and digested when written (its record
    says so), or, a file written before records said so, read once here, then recorded. A damaged set is
    rewritten with a warning."""
    total = int(np.asarray(counts, dtype=np.int64).sum())
    sizes = _sizes(counts, fraction, test_fraction)
    try:
        for part, path in paths.items():
            reason = check_array(path)
            if reason:
                raise ValueError(reason)
            rows, size = np.load(path, mmap_mode="r"), sizes[part]
            if rows.shape != (size,) or rows.dtype != np.int64:
                raise ValueError(f"{part}: shape {rows.shape}, dtype {rows.dtype}; expected ({size},) int64")
            if size and (rows[0] < 0 or rows[-1] >= total):
                raise ValueError(f"{part}: rows out of range")
            known = (array_record(path) or {}).get("rows")
            if isinstance(known, dict) and known.get("total") == total and known.get("digest"):
                continue
            if not _ascending(rows):
                raise ValueError(f"{part}: rows out of order")
            blocks = (rows[a : a + BLOCK] for a in range(0, size, BLOCK))  # digested as written
            add_to_record(path, {"rows": {"total": total, "digest": split_digest(total, blocks)}})
    except (OSError, ValueError, EOFError) as err:
        log.warning("split cache %s is damaged (%s); rebuilding it", paths["train"].parent, err)
        return False
    return True


def _ascending(rows: np.ndarray, block: int | None = None) -> bool:
    """Whether ``rows`` strictly increase, read a block at a time (bounded temporaries)."""
    block = block or BLOCK
    for a in range(0, len(rows) - 1, block):
        seg = rows[a : a + block + 1]
        if np.any(seg[1:] <= seg[:-1]):
            return False
    return True


SPLITS = (
    "train",
    "val",
    "test",
    "all",
)  # all: every sample of the source, in its order (what conversions read)


def check_split(name: str) -> str:
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; sources have {', '.join(SPLITS)}")
    return name


def subset_for(
    name: str, counts, fraction: float, seed: int, directory=None, order=None, test_fraction=0.0, classes=None
):
    """The rows of split ``name`` of one source: None for every row ("all", or "train" with nothing
    held out), else the seeded split's rows (``split_rows``). For "train", classes (named by ``classes``)
    that get no training sample, or keep one only by the rule of ``held_out``, are named in a warning."""
    check_split(name)
    if name == "train":
        warn_untrained(classes, counts, fraction, test_fraction)
    if name == "all" or (name == "train" and not fraction and not test_fraction):
        return None
    return split_rows(name, counts, fraction, seed, directory, order, test_fraction)


def no_test_split(source: str, keys: str) -> ValueError:
    """The error for ``trainer.test`` on a source configured without a test split."""
    return ValueError(f"{source} has no test split: set {keys}")

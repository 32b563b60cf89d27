"""Epoch orders read by position: any entry of an epoch's order from (seed, epoch) alone, in memory of the
entries asked for, never of the epoch.

    Order          ``len(order)`` entries; ``order.take(positions)`` -> the rows at those positions (int64),
                   vectorised; ``np.asarray(order)`` enumerates it (tests, small splits)
    Identity       position p reads row p (no shuffle)
    Permutation    a seeded bijection of [0, n): a Feistel network on the smallest even number of bits that
                   holds n, walked until it lands inside [0, n) (cycle-walking), so position -> row is O(1)
                   in time and memory; its keys come from (seed, epoch)
    Materialized   an order that is an array already (a mix's draw)

``feistel`` is elementwise in the domain size and keys as well, so a source can shuffle many windows of
different sizes in one call (``datasets/shards/order.py``). Every step is integer arithmetic on uint64: the
same positions give the same rows on every machine and numpy.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6  # Feistel rounds: 4 already make a strong pseudorandom permutation of good round functions
_MASK32 = 0xFFFFFFFF


def _mix(x: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (splitmix64's): every output bit depends on every input bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def round_keys(seed: int, epoch: int, salt: int) -> np.ndarray:
    """``ROUNDS`` keys (uint64) from (seed, epoch, salt)."""
    return np.random.SeedSequence([int(seed) & _MASK32, int(epoch), int(salt)]).generate_state(
        ROUNDS, np.uint64
    )


def window_keys(keys: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """(ROUNDS, len(windows)) keys: each window's own, derived from an epoch's ``keys``."""
    w = np.asarray(windows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix(keys[:, None] ^ _mix(w * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1))[None, :])


def half_bits(sizes) -> np.ndarray:
    """Bits of each half of the Feistel domain for a permutation of ``sizes`` entries: the domain 4**h is the
    smallest power of 4 >= size (at least 4). Exact integer arithmetic (no log2)."""
    v = np.maximum(np.asarray(sizes, dtype=np.int64) - 1, 0).astype(np.uint64)
    bits = np.zeros(v.shape, dtype=np.uint64)
    for s in (32, 16, 8, 4, 2, 1):
        high = v >= np.uint64(1 << s)
        bits += np.where(high, np.uint64(s), np.uint64(0))
        v = np.where(high, v >> np.uint64(s), v)
    bits += (v > 0).astype(np.uint64)  # bit length of size - 1
    return np.maximum((bits + np.uint64(1)) // np.uint64(2), np.uint64(1))


def _rounds(x: np.ndarray, h: np.ndarray, keys: np.ndarray) -> np.ndarray:
    mask = (np.uint64(1) << h) - np.uint64(1)
    left, right = x >> h, x & mask
    with np.errstate(over="ignore"):
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
    return (left << h) | right


def feistel(positions, sizes, keys: np.ndarray, bits=None) -> np.ndarray:
    """Each position (in [0, size)) mapped by a seeded bijection of [0, size); ``sizes``, ``bits``
    (``half_bits(sizes)``) and the columns of ``keys`` (ROUNDS, n) are per position, or one for all
    (``keys`` (ROUNDS,)). Out-of-range images are walked on (cycle-walking) until they land inside."""
    x = np.asarray(positions, dtype=np.int64).astype(np.uint64)
    n = len(x)
    size = np.broadcast_to(np.asarray(sizes, dtype=np.int64).astype(np.uint64), (n,))
    h = np.broadcast_to(half_bits(sizes) if bits is None else np.asarray(bits, dtype=np.uint64), (n,))
    keys = np.asarray(keys, dtype=np.uint64)
    keys = np.broadcast_to(keys[:, None] if keys.ndim == 1 else keys, (len(keys), n))
    out = _rounds(x, h, keys)
    walk = np.flatnonzero(out >= size)
    while len(walk):  # a domain of at most 4x the size: on average under 3 more rounds for those outside
        again = _rounds(out[walk], h[walk], keys[:, walk])
        out[walk] = again
        walk = walk[again >= size[walk]]
    return out.astype(np.int64)


class Order:
    """An epoch's order, read by position (see the module docstring)."""

    def __len__(self) -> int:
        raise NotImplementedError

    def take(self, positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __getitem__(self, key):
        """``order[i]``, ``order[a:b]``, ``order[positions]``: the rows there (negative positions from the end)."""
        if isinstance(key, slice):
            return self.take(np.arange(*key.indices(len(self)), dtype=np.int64))
        at = np.asarray(key, dtype=np.int64)
        if ((at < -len(self)) | (at >= len(self))).any():
            raise IndexError(f"position {key} out of range for an order of {len(self)}")
        rows = self.take(np.atleast_1d(at % max(len(self), 1)))
        return int(rows[0]) if at.ndim == 0 else rows

    def __array__(self, dtype=None, copy=None):
        rows = self.take(np.arange(len(self), dtype=np.int64))
        return rows if dtype is None else rows.astype(dtype)


class Identity(Order):
    def __init__(self, size: int):
        self.size = int(size)

    def __len__(self) -> int:
        return self.size

    def take(self, positions: np.ndarray) -> np.ndarray:
        return np.array(positions, dtype=np.int64)


class Permutation(Order):
    """The rows of a split of ``size`` in a seeded order from (seed, epoch): O(1) per position."""

    def __init__(self, size: int, seed: int, epoch: int, salt: int = 1):
        self.size = int(size)
        self.keys = round_keys(seed, epoch, salt)
        self.bits = half_bits(self.size)

    def __len__(self) -> int:
        return self.size

    def take(self, positions: np.ndarray) -> np.ndarray:
        return feistel(positions, self.size, self.keys, self.bits)


class Materialized(Order):
    """An order that is already an array of rows."""

    def __init__(self, rows):
        self.rows = np.asarray(rows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, positions: np.ndarray) -> np.ndarray:
        return self.rows[np.asarray(positions, dtype=np.int64)]


def as_order(order) -> Order:
    """A source's ``epoch_order`` result as an ``Order``: a lazy one as it is, an array wrapped."""
    return order if isinstance(order, Order) else Materialized(order)

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

ROUNDS = 6  # Feistel rounds: 4 already make a strong pseudorandom permutation of a large domain
# A small domain (below 4**SMALL_BITS) is a few round functions of a few bits: more rounds make its
# permutations as even as a random shuffle's (size 5: each row at each position 20% of seeds, +-0.3%)
SMALL_BITS, SMALL_ROUNDS = 6, 24
_MASK32 = 0xFFFFFFFF


def _mix(x: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (splitmix64's): every output bit depends on every input bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def round_keys(seed: int, epoch: int, salt: int) -> np.ndarray:
    """``SMALL_ROUNDS + 1`` keys (uint64) from (seed, epoch, salt): a key per round, and the last for parity."""
    seq = np.random.SeedSequence([int(seed) & _MASK32, int(epoch), int(salt)])
    return seq.generate_state(SMALL_ROUNDS + 1, np.uint64)


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
    """The Feistel rounds: ``ROUNDS`` for every entry, ``SMALL_ROUNDS`` for those of a small domain."""
    mask = (np.uint64(1) << h) - np.uint64(1)
    left, right = x >> h, x & mask
    with np.errstate(over="ignore"):
        for k in keys[:ROUNDS]:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        small = np.flatnonzero(h < np.uint64(SMALL_BITS))
        if len(small):
            sl, sr, sm = left[small], right[small], mask[small]
            for k in keys[ROUNDS:SMALL_ROUNDS, small]:
                sl, sr = sr, sl ^ (_mix(sr ^ k) & sm)
            left[small], right[small] = sl, sr
    return (left << h) | right


def feistel(positions, sizes, keys: np.ndarray, bits=None) -> np.ndarray:
    """Each position (in [0, size)) mapped by a seeded bijection of [0, size); ``sizes``, ``bits``
    (``half_bits(sizes)``) and the columns of ``keys`` (SMALL_ROUNDS + 1, n) are per position, or one for all
    (``keys`` (SMALL_ROUNDS + 1,)). Out-of-range images are walked on (cycle-walking) until they land inside.
    Balanced Feistel rounds only make even permutations of their domain: the last key's low bit swaps rows 0
    and 1, so odd ones are drawn as often."""
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
    odd = ((keys[-1] & np.uint64(1)) == 1) & (out < np.uint64(2)) & (size >= np.uint64(2))
    out[odd] ^= np.uint64(1)
    return out.astype(np.int64)


def check_positions(positions, size: int) -> np.ndarray:
    """``positions`` as int64, each in [0, size), or an IndexError naming the first outside."""
    at = np.asarray(positions, dtype=np.int64)
    bad = (at < 0) | (at >= size)
    if bad.any():
        raise IndexError(f"position {int(at[bad][0])} is outside an epoch order of {size} samples")
    return at


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
        return check_positions(positions, self.size).copy()


class Permutation(Order):
    """The rows of a split of ``size`` in a seeded order from (seed, epoch): O(1) per position."""

    def __init__(self, size: int, seed: int, epoch: int, salt: int = 1):
        self.size = int(size)
        self.keys = round_keys(seed, epoch, salt)
        self.bits = half_bits(self.size)

    def __len__(self) -> int:
        return self.size

    def take(self, positions: np.ndarray) -> np.ndarray:
        return feistel(check_positions(positions, self.size), self.size, self.keys, self.bits)


class Materialized(Order):
    """An order that is already an array of rows."""

    def __init__(self, rows):
        self.rows = np.asarray(rows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, positions: np.ndarray) -> np.ndarray:
        return self.rows[check_positions(positions, len(self.rows))]


def as_order(order) -> Order:
    """A source's ``epoch_order`` result as an ``Order``: a lazy one as it is, an array wrapped."""
    return order if isinstance(order, Order) else Materialized(order)

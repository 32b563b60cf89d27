"""MixRecords: the parts' records as one RecordSet. A row's part is one lookup; its label is mapped into the
mix's classes. The train split's order is the epoch's draw (``datasets/mix/order.py``)."""

from __future__ import annotations

import hashlib

import numpy as np

from feedline.datasets.mix.labels import remap
from feedline.datasets.mix.order import mix_order


class MixRecords:
    """One split of the mix: the parts' records one after another (part p holds rows ``offsets[p]`` ..
    ``offsets[p + 1]``), labels mapped to the mix's classes. The train split draws its epochs
    (``epoch_order``, ``epoch_samples``); every split tells the part of a row (``part_of``)."""

    def __init__(self, names, records, maps, counts=None, field_maps=None):
        self.names, self.records, self.maps = list(names), list(records), list(maps)
        # each part's {field: (kind, map)} into the mix's merged class lists (``labels.merge_fields``)
        self.field_maps = list(field_maps) if field_maps is not None else [{} for _ in self.records]
        self.offsets = np.concatenate([[0], np.cumsum([len(r) for r in self.records])]).astype(np.int64)
        self.counts = counts  # samples per part per epoch (train), or None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def part_of(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        return int(np.searchsorted(self.offsets, i, side="right") - 1)

    def __getitem__(self, i: int):
        p = self.part_of(i)
        return self._mapped(p, self.records[p][i - int(self.offsets[p])])

    def _mapped(self, p: int, record):
        """A part's record with its label mapped to the mix's classes; a record of named fields with each
        field's indices mapped to the merged class lists (``labels.remap``)."""
        if isinstance(record, dict):
            return remap(record, self.field_maps[p], self.names[p])
        payload, label = record
        return payload, int(self.maps[p][label]) if label >= 0 else label

    def getitems(self, indices) -> list:
        """A batch read part by part, each as its source reads fastest (HDF5 in bulk)."""
        out: list = [None] * len(indices)
        parts = np.searchsorted(self.offsets, np.asarray(indices, dtype=np.int64), side="right") - 1
        for p in np.unique(parts):
            at = np.flatnonzero(parts == p)
            local = [int(indices[k]) - int(self.offsets[p]) for k in at]
            getitems = getattr(self.records[p], "getitems", None)
            got = getitems(local) if getitems is not None else [self.records[p][j] for j in local]
            for k, record in zip(at, got):
                out[k] = self._mapped(p, record)
        return out

    def describe(self, i: int) -> str:
        p = self.part_of(i)
        return f"{self.names[p]}: {self.records[p].describe(i - int(self.offsets[p]))}"

    # -- the train split's draw ------------------------------------------------------------------------
    def epoch_samples(self) -> int:
        """Samples an epoch draws (the sampler's epoch length; the rows are more or fewer)."""
        return int(self.counts.sum())

    def drawn(self) -> dict[str, int]:
        """Samples each part gives an epoch."""
        return {n: int(c) for n, c in zip(self.names, self.counts)}

    def _part_order(self, p: int):
        own = getattr(self.records[p], "epoch_order", None)  # a shards part keeps its chunk-aware order
        if own is not None:
            return own
        size = len(self.records[p])
        return lambda seed, k: np.random.default_rng([int(seed) & 0xFFFFFFFF, int(k), 1]).permutation(size)

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        sizes = [len(r) for r in self.records]
        orders = [self._part_order(p) for p in range(len(self.records))]
        return mix_order(orders, sizes, self.offsets[:-1], self.counts, seed, epoch)

    def order_identity(self) -> str:
        """What the draw depends on besides (seed, epoch): the parts, their sizes, counts and own orders."""
        rule = b"passes adjusted at epochs that straddle them\n"  # the draw's rule (mix_order.adjusted_pass)
        h = hashlib.blake2b(rule, digest_size=6)
        for name, records, count in zip(self.names, self.records, self.counts):
            own = getattr(records, "order_identity", None)
            h.update(f"{name}\n{len(records)}\n{int(count)}\n{own() if callable(own) else ''}\n".encode())
        drawn = ", ".join(f"{n} {int(c)}" for n, c in zip(self.names, self.counts))
        return f"mix of {drawn} per epoch ({h.hexdigest()})"

    def label_identity(self) -> str:
        """How each part's labels map to the mix's classes (its class_map, label): a resume checks it, as a
        swap within a part keeps the class list and gives its samples other labels."""
        said = [f"{name}:{','.join(map(str, m.tolist()))}" for name, m in zip(self.names, self.maps)]
        for name, maps in zip(self.names, self.field_maps):  # named fields' maps: a mask's table too
            for f, (_, m, convert) in sorted(maps.items()):
                said.append(
                    f"{name}.{f}:{'' if m is None else ','.join(map(str, m.tolist()))}:{convert or ''}"
                )
        return ";".join(said)

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=8)
        for records in self.records:
            digest = getattr(records, "digest", None)
            h.update(f"{len(records)}:{digest() if callable(digest) else ''};".encode())
        return h.hexdigest()

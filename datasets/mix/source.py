"""``source=mix``: several sources as one, each part drawn by weight (or a fixed count) every epoch.

    parts       name -> {source, weight | samples, class_map, label, transforms}; any feedline source
    classes     merged by name: the first part's classes in its order, then each later part's new names in
                its order; a part renames or merges its classes (``class_map``) or labels all its samples
                one class (``label``)
    train       each epoch a draw (``datasets/mix/order.py``): a pure function of (seed, epoch) over the parts'
                train splits, so the sampler, the DDP partition and resume treat it as any source's order
    val, test   the union of the parts' splits, unweighted; each record knows its part (``part_of``), so
                validation reports accuracy per part and the datamodule applies a part's own ``transforms``

A part's records are read as that source reads them (its files, its cache, its S3 endpoint); the mix adds
one lookup (the part of a row) and maps the label. It pickles as its parts' records: small.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline.datasets.mix.checks import check_parts, check_spellings
from feedline.datasets.mix.order import mix_order, quotas
from feedline.datasets.records import Source
from feedline.datasets.splits import check_split

log = logging.getLogger(__name__)

PART_KEYS = ("source", "weight", "samples", "class_map", "label", "transforms")


def _count(value) -> bool:
    """A whole number (an int, or a float like 10.0; not a bool, a string, inf or nan)."""
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and int(value) == value
    )


def _named(err: Exception, name: str, what: str = "source") -> Exception:
    """``err`` naming the part: its config keys spelled in full (``source.root`` is
    ``source.parts.<name>.source.root`` here), else the part's key in front; the same type where it takes a
    message alone."""
    # a key, not a path's "source." (/data/source.v2, s3://bucket/source.tar)
    if what == "source":
        text = re.sub(r"(?<![\w./\\'~-])source\.", f"source.parts.{name}.source.", str(err))
        if text == str(err):
            text = f"source.parts.{name}: {err}"
    else:  # a part's transforms: their key in front
        text = f"source.parts.{name}.{what}: {err}"
    try:
        out = type(err)(text)
    except Exception:  # an exception type with another signature
        return ValueError(text)
    return out if str(out) == text else ValueError(text)


def _build(config: Mapping, name: str, what: str):
    """A part's ``source`` or ``transforms`` from its config (the mix builds its parts itself, so an error
    names the part)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(config)
    except InstantiationException as err:
        cause = err
        while isinstance(cause, InstantiationException) and cause.__cause__ is not None:
            cause = cause.__cause__
        raise _named(cause, name, what) from None
    except Exception as err:
        raise _named(err, name, what) from None


class Part:
    """One part of the mix, checked: ``source``, how much of an epoch it gives, how its classes map."""

    def __init__(self, name: str, spec: Mapping[str, Any]):
        key = f"source.parts.{name}"
        if not isinstance(spec, Mapping):
            raise ValueError(f"{key} must be a mapping with a source (and a weight or samples), not {spec!r}")
        unknown = sorted(set(spec) - set(PART_KEYS))
        if unknown:
            raise ValueError(
                f"{key}: unknown key(s) {', '.join(unknown)}; a part takes {', '.join(PART_KEYS)}"
            )
        self.name, self.key = str(name), key
        self.source = spec.get("source")
        if self.source is None:
            raise ValueError(f"{key}.source is required: +source/parts@{key}=folder (or hdf5, shards, ...)")
        if isinstance(self.source, Mapping):  # a config (conf/source/mix.yaml keeps them unbuilt): built here
            self.source = _build(self.source, self.name, "source")
        if not isinstance(self.source, Source):
            raise TypeError(f"{key}.source is a {type(self.source).__name__}, not a feedline source")
        weight, samples = spec.get("weight"), spec.get("samples")
        if weight is not None and samples is not None:
            raise ValueError(f"{key}: give a weight or samples (a count per epoch), not both")
        if samples is not None and (not _count(samples) or samples < 1):
            raise ValueError(f"{key}.samples={samples!r}: a count of samples per epoch, at least 1")
        if weight is None and samples is None:
            weight = 1.0
        if weight is not None and not (
            isinstance(weight, (int, float))
            and not isinstance(weight, bool)
            and math.isfinite(weight)
            and weight > 0
        ):
            raise ValueError(f"{key}.weight={weight!r}: a number above 0")
        self.weight = float(weight) if weight is not None else None
        self.samples = int(samples) if samples is not None else None
        class_map = spec.get("class_map") or {}
        if not isinstance(class_map, Mapping):
            raise ValueError(f"{key}.class_map: a mapping {{its class: the mix's class}}, not {class_map!r}")
        for k, v in class_map.items():
            if v is None or str(v) == "":
                raise ValueError(f"{key}.class_map: {k} maps to {v!r}; map it to a class name")
        self.class_map = {str(k): str(v) for k, v in class_map.items()}
        label = spec.get("label")
        if label is not None and str(label) == "":
            raise ValueError(f"{key}.label='': a class name for every sample of the part, or null")
        self.label = str(label) if label is not None else None
        if self.label is not None and self.class_map:
            raise ValueError(f"{key}: give class_map or label (one class for every sample), not both")
        transforms = spec.get("transforms")
        if transforms is not None:
            if isinstance(transforms, (str, bytes, Mapping)) or not hasattr(transforms, "__iter__"):
                raise ValueError(
                    f"{key}.transforms: a list of transforms (like transforms.train), not {transforms!r}"
                )
            transforms = [
                _build(t, self.name, "transforms") if isinstance(t, Mapping) else t for t in transforms
            ]
        self.transforms = transforms

    def class_names(self) -> list[str]:
        """The part's classes as the mix names them (after ``class_map`` / ``label``)."""
        try:
            own = list(self.source.classes)
        except Exception as err:
            raise _named(err, self.name) from err
        if self.label is not None:
            return [self.label] * len(own)
        missing = sorted(set(self.class_map) - set(own))
        if missing:
            raise ValueError(
                f"{self.key}.class_map maps {', '.join(map(repr, missing))}, which {self.name} does not have; "
                f"its classes: {', '.join(own[:20])}{' ...' if len(own) > 20 else ''}"
            )
        return [self.class_map.get(c, c) for c in own]


def _numbered(names: list[str]) -> bool:
    return bool(names) and all(n.isdigit() for n in names)


def merge_classes(parts: list[Part]) -> tuple[list[str], list[np.ndarray]]:
    """(the mix's classes, each part's map from its labels to them). Refused: a part's numbered classes (an
    unnamed HDF5's "0".."9") beside another part's named ones, neither mapped, where names would meet by
    accident; a part with a ``class_map`` or ``label`` says what its classes are."""
    names = [part.class_names() for part in parts]
    check_spellings(parts, names)
    unmapped = [(p, n) for p, n in zip(parts, names) if n and p.label is None and not p.class_map]
    numbered = [(p, n) for p, n in unmapped if _numbered(n)]
    named = [(p, n) for p, n in unmapped if not _numbered(n)]
    if numbered and named:
        (a, a_names), (b, b_names) = numbered[0], named[0]
        raise ValueError(
            f"source.parts.{a.name} has numbered classes ({', '.join(a_names[:5])}, ...) and "
            f"source.parts.{b.name} named ones ({', '.join(b_names[:5])}, ...): they cannot be merged by name; "
            f"name {a.name}'s with {a.key}.class_map={{0: <name>, ...}} (or {b.name}'s with numbers), or give "
            f"all of a part's samples one class with {a.key}.label=<name>"
        )
    merged: list[str] = []
    where: dict[str, int] = {}
    maps = []
    for own in names:
        for n in own:
            if n not in where:
                where[n] = len(merged)
                merged.append(n)
        maps.append(np.array([where[n] for n in own], dtype=np.int64))
    return merged, maps


class MixRecords:
    """One split of the mix: the parts' records one after another (part p holds rows ``offsets[p]`` ..
    ``offsets[p + 1]``), labels mapped to the mix's classes. The train split draws its epochs
    (``epoch_order``, ``epoch_samples``); every split tells the part of a row (``part_of``)."""

    def __init__(self, names, records, maps, counts=None):
        self.names, self.records, self.maps = list(names), list(records), list(maps)
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
        payload, label = self.records[p][i - int(self.offsets[p])]
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
            for k, (payload, label) in zip(at, got):
                out[k] = (payload, int(self.maps[p][label]) if label >= 0 else label)
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
        return ";".join(f"{name}:{','.join(map(str, m.tolist()))}" for name, m in zip(self.names, self.maps))

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=8)
        for records in self.records:
            digest = getattr(records, "digest", None)
            h.update(f"{len(records)}:{digest() if callable(digest) else ''};".encode())
        return h.hexdigest()


class MixSource(Source):
    """Named ``parts``, each any feedline source with a ``weight`` (or ``samples`` per epoch); ``epoch_size``
    samples an epoch (None: the weighted parts' train sizes plus the fixed counts)."""

    def __init__(self, parts: Mapping[str, Mapping[str, Any]], epoch_size: int | None = None):
        if not isinstance(parts, Mapping) or not parts:
            raise ValueError(
                "source.parts is empty: add parts, e.g. +source/parts@source.parts.base=folder "
                "source.parts.base.source.root=/data/base"
            )
        if epoch_size is not None and (not _count(epoch_size) or epoch_size < 1):
            raise ValueError(f"source.epoch_size={epoch_size!r}: a number of samples, at least 1, or null")
        self.parts = [Part(name, spec) for name, spec in parts.items()]
        check_parts(self.parts)  # no data shared between parts, nor a chunk cache under two limits
        self.epoch_size = int(epoch_size) if epoch_size is not None else None
        self._merged = None

    @property
    def part_names(self) -> list[str]:
        return [p.name for p in self.parts]

    def _classes(self):
        if self._merged is None:
            self._merged = merge_classes(self.parts)
            names = self._merged[0]
            # the merged classes are the model's outputs: say them once, as class_map and label left them
            log.info(
                "source=mix classes (%d): %s%s",
                len(names),
                ", ".join(names[:30]),
                f", ... ({len(names) - 30} more)" if len(names) > 30 else "",
            )
        return self._merged

    @property
    def classes(self) -> list[str]:
        return self._classes()[0]

    def part_transforms(self) -> dict[int, Any]:
        """Each part's own per-sample train stack (a list of transforms), where it has one ([]: none)."""
        return {k: p.transforms for k, p in enumerate(self.parts) if p.transforms is not None}

    def prepare(self) -> None:
        for part in self.parts:
            try:
                part.source.prepare()
            except Exception as err:
                raise _named(err, part.name) from err
        self._merged = None
        self._classes()

    def _split_of(self, part: Part, name: str):
        try:
            return part.source.split(name)
        except Exception as err:
            raise _named(err, part.name) from err

    def split(self, name: str) -> MixRecords:
        name = check_split(name)
        _, maps = self._classes()
        if name == "train":
            records = [self._split_of(p, name) for p in self.parts]
            counts = quotas(
                [len(r) for r in records],
                [p.weight for p in self.parts],
                [p.samples for p in self.parts],
                self.epoch_size,
            )
            empty = [p.name for p, r, c in zip(self.parts, records, counts) if c and not len(r)]
            if empty:
                raise ValueError(f"source.parts.{empty[0]} has no train samples to draw from")
            return MixRecords(self.part_names, records, maps, counts)
        names, records, kept = [], [], []
        errors = []
        for part, mapping in zip(self.parts, maps):
            try:
                records.append(self._split_of(part, name))
            except ValueError as err:
                if name != "test" or "has no test split" not in str(err):
                    raise
                errors.append(str(err))  # a part without a test split: the others' still count
                continue
            share = getattr(part.source, f"{name}_fraction", 0)
            if share and not len(records[-1]):  # as the datamodule says of a source alone
                message = (
                    f"{part.key}.source.{name}_fraction={share} holds out no sample: each class's share rounds "
                    f"to 0, or would take its last training sample; raise it, or add samples"
                )
                if name == "test":
                    raise ValueError(f"the test split of {part.key} is empty: {message}")
                log.warning("the val split of %s is empty: %s", part.key, message)
            names.append(part.name)
            kept.append(mapping)
        if not records:
            raise ValueError(f"no part of the mix has a {name} split: {'; '.join(errors)}")
        return MixRecords(names, records, kept)

    def __repr__(self) -> str:  # each part's own: a conversion of the mix records what it was made from
        return f"MixSource({', '.join(f'{p.name}={p.source!r}' for p in self.parts)})"

"""A mix's parts: each a source built from its config, with its weight or count, and its classes mapped into
the mix's (merged by name, renamed by ``class_map``, or one ``label`` for all)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline.datasets.mix.checks import check_spellings
from feedline.datasets.records import Source

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

"""What a mix's parts may not share without being told: data (``datasets/overlap/same_data.py``), a chunk cache under two
limits, and class names that differ only in case or spaces.

Checked when the mix is built, before any work: each error names both parts' keys and what to change.
"""

from __future__ import annotations

import os
import unicodedata

from feedline.datasets.fields import Fields, fields_of
from feedline.datasets.overlap.same_data import Data, data_of, meet


def _settings(source) -> dict:
    """A source's settings as it holds them (its paths made absolute, its fractions checked)."""
    return {
        k: str(v) if isinstance(v, os.PathLike) else v
        for k, v in vars(source).items()
        if not k.startswith("_")
    }


def _twins(a, b) -> bool:
    """Two parts that read the same data on purpose (``experiment=mix_demo``): the very same source settings
    (so the same samples held out) and a train stack of its own in one of them."""
    try:
        same = type(a.source) is type(b.source) and _settings(a.source) == _settings(b.source)
    except Exception:  # a setting that does not compare (an array): not known to be the same
        same = False
    return same and (a.transforms is not None or b.transforms is not None)


def _shared(a, x: Data, b, y: Data, how: str) -> str:
    if x.role == y.role == "train":
        same = f"{x.key} '{x.shown}' and {y.key} '{y.shown}' are the same data ({how})"
        if a.transforms is not None or b.transforms is not None:
            return (
                f"{same}, and the parts' source configs differ, so one part could hold out samples the other "
                f"trains on: give both parts the very same source config (its seed, fractions and held-out data)"
            )
        return (
            f"{same}: each of its samples would be drawn by both parts, and held out twice. To draw it more "
            f"often, raise {a.key}.weight (or give it samples) and remove {b.key}; to give a share of its draws "
            f"a stack of their own, give both parts the very same source config and one of them transforms"
        )
    if "train" in (x.role, y.role):
        (t, tp), (h, hp) = ((x, a), (y, b)) if x.role == "train" else ((y, b), (x, a))
        return (
            f"{h.key} '{h.shown}' is the training data of {t.key} '{t.shown}' ({how}): {hp.name}'s {h.role} "
            f"samples would be ones {tp.name} trains on. Give {h.key} other samples, or hold a share out with "
            f"{hp.key}.source.{h.role}_fraction"
        )
    if x.role != y.role:
        return (
            f"{x.key} '{x.shown}' and {y.key} '{y.shown}' are the same data ({how}): the test score would be "
            f"of the samples validation chose the model by. Give one of them other samples"
        )
    return (
        f"{x.key} '{x.shown}' and {y.key} '{y.shown}' are the same data ({how}): the mix's {x.role} split would "
        f"hold each of its samples twice. Hold it out in one part only"
    )


def _chunk_cache(part) -> tuple[str, int] | None:
    """(the node's chunk cache directory, its limit) of a part that reads chunks from a URL, else None."""
    limit = getattr(part.source, "cache_limit", None)
    if limit is None or not any(p.remote for d in data_of(part.source) for p in d.places):
        return None
    from feedline.datasets.cache import default_cache_dir
    from feedline.datasets.shards.cached import cache_directory

    root = getattr(part.source, "cache_dir", None) or default_cache_dir()
    return os.path.realpath(cache_directory(root)), int(limit)


def check_parts(parts) -> None:
    """A mix's parts (``mix.Part``: name, key, source, transforms) share no data and no chunk cache under two
    limits. Data one part trains on that another holds out is a score on trained samples; the same data in two
    parts is drawn by both and held out twice (weights are what draw a part more often); two limits on one
    cache directory bound it by neither."""
    data = {p.name: data_of(p.source, f"{p.key}.source") for p in parts}
    for i, a in enumerate(parts):
        for b in parts[i + 1 :]:
            if _twins(a, b):
                continue
            for x in data[a.name]:
                for y in data[b.name]:
                    how = meet(x, y)
                    if how:
                        raise ValueError(_shared(a, x, b, y, how))
    caches: dict[str, tuple] = {}
    for part in parts:
        cache = _chunk_cache(part)
        if cache is None:
            continue
        first = caches.setdefault(cache[0], (part, cache[1]))
        if first[1] != cache[1]:
            from feedline.storage.sizes import describe

            raise ValueError(
                f"{first[0].key}.source.cache_limit={describe(first[1])} and {part.key}.source.cache_limit="
                f"{describe(cache[1])} share one chunk cache, {cache[0]}: each part would admit its downloads "
                f"against its own limit, so the smaller one would not hold. Give both the same cache_limit, or "
                f"each part a cache_dir of its own"
            )


def _spelling(name: str) -> str:
    """A class name as a reader takes it: case, Unicode form (macOS writes folder names decomposed) and spaces
    aside."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def check_spellings(parts, names: list[list[str]]) -> None:
    """Classes merge by exact name: ``Cat`` in one part and ``cat `` in another would be two classes, the model
    taught to tell them apart. Refused, naming both; a part's own classes are its source's to name."""
    seen: dict[str, dict[str, object]] = {}
    for part, own in zip(parts, names):
        for name in own:
            spellings = seen.setdefault(_spelling(name), {})
            other = next(((n, p) for n, p in spellings.items() if p is not part), None)
            if name not in spellings and other is not None:
                raise ValueError(
                    f"{other[1].key} has class {other[0]!r} and {part.key} class {name!r}: they differ only in "
                    f"case, spaces or Unicode form, so merged by name they would be two classes. Map one onto "
                    f"the other with {part.key}.class_map (its class: the other's name), or rename one"
                )
            spellings.setdefault(name, part)


def same_fields(parts) -> Fields | None:
    """The fields every part's samples hold, class lists aside (None: image and class, each part's classes
    merged by name; else the first part's, whose class lists ``labels.merge_fields`` merges). Parts whose
    samples hold other fields are refused by name: a batch has one set of fields."""
    each = [(part, fields_of(part.source)) for part in parts]
    if all(fields.is_classification for _, fields in each):
        return None
    first, fields = each[0]
    for part, other in each[1:]:
        differs = first_difference(fields, other)
        if differs:
            raise ValueError(
                f"source.parts.{first.name} and source.parts.{part.name} hold different fields: {differs}; the "
                "parts of a mix must give samples of the same fields and kinds (their class lists merge)"
            )
    mapped = [part.name for part, _ in each if part.class_map or part.label is not None]
    if mapped:
        raise ValueError(
            f"source.parts.{mapped[0]}: class_map and label relabel image-and-class samples; parts with named "
            "fields merge their class lists by name, field by field"
        )
    return fields


def first_difference(a: Fields, b: Fields) -> str | None:
    """What first differs between two parts' fields, in words (None: the same fields, in any order, class
    lists aside: ``identity(columns=False)`` less the class lists, compared field by field to name one)."""
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))
        return f"field {only[0]!r} is in one part only ({', '.join(a)} | {', '.join(b)})"
    if a.target != b.target or a.input != b.input:
        return f"the target is {a.target!r} in one and {b.target!r} in the other (or the input image differs)"
    for name in a:
        x, y = a[name], b[name]
        for key in ("kind", "ignore_index"):  # a boxes field's format: the mix converts it (labels.py)
            if key == "ignore_index" and x.kind != "mask":
                continue
            if getattr(x, key, None) != getattr(y, key, None):
                return (
                    f"field {name!r} has {key} {_short(getattr(x, key, None))} in one and "
                    f"{_short(getattr(y, key, None))} in the other"
                )
        if (x.classes is None) != (y.classes is None):
            listed = "the first" if x.classes is not None else "the second"
            return f"field {name!r} has a class list in {listed} part only (give both parts its classes)"
    return None


def _short(value) -> str:
    if isinstance(value, tuple) and len(value) > 6:
        return f"({', '.join(map(repr, value[:6]))}, ... {len(value)} in all)"
    return repr(value)

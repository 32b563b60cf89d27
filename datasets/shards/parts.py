"""A shards dataset's folders: itself, or the parts of a conversion split over N jobs, and what they must share.

    DIR/index.json + DIR/feedline.json                  a whole dataset
    DIR/part-0000K-of-0000N/index.json + feedline.json  part K of N (``convert.py out.part=K out.parts=N``)

Parts are read in part order as one dataset, once every part is complete, and only when their sidecars say
they are one conversion's: each the part its folder is named for, all cut from one seeded order of the same
source, and all written with the settings that decide what a sample holds (``PART_KEYS``).
"""

from __future__ import annotations

import collections
import os
import re

from feedline.datasets.shards.meta import SIDECAR, as_store, join

PART = re.compile(r"part-(\d{5})-of-(\d{5})")

# What the parts of one conversion share, with the setting that decides it. Each part is a slice of one seeded
# order of the source's rows: parts drawn with another seed, shuffle or source slice another order (some
# samples in two parts, others in none); parts written with another max_side, quality or mode hold images of
# other sizes or encodings under one dataset. The source is its kind, classes, row count and rows (a digest of
# each row's file relative to its root, or place in its file, and label, in order: ``writers/origin.py``), not
# its path: the jobs of one conversion may see the same data under other mount points. A key no part records
# (an older conversion) is unknown alike in all; one that some parts record and others do not is a difference.
PART_KEYS = {
    "seed": "out.seed",
    "shuffle": "out.shuffle",
    "rows": "samples in the source",
    "source_kind": "the source's kind",
    "source_rows": "the source's rows (a digest of their files and labels)",
    "max_side": "out.max_side",
    "quality": "out.quality",
    "mode": "out.mode",
    "format": "the samples' format (images and labels, or named fields)",
    "fields": "the source's fields",
    "target": "source.target",
}
SETTINGS = "out.seed, out.shuffle, out.max_side, out.quality and out.mode"


def part_name(part: int, parts: int) -> str:
    return f"part-{int(part):05d}-of-{int(parts):05d}"


def is_complete(where, rel: str = "") -> bool:
    store = as_store(where)
    return store.exists(join(rel, "index.json")) and store.exists(join(rel, SIDECAR))


def dataset_parts(where, key: str = "source.path") -> list[str]:
    """The directories of the dataset in ``where`` (a path or a store), relative to it: itself (``""``), or its
    parts in part order once all are complete."""
    store = as_store(where)
    if is_complete(store):
        return [""]
    path = store.where()
    found: dict[int, dict[int, str]] = collections.defaultdict(dict)
    for name in store.children():
        match = PART.fullmatch(name)
        if match:
            part, parts = int(match[1]), int(match[2])
            if not part < parts:
                raise ValueError(
                    f"{key} '{path}' holds {name}, which no conversion writes (part K of N counts K from 0 to "
                    f"N - 1): it was renamed; remove it, and convert that part again"
                )
            found[parts][part] = name
    if not found:
        why = (
            "its conversion is unfinished or was killed, or LitData wrote it without feedline's sidecar"
            if store.exists("index.json")
            else ""
        )
        raise FileNotFoundError(
            f"{key} '{path}' is not a shards dataset: no index.json and {SIDECAR} (nor part-*-of-* folders)"
            f"{' (' + why + ')' if why else ''}; write one with python convert.py source=... out.format=shards "
            f"out.path={path}"
        )
    if len(found) > 1:
        counts = ", ".join(f"of {n}" for n in sorted(found))
        raise ValueError(
            f"{key} '{path}' holds parts of conversions split differently ({counts}): keep the folders of one "
            f"out.parts and remove the others"
        )
    parts, dirs = next(iter(found.items()))
    missing = [k for k in range(parts) if k not in dirs or not is_complete(store, dirs[k])]
    if missing:
        names = ", ".join(part_name(k, parts) for k in missing[:10]) + (" ..." if len(missing) > 10 else "")
        verb = "is" if len(missing) == 1 else "are"
        raise FileNotFoundError(
            f"{key} '{path}' is a dataset in {parts} parts, and {len(missing)} {verb} missing or unfinished: {names}. "
            f"Run python convert.py ... out.path={path} out.part=K out.parts={parts} for each"
        )
    return [dirs[k] for k in range(parts)]


def dataset_dirs(path: str, key: str = "source.path") -> list[str]:
    """The local directories of the dataset at ``path``: itself, or its parts in part order."""
    store = as_store(str(path))
    return [store.where(rel) for rel in dataset_parts(store, key)]


def check_parts(path: str, key: str, dirs: list[str], sidecars: list[dict]) -> None:
    """The folders ``dirs`` of ``path`` are one conversion's: a whole dataset, or its parts each in the folder
    of its own number, with one set of classes and ``PART_KEYS``; else a ValueError naming the folders and what
    differs (read together they would mix samples written differently, or repeat some and miss others)."""
    parts = len(dirs)
    for k, (d, sidecar) in enumerate(zip(dirs, sidecars)):
        number = sidecar.get("part"), sidecar.get("parts")
        if parts == 1 and number[1] is not None and _name(d) == part_name(*number):
            continue  # one part read on its own, in the folder of its number
        if number != ((k, parts) if parts > 1 else (None, None)):
            held = "a whole dataset" if number[1] is None else f"part {number[0]} of {number[1]}"
            wanted = f"part {k} of {parts}" if parts > 1 else "a whole dataset"
            raise ValueError(
                f"{key} '{path}': {d} holds {held} ({SIDECAR}), not {wanted}: its folder was copied or renamed "
                f"(a part is read in its part-K-of-N folder, with the other parts); convert it again"
            )
    first = sidecars[0]
    for d, sidecar in zip(dirs[1:], sidecars[1:]):
        if sidecar["classes"] != first["classes"]:
            raise ValueError(
                f"{key} '{path}': {d} has other classes than {dirs[0]}: convert its parts again from one source"
            )
        differ = [
            f"{what} {_value(first, name)} in {_name(dirs[0])}, {_value(sidecar, name)} in {_name(d)}"
            for name, what in PART_KEYS.items()
            if first.get(name) != sidecar.get(name)
        ]
        if len(differ) == 1 and first.get("source_rows") != sidecar.get("source_rows"):
            sources = (first.get("source"), sidecar.get("source"))
            named = f"; they record {sources[0]} and {sources[1]}" if sources[0] != sources[1] else ""
            raise ValueError(
                f"{key} '{path}': the source changed between the part jobs: {_name(dirs[0])} and {_name(d)} were "
                f"cut from different lists of its files (one renamed, moved to another class, added or removed, "
                f"or another tree{named}), so read together they would repeat some samples and miss others. "
                f"Convert every part again, from the source as it is now"
            )
        if differ:
            raise ValueError(
                f"{key} '{path}': its parts were not written by one conversion ({'; '.join(differ)}): read together "
                f"they would mix samples written differently, or slice different orders of the source (repeating "
                f"some samples and missing others). Convert every part again from the same source with the same "
                f"settings ({SETTINGS})"
            )


def _name(where: str) -> str:
    return os.path.basename(str(where).rstrip("/"))


def _value(sidecar: dict, name: str) -> str:
    return repr(sidecar[name]) if name in sidecar else "not recorded"

"""The index of a set of WebDataset tars read as named fields (``source.fields``): built once, with one pass over
each tar's headers and its small label members, and kept in the cache, where every later run, rank and worker
maps it.

    <cache_dir>/wds/<name>-<digest>/     digest: the tars' paths, sizes and mtimes, the fields, source.label_key
        rows.npy      (N, 1 + 2F) int64: the tar (its number in meta.json), then each field's member's offset
                      and size in it (-1, -1: the sample has no such member, bad input when it is read)
        labels.npy    (N,) int64: a class target's index per sample (-1: none), for stratified splits
        names.npy     (N,) bytes: the sample's key, for error messages
        meta.json     the tars (path, size), each field's extensions, each labelled field's class list (as
                      declared, or the names found: "0".."max" when all are numbers, else sorted); last

A field's ``column`` is the extension of its member (``seg.png``), or several tried in turn (``jpg;png``).
A key group holding none of the fields' members (``__meta__``) is left out; one holding some is kept, and a
missing member is bad input when the sample is read, naming the tar, the key and the extension. A label
member that does not parse, or names a class a declared list lacks, stops the build, named.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
import time

import numpy as np

from feedline.datasets.arrays import LazyArray
from feedline.datasets.cache import (
    cache_path,
    check_array,
    checked_meta,
    json_checksum,
    save_array,
    write_text,
)
from feedline.datasets.manifest.columns import class_list
from feedline.datasets.records import BadInput
from feedline.datasets.wds.tars import TarError, _check_end, _group, check_plain, find_tars
from feedline.datasets.wds.values import LABELLED, Lookup, class_names

log = logging.getLogger(__name__)

FORMAT = 1
ARRAYS = ("rows", "labels", "names")


def extensions(field) -> list[str]:
    """The member extensions a field reads, in the order tried (``jpg;png``)."""
    return [e.strip().lstrip(".").lower() for e in field.source_column.split(";") if e.strip()]


def open_field_index(path: str, specs, target: str, label_key: str, cache_dir=None, key: str = "source.path"):
    """The index of the tars ``path`` names, for the fields ``specs`` (a class list left None is found)."""
    tars = find_tars(path, key)
    stats = [[t, os.stat(t).st_size, os.stat(t).st_mtime_ns] for t in tars]
    said = [[f.name, f.kind, extensions(f), f.classes and list(f.classes), f.separator] for f in specs]
    name = os.path.basename(os.path.dirname(tars[0]))
    directory = cache_path("wds", name, [FORMAT, stats, said, target, label_key], cache_dir)
    index = _load(directory, len(specs))
    if index is None:
        started = time.perf_counter()
        _save(directory, _build(tars, specs, target, label_key, f"{key} '{path}'"))
        index = _load(directory, len(specs))
        log.info("indexed %d tar(s) of %s in %.1f s", len(tars), path, time.perf_counter() - started)
    index["directory"] = directory
    if index["skipped"]:
        log.warning(
            "%s '%s': %d key(s) left out, holding none of the fields' members (%s): %s",
            key,
            path,
            index["skipped"],
            ", ".join("/".join(e) for e in index["columns"]),
            "; ".join(index["skipped_shown"]),
        )
    return index


def _build(tars: list[str], specs, target: str, label_key: str, where: str) -> dict:
    columns = [extensions(f) for f in specs]
    labelled = [k for k, f in enumerate(specs) if f.kind in LABELLED]
    found: dict[str, set] = {specs[k].name: set() for k in labelled}
    rows, names, target_names, skipped = [], [], [], []
    t_k = next((k for k, f in enumerate(specs) if f.name == target and f.kind == "class"), None)
    for t, tar in enumerate(tars):
        size = check_plain(tar)
        try:
            with tarfile.open(tar, "r:") as handle:
                groups = _group(handle, tar)
                _check_end(handle, tar, size)
                for key, members in groups.items():
                    chosen = [next((e for e in alts if e in members), None) for alts in columns]
                    if not any(chosen):
                        skipped.append(f"{tar}: {key}")
                        continue
                    row, said = [t], None
                    for ext in chosen:
                        row += [members[ext].offset_data, members[ext].size] if ext else [-1, -1]
                    for k in labelled:
                        if chosen[k] is None:
                            continue
                        data = handle.extractfile(members[chosen[k]]).read()
                        try:
                            got = class_names(data, specs[k].kind, label_key, specs[k].separator)
                        except BadInput as err:
                            raise TarError(
                                f"{where}: {tar}: sample {key!r}, {key}.{chosen[k]}: {err}"
                            ) from None
                        found[specs[k].name].update(got)
                        if k == t_k:
                            said = got[0]
                    rows.append(row)
                    names.append(key.encode("utf-8", "surrogateescape"))
                    target_names.append(said)
        except (tarfile.TarError, EOFError) as err:
            raise TarError(
                f"{where}: {tar} is not a complete tar ({err}): it is truncated or corrupt"
            ) from None
    if not rows:
        raise TarError(
            f"{where}: its {len(tars)} tar(s) hold no sample with any of the members "
            f"{', '.join('/'.join(c) for c in columns)} (source.fields.<name>.column)"
        )
    classes = {}
    for k in labelled:
        f = specs[k]
        listed = list(f.classes) if f.classes is not None else class_list(found[f.name])
        lookup = Lookup(listed)
        for n in sorted(found[f.name]):
            try:
                lookup(n, f.name)
            except BadInput as err:
                raise TarError(
                    f"{where}: {err}; add it to source.fields.{f.name}.classes, or fix the tar"
                ) from None
        classes[f.name] = listed
    labels = np.full(len(rows), -1, dtype=np.int64)
    if t_k is not None:
        lookup = Lookup(classes[specs[t_k].name])
        labels[:] = [lookup(n, target) if n is not None else -1 for n in target_names]
    return {
        "tars": [[t, os.path.getsize(t)] for t in tars],
        "columns": columns,
        "classes": classes,
        "skipped": len(skipped),
        "skipped_shown": skipped[:10],
        "rows": np.asarray(rows, dtype=np.int64).reshape(len(rows), 1 + 2 * len(specs)),
        "labels": labels,
        "names": np.asarray(names, dtype=bytes),
    }


def _save(directory, index: dict) -> None:
    for name in ARRAYS:
        save_array(directory / f"{name}.npy", index[name])
    meta = {k: v for k, v in index.items() if k not in ARRAYS}
    meta.update(format=FORMAT, samples=len(index["labels"]))
    meta["checksum"] = json_checksum(meta)
    write_text(directory / "meta.json", json.dumps(meta))  # last: an index without it is never read


def _load(directory, fields: int) -> dict | None:
    try:
        meta = checked_meta(directory, FORMAT)
        if meta is None:
            return None
        n = int(meta["samples"])
        shapes = {"rows": (n, 1 + 2 * fields), "labels": (n,), "names": (n,)}
        index = dict(meta)
        for name in ARRAYS:
            reason = check_array(directory / f"{name}.npy")
            if reason:
                raise ValueError(reason)
            index[name] = LazyArray(directory / f"{name}.npy")
            if index[name].array.shape != shapes[name]:
                raise ValueError(f"{name}.npy has shape {index[name].array.shape}, not {shapes[name]}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("the tar index %s is damaged (%s); rebuilding it", directory, err)
        return None
    return index

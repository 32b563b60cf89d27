"""The index of a set of WebDataset tars: built once (``wds_tars.scan_tar``, a pass over each tar's headers)
and kept in the cache, where every later run, rank and worker maps it.

    <cache_dir>/wds/<name>-<digest>/     digest: the tars' paths, sizes and mtimes, and source.label_key
        rows.npy      (N, 3) int64: the tar (its number in meta.json), the image's offset and size in it
        labels.npy    (N,) int64: class indices into meta.json's classes
        names.npy     (N,) bytes: the image member's name, for error messages
        meta.json     the tars (path, size), the classes, the samples left out; written last, with a checksum

Each file is written atomically with its checksum (``cache.py``); a damaged one is found on load and the
index rebuilt, with a warning. Classes: "0".."max" when the labels are class numbers (as ``hdf5`` names
them), the sorted names when they are class names; a mix of the two is refused.
"""

from __future__ import annotations

import json
import logging
import os
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
from feedline.datasets.wds.tars import TarError, find_tars, scan_tar

log = logging.getLogger(__name__)

FORMAT = 2  # 2: a sample key repeated in a tar is refused (1 kept its first sample): index it again
ARRAYS = ("rows", "labels", "names")
SHOWN = 10  # skipped samples named per warning (and kept in meta.json)
IMPLIED_CLASSES = 1 << 16  # class numbers past this and twice the samples are refused (as hdf5 does)


def open_index(path: str, label_key: str, cache_dir=None, key: str = "source.path") -> dict:
    """The index of the tars ``path`` names: read from the cache, else built and cached. A dict of the tars
    (path, size), the classes, the skipped samples, the arrays (LazyArray) and its cache directory."""
    tars = find_tars(path, key)
    stats = [[t, os.stat(t).st_size, os.stat(t).st_mtime_ns] for t in tars]
    name = os.path.basename(os.path.dirname(tars[0]))
    directory = cache_path("wds", name, [FORMAT, stats, label_key], cache_dir)
    index = _load(directory)
    if index is None:
        started = time.perf_counter()
        _save(directory, _build(tars, label_key, f"{key} '{path}'"))
        index = _load(directory)
        log.info("indexed %d tar(s) of %s in %.1f s", len(tars), path, time.perf_counter() - started)
    index["directory"] = directory  # where the splits drawn from it are kept
    if index["skipped_count"]:
        shown = "; ".join(index["skipped"])
        more = index["skipped_count"] - len(index["skipped"])
        log.warning(
            "%s '%s': %d sample(s) left out, having no image or no label: %s%s",
            key,
            path,
            index["skipped_count"],
            shown,
            f"; and {more} more" if more > 0 else "",
        )
    return index


def _build(tars: list[str], label_key: str, where: str) -> dict:
    rows, names, raw, skipped = [], [], [], []
    for t, tar in enumerate(tars):
        try:
            samples, left = scan_tar(tar, label_key)
        except TarError as err:  # named by its key too, so that train.py prints it without a traceback
            raise TarError(f"{where}: {err}") from None
        skipped += left
        for member, offset, size, label in samples:
            rows.append((t, offset, size))
            names.append(member.encode("utf-8", "surrogateescape"))
            raw.append(label)
    if not raw:
        raise TarError(
            f"{where}: its {len(tars)} tar(s) hold no sample with an image and a label "
            f"({len(skipped)} left out{': ' + '; '.join(skipped[:SHOWN]) if skipped else ''})"
        )

    def at(i: int) -> str:
        return f"{tars[rows[i][0]]}: {names[i].decode('utf-8', 'surrogateescape')}"

    numbers = [i for i, v in enumerate(raw) if isinstance(v, int)]
    if numbers and len(numbers) < len(raw):
        named = next(i for i, v in enumerate(raw) if not isinstance(v, int))
        raise TarError(
            f"{where} labels some samples by class number ({at(numbers[0])}: {raw[numbers[0]]}) and others by "
            f"class name ({at(named)}: {raw[named]!r}): label them all one way"
        )
    if numbers:
        labels = np.asarray(raw, dtype=np.int64)
        top = int(labels.max())
        if top + 1 > max(2 * len(labels), IMPLIED_CLASSES):
            raise TarError(
                f"{where} holds label {top} ({at(int(labels.argmax()))}): its classes would be 0..{top} for "
                f"{len(labels)} samples. Labels are class numbers 0..C-1, or class names"
            )
        classes = [str(c) for c in range(top + 1)]
    else:
        classes = sorted(set(raw))
        number = {c: k for k, c in enumerate(classes)}
        labels = np.asarray([number[v] for v in raw], dtype=np.int64)
    return {
        "tars": [[t, os.path.getsize(t)] for t in tars],
        "classes": classes,
        "skipped": skipped[:SHOWN],
        "skipped_count": len(skipped),
        "rows": np.asarray(rows, dtype=np.int64).reshape(-1, 3),
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


def _load(directory) -> dict | None:
    """The cached index in ``directory``, or None when there is none or it is damaged (with a warning)."""
    try:
        meta = checked_meta(directory, FORMAT)
        if meta is None:
            return None
        n = int(meta["samples"])
        shapes = {"rows": (n, 3), "labels": (n,), "names": (n,)}
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

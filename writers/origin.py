"""What a conversion records of the data it reads, and the outputs it may not write: the data itself.

- ``recorded_source``: the sidecar's or the HDF5 attribute's ``source``, which ``datasets/overlap/same_data.py``
  reads to tell a conversion's data from other data (it follows every ``root='...'`` and ``path='...'`` the
  text names). The source's repr, and where the data it reads is itself a conversion, that conversion's own
  record after it (``<repr>, made from <record>``): a chain tree -> shards -> HDF5 still names the tree once
  the shards between are gone.
- ``rows_digest``: which rows a source holds, in order (each row's file relative to its root, or where it
  lies in its file or dataset, and its label), and the bytes of a few rows spread over them (so two trees of
  the same file names and labels differ too). Every part job of a conversion records it, and parts that
  differ are never read as one dataset (``datasets/shards/parts.py``): a tree edited between the jobs (a file
  renamed or moved to another class keeps the count and the classes), or another tree.
- ``check_not_input``: an output that is the data the conversion reads (under any spelling), holds it, or
  lies in it, and a shards directory inside a tree of class folders it reads, are refused before anything
  is written. (An HDF5 file beside class folders is no class folder: ``same_data`` keeps it apart too.)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace

import numpy as np

from feedline.datasets.folder.lazy import LazyFolderRecords
from feedline.datasets.folder.source import FolderRecords
from feedline.datasets.hdf5.records import HDF5Records
from feedline.datasets.mix.records import MixRecords
from feedline.datasets.overlap.places import described, local_place, records_of, url_place
from feedline.datasets.overlap.same_data import data_of, meet
from feedline.datasets.shards.labels import load_labels
from feedline.datasets.shards.source import ShardsRecords
from feedline.datasets.wds.source import WdsRecords
from feedline.storage.stores import is_url

MADE_FROM = ", made from "  # between a source's repr and the records of origin it carries on
SAMPLED = 8  # rows whose bytes a rows digest holds: two trees of the same names and labels differ by them


def _sources(source, key: str = "source"):
    """(config key, source) of ``source`` itself, or of each part of a mix."""
    parts = getattr(source, "parts", None)
    if not parts or not all(hasattr(p, "source") for p in parts):
        yield key, source
        return
    for part in parts:
        yield from _sources(part.source, f"{part.key}.source")


# -- where the data came from ---------------------------------------------------------------------------------
def recorded_source(source) -> str:
    """What a conversion of ``source`` records as its ``source``: its repr, then (``MADE_FROM``) each record of
    origin the data it reads keeps (a shards dataset's sidecars, an HDF5 file's attributes, a lazy layout's
    marker), read as ``same_data`` reads them."""
    own, earlier = repr(source), []
    for _, src in _sources(source):
        options = getattr(src, "storage_options", None)
        for dataset, where in described(repr(src)):
            place = url_place(where, options, live=False) if is_url(where) else local_place(where)
            earlier += [
                t for t, _ in records_of(place, options, dataset)[1] if t and t not in (own, *earlier)
            ]
    return own + (MADE_FROM + "; ".join(earlier) if earlier else "")


# -- which rows --------------------------------------------------------------------------------------------------
def rows_digest(records) -> str:
    """32 hex digits of ``records``' rows in order: each row's file relative to its source's root (or where it
    lies in its HDF5 file, tars or chunks) and its label, and the bytes of ``SAMPLED`` rows spread evenly over
    them. The same data mounted at another path gives the same digest; a file renamed, moved, added or
    removed, or another tree (other images under the same names), another. One pass over the mapped index
    arrays (a tree, a file, a dataset), and ``SAMPLED`` rows read."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, records)
    n = len(records)
    for i in np.unique(np.linspace(0, n - 1, min(n, SAMPLED)).round().astype(np.int64)).tolist():
        try:
            record = records[i]
        except OSError as err:  # gone since the source was listed: that too is what the job saw
            _text(h, type(err).__name__)
        else:
            _value(h, record if isinstance(record, dict) else record[0])  # named fields, or (payload, label)
    return h.hexdigest()


def _value(h, value) -> None:
    """A row's payload, or each value of a record of named fields (nested for a boxes field), in order."""
    if isinstance(value, dict):
        for key, item in value.items():
            _text(h, str(key))
            _value(h, item)
    elif isinstance(value, (bytes, bytearray)):
        _array(h, np.frombuffer(value, np.uint8))
    elif isinstance(value, (str, int, float, list)):
        _text(h, repr(value))
    else:
        _array(h, value)


def _array(h, values, dtype=None) -> None:
    array = np.ascontiguousarray(np.asarray(values, dtype=dtype))
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(array.data)


def _text(h, *values: str) -> None:
    h.update("\0".join(values).encode("utf-8", "surrogateescape") + b"\1")


def _feed(h, records) -> None:
    _text(h, type(records).__name__, str(len(records)))
    subset, mapping = getattr(records, "subset", None), getattr(records, "label_map", None)
    if subset is not None:  # the source's rows this split holds, in its order
        _array(h, subset.array, np.int64)
    if mapping is not None:  # a held-out tree's labels, as the source's classes number them
        _array(h, mapping, np.int64)
    if isinstance(records, MixRecords):
        for name, part, labels in zip(records.names, records.records, records.maps):
            _text(h, name)
            _feed(h, part)
            _array(h, labels, np.int64)
    elif isinstance(records, FolderRecords):  # relative paths (one blob), where each ends, labels: no more
        paths, offsets, labels = records.index.arrays[:3]  # (what else an index may hold is of this machine)
        for array in (paths, offsets, labels):
            _array(h, array)
    elif isinstance(records, LazyFolderRecords):  # files named by row: the classes, extensions and counts
        _text(h, *records.classes, *records.exts, *map(str, records.starts))
    elif isinstance(records, HDF5Records):  # rows of one file, by number
        _text(h, records.images_key)
        _array(h, records.labels.array)
    elif isinstance(records, ShardsRecords):  # rows of chunks, by part, chunk name and place in it
        chunks = records.chunks
        _text(h, *(os.path.basename(f) for f in chunks.files))
        for array in (chunks.sizes, chunks.nbytes, chunks.parts):
            _array(h, array, np.int64)
        for path, _ in chunks.label_files:
            _array(h, load_labels(path))
    elif isinstance(records, WdsRecords):  # members of tars, by tar name, place and member name
        _text(h, *(os.path.basename(t) for t in records.tars))
        for array in (records.rows.array, records.names.array, records.labels.array):
            _array(h, array)
    else:  # another records type: each row as it names itself, in order
        for i in range(len(records)):
            _text(h, records.describe(i))


# -- outputs that are the input -----------------------------------------------------------------------------------
class _Output:
    """The output as ``same_data`` reads a source's data: its path, and the options that reach it."""

    def __init__(self, path: str, storage_options: dict | None):
        self.path, self.storage_options = path, storage_options or None


def check_not_input(source, target: str, storage_options: dict | None = None, directory: bool = True) -> None:
    """Refuse (``ValueError``, naming both keys) an output ``target`` (the file, directory or URL the conversion
    writes) that is the data ``source`` reads under any spelling (``same_data``'s places: a symlink, ``..``, a
    trailing ``/``, a hard link), holds it, or lies in it; or, a ``directory``, that lies inside a tree of
    class folders it reads. Converting onto its own input replaces the only copy, and what it records of its
    origin names itself; a dataset's folder in a tree is read as a class folder."""
    (out,) = data_of(_Output(target, storage_options), "out")
    # the output's own record of origin is no part of where it is; an HDF5 output is a file, there or not yet
    out = replace(out, origins=[], places=[replace(p, folder=p.folder and directory) for p in out.places])
    real = out.places[0].real
    for prefix, src in _sources(source):
        for data in data_of(src, prefix):
            for place in data.places if directory and data.key.endswith("root") else ():
                if real.startswith(place.real.rstrip("/") + "/"):
                    raise ValueError(
                        f"out.path={target} lies inside {data.key} '{data.shown}', the tree of class folders this "
                        f"conversion reads: the tree would hold the dataset's folder, which its next read takes for "
                        f"a class folder (or part of one); choose an out.path outside {place.real}"
                    )
            how = meet(replace(data, origins=[]), out)
            if how:
                raise ValueError(
                    f"out.path={target} is the data {data.key} '{data.shown}' reads ({how}): converting it onto "
                    f"itself would replace its only copy, and what the output records of its origin would name "
                    f"itself. Write to another out.path, then move the result over {data.shown} once it is done"
                )

"""Which data a source reads, so that two sources of one run never share samples unless they are told to.

Two sources of one run: one source's training data and its held-out trees or files (``val_root``,
``test_path``, ...), and the parts of a mix. Each names its data by the keys every source uses (``root``,
``path``, ``val_root``, ``val_path``, ``test_root``, ``test_path``: config and attribute alike), and each
is resolved to *places*, which compare equal however the data was named:

    a local directory or file   its device and inode (a symlink, ``..``, a trailing ``/``: one place) and
                                its real path (a directory inside another is part of its data)
    an HDF5 file                that, and the images key it is read by (one file may hold two datasets)
    an object-storage prefix    its endpoint, bucket and key prefix (``s3://b/ds/`` is ``s3://b/ds``, and
                                ``s3://b/ds/part-00001-of-00002`` part of it)
    WebDataset shards           each tar a directory, a brace pattern or a glob names, one file each

A shards dataset (a local directory or a prefix) is its own files: its chunks and index, and its part
folders. Another dataset converted under its prefix (``s3://b/ds/val``) shares none of its chunks, so it is
another place; every folder under a tree of class folders is part of the tree.

and, for data that was made from other data, to what it records of its *origin*: an HDF5 file's ``source``
attribute and a shards sidecar's ``source`` (the ``repr`` of the source converted), a lazy layout's
``.feedline-layout.json`` (the tree laid out). So a folder and its own HDF5 or shards conversion, or two
copies of one conversion, are one dataset, where their class names agree too (the path a conversion names
may hold other data here, or have held other data where it was converted); the parts of one conversion
(``out.part`` K of N, one seed) are disjoint slices of theirs. A copy made outside feedline (``cp`` of a
tree, a foreign HDF5 file) is not seen.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass, replace

from feedline.datasets.overlap.places import Place, _origins, _places
from feedline.datasets.shards.parts import PART

ROLES = (
    ("root", "train"),
    ("path", "train"),
    ("val_root", "val"),
    ("val_path", "val"),
    ("test_root", "test"),
    ("test_path", "test"),
)


@dataclass
class Data:
    """What one key of a source reads: its role (train, val, test), its places, and what they were made from."""

    key: str
    role: str
    shown: str
    places: list[Place]
    origins: list[Place]


def data_of(source, prefix: str = "source") -> list[Data]:
    """Each key of ``source`` that names data (its ``root``, ``val_path``, ...), resolved once per source."""
    try:
        found = _resolved.get(source)
    except TypeError:  # not weakly referable
        found = None
    if found is None:
        found = _resolve(source)
        with contextlib.suppress(TypeError):
            _resolved[source] = found
    return [replace(d, key=f"{prefix}.{d.key}") for d in found]


_resolved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _resolve(source) -> list[Data]:
    paths = getattr(source, "paths", None)  # wds keeps its paths as written, by config key
    options = getattr(source, "storage_options", None)
    images_key = getattr(source, "images_key", None)
    out = []
    for attr, role in ROLES:
        value = paths.get(f"source.{attr}") if isinstance(paths, dict) else getattr(source, attr, None)
        if not value or not isinstance(value, (str, os.PathLike)):
            continue
        dataset = attr.endswith("path")  # a root is a tree of class folders, never a shards dataset
        places, origins = [], []
        for place in _places(str(value), options, images_key, isinstance(paths, dict), dataset):
            classes, made_from = _origins(place, options)
            places.append(replace(place, classes=classes))
            origins += made_from
        out.append(Data(attr, role, str(value), places, origins))
    return out


# -- comparing ----------------------------------------------------------------------------------------------------
def _inside(path: str, base: str) -> bool:
    return path.startswith(base.rstrip("/") + "/")


def _same(p: Place, q: Place) -> str | None:
    """How ``p`` and ``q`` hold the same data, or None."""
    if p.remote != q.remote or (p.key and q.key and p.key != q.key):
        return None
    if p.remote and p.endpoint and q.endpoint and p.endpoint != q.endpoint:
        return None
    what = "prefix" if p.remote else "directory" if p.folder else "file"
    if p.real == q.real:
        return f"the same {what}, {p.real}"
    if p.node is not None and p.node == q.node:
        return f"the same {what}: {p.real} and {q.real} are one, linked or mounted twice"
    for inner, outer in ((p, q), (q, p)):  # a tree's samples are images: a file beside them is not one
        if outer.folder and inner.folder and _inside(inner.real, outer.real) and _part_of(inner, outer):
            return f"{inner.real} lies inside {outer.real}"
    return None


def _part_of(inner: Place, outer: Place) -> bool:
    """Whether a folder under ``outer`` is part of its data: any folder of a tree (its images are anywhere
    below it), but not a shards dataset kept in one (its chunks are no images of the tree); of a shards
    dataset only its part folders, not another dataset converted under its prefix (ds/val: its index names
    none of ds's chunks, nor ds's its)."""
    if not outer.shards:
        return not inner.shards
    return PART.fullmatch(inner.real[len(outer.real.rstrip("/")) + 1 :]) is not None


def _slices_apart(p: Place, q: Place) -> bool:
    """Two parts of one conversion (the same N, seed, shuffle and rows): disjoint slices of its order."""
    return bool(p.slice and q.slice and p.slice[1:] == q.slice[1:] and p.slice[0] != q.slice[0])


def _alike(p: Place, o: Place) -> bool:
    """Whether data and what a conversion records as its origin can be one: the path a conversion names may
    hold other data here (or have held it there), so the class names must agree too (one may have more: a
    conversion of a mix)."""
    return not (p.classes and o.classes) or p.classes <= o.classes or o.classes <= p.classes


def meet(a: Data, b: Data) -> str | None:
    """How ``a`` and ``b`` read the same samples, or None."""
    for p in a.places:
        for q in b.places:
            how = _same(p, q)
            if how:
                return how
    for x, y in ((a, b), (b, a)):
        for p in x.places:
            for o in y.origins:
                if _same(p, o) and _alike(p, o):
                    return f"{y.shown} was made from {o.shown}, as it records"
    for o in a.origins:
        for r in b.origins:
            if _same(o, r) and _alike(o, r) and not _slices_apart(o, r):
                return f"both were made from {o.shown}, as they record"
    return None


def check_own(source) -> None:
    """``source``'s held-out data is neither its training data nor the other held-out split's: a val or test
    score on samples the model trained on (or test on the samples val chose the model by) looks good and
    means nothing. Called by each source when it is built."""
    data = data_of(source)
    for held in (d for d in data if d.role != "train"):
        for train in (d for d in data if d.role == "train"):
            how = meet(train, held)
            if how:
                raise ValueError(
                    f"{held.key} '{held.shown}' is the training data of {train.key} '{train.shown}' ({how}): "
                    f"every {held.role} sample would be one the model trains on. Give {held.key} other samples, "
                    f"or leave it unset and hold a share out with source.{held.role}_fraction"
                )
    for val in (d for d in data if d.role == "val"):
        for test in (d for d in data if d.role == "test"):
            how = meet(val, test)
            if how:
                raise ValueError(
                    f"{test.key} '{test.shown}' is the data of {val.key} '{val.shown}' ({how}): the test score "
                    f"would be of the samples validation chose the model by. Give {test.key} other samples, or "
                    f"leave it unset and hold a share out with source.test_fraction"
                )

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

import ast
import contextlib
import json
import os
import re
import stat
import weakref
from dataclasses import dataclass, replace

from feedline.datasets.paths import list_classes
from feedline.datasets.shards.meta import read_sidecar
from feedline.datasets.shards.parts import PART, dataset_parts
from feedline.datasets.wds.tars import find_tars
from feedline.storage.stores import LocalStore, S3Store, is_url

ROLES = (
    ("root", "train"),
    ("path", "train"),
    ("val_root", "val"),
    ("val_path", "val"),
    ("test_root", "test"),
    ("test_path", "test"),
)
LAYOUT_MARKER = ".feedline-layout.json"  # writers/lazy_layout.py's MARKER in a layout: {"src": the tree}
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
DEPTH = 4  # conversions of conversions are followed back this far
# In a source's repr: its type (a root or path is its first argument) and the root or path it names
_NAMED = re.compile(r"(?:\b(\w+)\()?\b(root|path)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
TARS = "WdsSource"  # a source whose path names WebDataset tars (a directory, a pattern, a tar)


@dataclass(frozen=True)
class Place:
    """Where data is, as it compares whatever it was called."""

    shown: str
    real: str  # a real local path, or s3://bucket/prefix
    remote: bool = False
    node: tuple | None = None  # (device, inode) of a local path that exists
    folder: bool = True  # a directory, or not known: what lies under it is part of it
    shards: bool = False  # a shards dataset: of what lies under it, only its part folders are part of it
    endpoint: str | None = None  # a URL's endpoint; None where it is not known (a conversion's record)
    key: str | None = None  # an HDF5 file's images key; None: any
    slice: tuple | None = None  # (K, N, seed, shuffle, rows): part K of a conversion into N parts
    classes: frozenset | None = None  # the class names of the data, where they are known


@dataclass
class Data:
    """What one key of a source reads: its role (train, val, test), its places, and what they were made from."""

    key: str
    role: str
    shown: str
    places: list[Place]
    origins: list[Place]


# -- places ----------------------------------------------------------------------------------------------------
def local_place(path: str, key: str | None = None, slice: tuple | None = None) -> Place:
    real = os.path.realpath(os.path.expanduser(str(path)))
    try:
        st = os.stat(real)
    except OSError:  # not there yet (written in prepare()): its path is all there is to compare
        return Place(str(path), real, key=key, slice=slice)
    folder = stat.S_ISDIR(st.st_mode)
    return Place(
        str(path), real, node=(st.st_dev, st.st_ino), folder=folder, key=None if folder else key, slice=slice
    )


def url_place(url: str, options: dict | None = None, live: bool = True, slice: tuple | None = None) -> Place:
    store = S3Store(url, options)
    endpoint = None
    if live:
        try:
            endpoint = store.endpoint  # a client's endpoint: the options', the environment's or the profile's
        except Exception:  # no client (a profile that does not exist): the source's own checks say so
            endpoint = (options or {}).get("endpoint_url") or ""
    return Place(str(url), store.where("").rstrip("/"), remote=True, endpoint=endpoint, slice=slice)


def _places(value: str, options: dict | None, key: str | None, tars: bool, dataset: bool) -> list[Place]:
    """The places ``value`` names; ``tars``: WebDataset shards (a directory, a tar, a pattern), each tar one;
    ``dataset``: a path, which is a shards dataset where it is a directory or a prefix."""
    if is_url(value):
        return [_dataset(url_place(value, options), dataset)]
    if tars:
        with contextlib.suppress(OSError, ValueError):  # a missing tar: the source names it
            return [local_place(tar) for tar in find_tars(value)]
    return [_dataset(local_place(value, key), dataset)]


def _dataset(place: Place, dataset: bool) -> Place:
    """``place`` marked as a shards dataset where it is one: a prefix, or a local directory a path names."""
    return replace(place, shards=True) if place.remote or (dataset and place.folder and place.node) else place


# -- origins: what a conversion or a layout records of the data it was made from ------------------------------
def _slice(sidecar: dict) -> tuple | None:
    if sidecar.get("part") is None or not sidecar.get("parts"):
        return None
    return tuple(sidecar.get(k) for k in ("part", "parts", "seed", "shuffle", "rows"))


def _sidecars(place: Place, options: dict | None) -> tuple[list, list[tuple[str, tuple | None]]]:
    """A shards dataset's classes, and its record of its source per part (with the slice the part is)."""
    store = S3Store(place.real, options) if place.remote else LocalStore(place.real)
    sidecars = [read_sidecar(store, rel) for rel in dataset_parts(store)]
    return sidecars[0]["classes"], [(str(sc.get("source") or ""), _slice(sc)) for sc in sidecars]


def _hdf5_record(place: Place) -> tuple[list | None, list[tuple[str, None]]]:
    """A feedline HDF5 file's classes and its record of its source."""
    with open(place.real, "rb") as f:
        if f.read(len(HDF5_SIGNATURE)) != HDF5_SIGNATURE:
            return None, []
    import h5py

    from feedline.datasets.hdf5.attrs import feedline_attrs

    with h5py.File(place.real, "r") as f:
        attrs = feedline_attrs(f.attrs, place.real)  # checked as the hdf5 source checks them
    if not attrs:
        return None, []
    return attrs["classes"], [(attrs.get("source", ""), None)]


def _tree_record(place: Place) -> tuple[list, list[tuple[str, None]]]:
    """A tree's classes, and a lazy layout's record of the tree it was laid out from (as a repr names it)."""
    marker = os.path.join(place.real, LAYOUT_MARKER)
    if not os.path.exists(marker):
        return list_classes(place.real), []
    with open(marker, encoding="utf-8") as f:
        return list_classes(place.real), [(f"root={str(json.load(f)['src'])!r}", None)]


def records_of(place: Place, options: dict | None, dataset: bool = False) -> tuple[frozenset | None, list]:
    """(the classes of the data at ``place``, (a source's repr, the slice) of each origin it records): a shards
    dataset's sidecars (``dataset``: a path, which may be one), a tree's lazy layout marker, an HDF5 file's
    attributes."""
    try:
        if _dataset(place, dataset).shards:
            classes, records = _sidecars(place, options)
        elif place.folder and place.node:
            classes, records = _tree_record(place)
        elif place.node:
            classes, records = _hdf5_record(place)
        else:
            return None, []
    except Exception:  # not made from other data, or unreadable: the source's own checks say which
        return None, []
    return (frozenset(map(str, classes)) if classes else None), records


def _named(text: str) -> list[tuple[bool, bool, str]]:
    """(a path, not a root?, tars?, where) of each root and path a source's repr names
    (``FolderSource(root='/d')``, ``WdsSource(path='/d/shards-{000000..000009}.tar')``)."""
    found = []
    for kind, name, quoted in _NAMED.findall(text):
        with contextlib.suppress(ValueError, SyntaxError):
            found.append((name == "path", kind == TARS, str(ast.literal_eval(quoted))))
    return found


def described(text: str) -> list[tuple[bool, str]]:
    """(a path, not a root?, where) of each root and path a source's repr names."""
    return [(path, where) for path, _, where in _named(text)]


def _origins(place: Place, options: dict | None, depth: int = DEPTH) -> tuple[frozenset | None, list]:
    """(the classes of the data at ``place``, the places it was made from, each with those classes: the data
    made from a tree has the tree's classes, or more where it is a mix). WebDataset shards a conversion
    records are the tars they name here, found as the wds source finds them."""
    classes, records = records_of(place, options)
    out: list[Place] = []
    for text, part in records if depth > 0 else []:
        for path, tars, where in _named(text):
            remote = [_dataset(url_place(where, live=False), path)] if is_url(where) else None
            for origin in remote or _places(where, None, None, tars, path):
                origin = replace(origin, slice=part)
                out.append(replace(origin, classes=classes))
                out += [
                    replace(o, slice=o.slice or part, classes=o.classes or classes)
                    for o in _origins(origin, None, depth - 1)[1]
                ]
    return classes, out


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

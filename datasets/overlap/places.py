"""Places: where data is, as it compares however it was named (a local path's device and inode and real
path; an HDF5 file and its images key; an object-storage endpoint, bucket and prefix; each tar of a
WebDataset set), and what a place records of the data it was made from (its *origin*)."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import stat
from dataclasses import dataclass, replace

from feedline.datasets.paths import list_classes
from feedline.datasets.shards.meta import read_sidecar
from feedline.datasets.shards.parts import dataset_parts
from feedline.datasets.wds.tars import find_tars
from feedline.storage.stores import LocalStore, S3Store, is_url

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

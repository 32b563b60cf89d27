"""A shards sample of named fields, read without LitData: its leaves, as LitData's writer lays them out.

    index.json config   "data_format": one serializer name per leaf, "data_spec": the sample's tree (torch's
                        pytree spec as JSON: a dict's keys in "context", its children in "children_spec")
    a sample            uint32 size[leaves] | each leaf's bytes, in the tree's order

The serializers read here are the ones feedline's writer produces (LitData's ``serializers.py``):

    bytes                 the bytes as they are
    int / float           int64 / float64, little-endian
    str                   UTF-8 text
    no_header_numpy:<d>   a 1-D array of dtype number d (LitData's ``_NUMPY_DTYPES_MAPPING``), its bytes
    numpy                 uint32 dtype number | uint32 ndim | uint32 shape[ndim] | the array's bytes (C order)

A leaf's path is its keys from the root: ``("objects", "boxes")`` is ``sample["objects"]["boxes"]``. A
layout that holds anything else (a tuple, a pickled object, another serializer) is refused where the index is
read (``layout_of``); a sample whose bytes do not parse is an ``OSError`` naming its chunk (``chunks.py``).
Standard library and numpy only.
"""

from __future__ import annotations

import json
import struct

import numpy as np

# LitData's _NUMPY_DTYPES_MAPPING, by index: the numeric and bool dtypes (its object, bytes, str and void
# dtypes are never written by feedline and never read)
NUMPY_DTYPES = {
    i: np.dtype(t)
    for i, t in enumerate(
        ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16", "?"]
    )
}
FIXED = {"int": 8, "float": 8}  # the bytes of a leaf of fixed size
PLAIN = ("bytes", "int", "float", "str", "numpy")


class LayoutError(ValueError):
    """index.json's data_format and data_spec are not a layout feedline reads."""


def known(name: str) -> bool:
    if name in PLAIN:
        return True
    head, _, index = name.partition(":")
    return head == "no_header_numpy" and index.isdigit() and int(index) in NUMPY_DTYPES


def leaf_paths(spec) -> list[tuple[str, ...]]:
    """The path of each leaf of LitData's ``data_spec`` (its JSON text), in order: dicts of leaves only."""
    if isinstance(spec, str):
        spec = json.loads(spec)
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], dict)):
        raise LayoutError(f"data_spec {str(spec)[:80]!r} is no pytree spec")
    out: list[tuple[str, ...]] = []

    def walk(node: dict, path: tuple[str, ...]) -> None:
        kind, children = node.get("type"), node.get("children_spec") or []
        if kind is None and not children:
            out.append(path)
            return
        if kind != "builtins.dict":
            raise LayoutError(
                f"the sample's tree holds a {kind} at {'.'.join(path) or 'its root'}, not a dict"
            )
        keys = json.loads(node.get("context") or "[]")
        if len(keys) != len(children) or not all(isinstance(k, str) for k in keys):
            raise LayoutError(f"the sample's tree at {'.'.join(path) or 'its root'} is malformed")
        for key, child in zip(keys, children):
            walk(child, (*path, key))

    walk(spec[1], ())
    return out


def layout_of(config: dict) -> list[tuple[tuple[str, ...], str]]:
    """(path, serializer) of each leaf of a fields sample, from index.json's config, or a LayoutError."""
    formats = config.get("data_format")
    try:
        paths = leaf_paths(config.get("data_spec"))
    except (ValueError, TypeError) as err:
        raise LayoutError(str(err)) from None
    if not isinstance(formats, list) or len(formats) != len(paths) or not paths[0]:
        raise LayoutError(f"data_format {formats} does not match the sample's tree of {len(paths)} leaves")
    unknown = [f for f in formats if not (isinstance(f, str) and known(f))]
    if unknown:
        raise LayoutError(
            f"serializer {unknown[0]!r} is not one feedline reads ({', '.join(PLAIN)}, no_header_numpy)"
        )
    return [(tuple(p), f) for p, f in zip(paths, formats)]


def split_leaves(data, count: int) -> list:
    """The ``count`` leaves of one sample's bytes (views, no copy), or a ValueError."""
    head = 4 * count
    if len(data) < head:
        raise ValueError(f"{len(data)} bytes hold no header of {count} sizes")
    sizes = struct.unpack_from(f"<{count}I", data, 0)
    if head + sum(sizes) != len(data):
        raise ValueError(f"leaf sizes {list(sizes)} do not add up to its {len(data) - head} bytes")
    out, at = [], head
    for size in sizes:
        out.append(data[at : at + size])
        at += size
    return out


def decode_leaf(name: str, data):
    """One leaf's value, as LitData's serializer ``name`` reads it (an array: a view of ``data``)."""
    if name == "bytes":
        return np.frombuffer(data, dtype=np.uint8)
    if name == "int":
        return struct.unpack("<q", data)[0]
    if name == "float":
        return struct.unpack("<d", data)[0]
    if name == "str":
        return bytes(data).decode("utf-8")
    if name == "numpy":
        dtype_index, ndim = struct.unpack_from("<II", data, 0)
        if dtype_index not in NUMPY_DTYPES or len(data) < 8 + 4 * ndim:
            raise ValueError(f"a numpy leaf of dtype number {dtype_index} and {ndim} dimensions")
        shape = struct.unpack_from(f"<{ndim}I", data, 8)
        dtype = NUMPY_DTYPES[dtype_index]
        body = len(data) - 8 - 4 * ndim
        if body != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise ValueError(f"a numpy leaf of shape {shape} in {body} bytes")
        return np.frombuffer(data, dtype=dtype, offset=8 + 4 * ndim).reshape(shape)
    dtype = NUMPY_DTYPES[int(name.split(":")[1])]
    if len(data) % dtype.itemsize:
        raise ValueError(f"{len(data)} bytes are no whole number of {dtype} values")
    return np.frombuffer(data, dtype=dtype)


def decode_sample(layout, data) -> dict:
    """The sample (nested dicts) whose bytes are ``data``, or a ValueError saying what does not parse."""
    sample: dict = {}
    for (path, name), leaf in zip(layout, split_leaves(data, len(layout))):
        if name in FIXED and len(leaf) != FIXED[name]:
            raise ValueError(f"leaf {'.'.join(path)} ({name}) holds {len(leaf)} bytes")
        node = sample
        for key in path[:-1]:
            node = node.setdefault(key, {})
        try:
            node[path[-1]] = decode_leaf(name, leaf)
        except (ValueError, struct.error, UnicodeDecodeError) as err:
            raise ValueError(f"leaf {'.'.join(path)} ({name}): {err}") from None
    return sample

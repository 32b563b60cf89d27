"""What an HDF5 file holds, found once in the main process: keys, array layout, value scale, classes.

Layout written by ``convert.py`` (``FORMAT`` 1):

    images   encoded: variable-length uint8 (the original or re-encoded file bytes), shape (N,)
             raw:     uint8 (N, H, W, 3), resized once at conversion, no decode when training
    labels   int64 (N,)
    attrs    feedline_format, classes (JSON), mode, max_side, size, quality, source

Foreign files are read too, when their keys and layout are given in config: for example a float32
(N, 3, H, W) ``images`` dataset with values in [0, 1] and an int64 ``labels`` dataset.
"""

from __future__ import annotations

import json

import h5py
import numpy as np

FORMAT = 1
LAYOUTS = ("auto", "hwc", "chw")
SCALES = {"uint8": 255.0, "float32": 1.0, "float16": 1.0, "float64": 1.0}


def open_hdf5(path: str, key: str = "source.path") -> h5py.File:
    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise FileNotFoundError(f"{key} '{path}' does not exist (set {key}=... or check the path)") from None
    except OSError as err:
        raise OSError(
            f"{key} '{path}' cannot be read as HDF5 ({str(err).splitlines()[0]}): the file may be truncated "
            f"or still being written; convert it again with convert.py"
        ) from None


def _mappable(dataset) -> tuple | None:
    """(file offset, shape, dtype) when numpy can map the dataset directly: contiguous, uncompressed,
    allocated, and of a plain numeric type."""
    if dataset.chunks is not None or dataset.compression or dataset.dtype.kind not in "uif":
        return None
    offset = dataset.id.get_offset()
    return None if offset is None else (int(offset), tuple(dataset.shape), dataset.dtype.str)


def inspect_file(path: str, key: str, images_key: str, labels_key: str, layout: str, dtype) -> dict:
    """Check the file once, in the main process, and close it before any worker exists."""
    with open_hdf5(path, key) as f:
        for name, which in (
            (images_key, "source.images_key"),
            (labels_key, "source.labels_key"),
        ):
            if name not in f:
                raise KeyError(
                    f"{key} '{path}' has no dataset '{name}' (set {which}=...; it holds: "
                    f"{', '.join(f.keys())})"
                )
        images, labels = f[images_key], f[labels_key]
        if len(images) != len(labels):
            raise ValueError(f"{key} '{path}': {len(images)} images but {len(labels)} labels")
        encoded = h5py.check_vlen_dtype(images.dtype) is not None
        info = {
            "encoded": encoded,
            "layout": _layout(images, layout, path) if not encoded else "hwc",
            "scale": SCALES[str(dtype)] if dtype else (255.0 if images.dtype.kind in "ui" else 1.0),
            "classes": _read_classes(f, labels),
            "n": len(labels),
            "mapped": _mappable(images) if not encoded else None,
        }
    return info


def _layout(images, layout: str, path: str) -> str:
    if images.ndim == 3:  # (N, H, W): grayscale
        return "hw"
    if images.ndim != 4:
        raise ValueError(
            f"source.path '{path}': images of shape {images.shape} are neither encoded bytes "
            f"nor (N, H, W, C) / (N, C, H, W) arrays"
        )
    stored = images.attrs.get("layout")
    if layout == "auto" and stored in ("hwc", "chw"):
        return stored
    if layout != "auto":
        return layout
    channels_last, channels_first = images.shape[3] in (1, 3), images.shape[1] in (1, 3)
    if channels_last != channels_first:
        return "hwc" if channels_last else "chw"
    raise ValueError(
        f"source.path '{path}': cannot tell the layout of images {images.shape}; "
        f"set source.layout=hwc or source.layout=chw"
    )


def _read_classes(f: h5py.File, labels) -> list[str]:
    if "classes" in f.attrs:
        return list(json.loads(f.attrs["classes"]))
    top = int(np.max(labels[:])) if len(labels) else -1
    return [str(c) for c in range(top + 1)]

"""What an HDF5 file holds, found once in the main process: keys, array layout, value scale, classes.

Layout written by ``convert.py`` (``FORMAT`` 1):

    images   encoded: the original or re-encoded file bytes, one flat uint8 array of every row's bytes with
                      ``offsets`` int64 (N + 1) beside it (layout attr ``ragged-bytes``), so readers map it;
                      files written before, or by other tools, hold variable-length uint8 (N,) instead
             raw:     uint8 pixels, resized once at conversion, no decode when training; either whole images
                      at their aspect ratio (``out.max_side``; layout attr ``ragged-hwc``): one flat array of
                      every row's H*W*3 bytes, with ``shapes`` int32 (N, 3) and ``offsets`` int64 (N + 1);
                      or centre-cropped squares (``out.size``): uint8 (N, S, S, 3)
    labels   int64 (N,)
    attrs    feedline_format, classes (JSON), mode, max_side, size, quality, source (``datasets/hdf5/attrs.py``)

Named fields (``columns.py``): other datasets beside ``images`` (masks, numbers, vectors, classes, text), named
by ``source.fields`` or by the file's own ``fields`` attribute; such a file needs no ``labels``.

Foreign files are read too, when their keys and layout are given in config: for example a float32
(N, 3, H, W) ``images`` dataset with values in [0, 1] and an int64 ``labels`` dataset.
"""

from __future__ import annotations

import logging

import h5py
import numpy as np

from feedline.datasets.hdf5.attrs import FORMAT as FORMAT  # the writer's, checked with the attributes
from feedline.datasets.hdf5.attrs import feedline_attrs, read_classes
from feedline.datasets.hdf5.columns import inspect_columns, resolve_fields
from feedline.datasets.hdf5.files import identity, open_hdf5

LAYOUTS = ("auto", "hwc", "chw")
RAGGED = "ragged-hwc"  # raw whole images of varying size, one flat pixel array (see above)
RAGGED_BYTES = "ragged-bytes"  # encoded images, one flat byte array (see above)
SCALES = {"uint8": 255.0, "float32": 1.0, "float16": 1.0, "float64": 1.0}

log = logging.getLogger(__name__)


def _mappable(dataset) -> tuple | None:
    """(file offset, shape, dtype) when numpy can map the dataset directly: contiguous, uncompressed,
    allocated, and of a plain numeric type."""
    if dataset.chunks is not None or dataset.compression or dataset.dtype.kind not in "uif":
        return None
    offset = dataset.id.get_offset()
    return None if offset is None else (int(offset), tuple(dataset.shape), dataset.dtype.str)


def inspect_file(
    path: str,
    key: str,
    images_key: str,
    labels_key: str,
    layout: str,
    dtype,
    named: bool = False,
    fields=None,
    target: str | None = None,
) -> dict:
    """Check the file once, in the main process, and close it before any worker exists. ``named``: the
    classes are given (source.classes), so the file's own are not read (its ``classes`` is None). A file of
    named fields (``fields``, or its own ``fields`` attribute: ``columns.py``) has no labels dataset: its
    input image's column is the images, and every other field's column is checked."""
    with open_hdf5(path, key) as f:
        where = f"{key} '{path}'"
        named_fields = resolve_fields(f, fields, target, where, images_key)
        if named_fields is not None:
            images_key, labels_key = named_fields[named_fields.input].source_column, None
        for name, which in ((images_key, "source.images_key"), (labels_key, "source.labels_key")):
            if name is not None and name not in f:
                which = f"source.fields.{named_fields.input}.column" if named_fields else which
                raise KeyError(
                    f"{where} has no dataset '{name}' (set {which}=...; it holds: {', '.join(f.keys())})"
                )
        images = f[images_key]
        _check_images(images, images_key, where)
        labels = f[labels_key] if labels_key is not None else None
        if labels is not None and not isinstance(labels, h5py.Dataset):
            raise ValueError(
                f"{where}: '{labels_key}' is a group, not a dataset: set source.labels_key to the dataset of labels"
            )
        if labels is not None:
            check_label_shape(labels.shape, f"{where}: labels '{labels_key}'")
        vlen = h5py.check_vlen_dtype(images.dtype) is not None
        packed = images.attrs.get("layout") if not vlen else None
        ragged = packed in (RAGGED, RAGGED_BYTES)
        encoded = vlen or packed == RAGGED_BYTES
        rows = len(f["offsets"]) - 1 if ragged and "offsets" in f else len(images)
        n = len(labels) if labels is not None else rows
        if rows != n:
            raise ValueError(f"{where}: {rows} images but {n} labels")
        named = named or named_fields is not None
        feedline_attrs(f.attrs, where, encoded, classes=not named)  # a feedline file's own, each checked
        info = {
            "encoded": encoded,
            "layout": packed if ragged else _layout(images, layout, path) if not encoded else "hwc",
            "ragged": _ragged_index(f, images, n, where, packed) if ragged else None,
            "scale": 1.0 if encoded else _scale(images, dtype, where),
            "classes": None if named else _read_classes(f, labels, where, f"{where}: labels '{labels_key}'"),
            "n": n,
            "mapped": _mappable(images) if not vlen else None,
            "key": key,
            "identity": identity(f.id.get_vfd_handle()),  # every later open checks it is still this file
            "images_key": images_key,
            "fields": named_fields,
            "columns": inspect_columns(f, named_fields, n, where) if named_fields else None,
        }
    return info


def _check_images(images, name: str, where: str) -> None:
    """``images`` is an array of rows that can hold images (a dataset of at least one axis, numbers or bytes,
    no axis of size 0 past the rows), or an error naming the file and ``source.images_key``."""
    fix = f"set source.images_key to the dataset of images (now '{name}')"
    if not isinstance(images, h5py.Dataset):
        raise ValueError(f"{where}: '{name}' is a group, not a dataset: {fix}")
    if images.ndim == 0:
        raise ValueError(f"{where}: '{name}' is a scalar, not an array of images: {fix}")
    if h5py.check_vlen_dtype(images.dtype) is not None:
        return
    if images.dtype.kind not in "uifb":
        raise ValueError(f"{where}: images of dtype {images.dtype} are not pixels or encoded bytes: {fix}")
    if 0 in images.shape[1:]:
        raise ValueError(f"{where}: images of shape {images.shape} have an axis of size 0: {fix}")


def _ragged_index(f: h5py.File, images, n: int, where: str, layout: str) -> dict:
    """Where the ``offsets`` (and, for raw pixels, the ``shapes``) of a ragged file are (mapped, or to be read
    whole), checked against the flat array: a file cut short or edited by hand fails here, not as a wrong
    image later."""
    names = ("shapes", "offsets") if layout == RAGGED else ("offsets",)
    what = "ragged raw images" if layout == RAGGED else "packed encoded images"
    for name in names:
        if name not in f:
            raise KeyError(f"{where}: {what} without a '{name}' dataset: convert the file again")
    offsets = f["offsets"]
    shapes = f["shapes"].shape if layout == RAGGED else (n, 3)
    if shapes != (n, 3) or offsets.shape != (n + 1,):
        raise ValueError(
            f"{where}: {' and '.join(f'{k} {f[k].shape}' for k in names)} do not fit {n} rows: convert the file again"
        )
    if n and int(offsets[-1]) != len(images):
        raise ValueError(
            f"{where}: the offsets end at {int(offsets[-1])} but the flat array holds {len(images)} bytes: "
            f"the file is truncated or damaged; convert it again"
        )
    return {name: _mappable(f[name]) for name in names}


def _layout(images, layout: str, path: str) -> str:
    if images.ndim == 3:  # (N, H, W): grayscale
        return "hw"
    if images.ndim != 4:
        raise ValueError(
            f"source.path '{path}': images of shape {images.shape} are neither encoded bytes "
            f"nor (N, H, W, C) / (N, C, H, W) arrays"
        )
    stored = images.attrs.get("layout")
    channels_last, channels_first = images.shape[3] in (1, 3), images.shape[1] in (1, 3)
    if layout == "auto" and stored in ("hwc", "chw"):
        if not (channels_last if stored == "hwc" else channels_first):  # read so, pixels would be garbage
            raise ValueError(
                f"source.path '{path}': its images' 'layout' attribute says {stored}, but images of shape "
                f"{images.shape} have no 1 or 3 channels there: set source.layout=hwc or source.layout=chw"
            )
        return stored
    if layout != "auto":
        return layout
    if channels_last != channels_first:
        return "hwc" if channels_last else "chw"
    raise ValueError(
        f"source.path '{path}': cannot tell the layout of images {images.shape}; "
        f"set source.layout=hwc or source.layout=chw"
    )


IMPLIED_CLASSES = 1 << 16  # classes 0..max label a file may imply without naming them, beyond twice its rows


def _read_classes(f: h5py.File, labels, file: str, where: str) -> list[str]:
    """The file's ``classes`` attribute (checked: ``datasets/hdf5/attrs.py``), else "0".."max label". A label past
    both twice the rows and IMPLIED_CLASSES is refused, never counted up to (2**40 would be a trillion class
    names and a model head as wide)."""
    names = read_classes(f.attrs, file)
    if names is not None:
        return names
    values = check_labels(labels[:], None, where)
    top = int(np.max(values)) if len(values) else -1
    if top + 1 > max(2 * len(values), IMPLIED_CLASSES):
        row = int(np.argmax(values))
        raise ValueError(
            f"{where} holds label {top} at row {row}, and the file names no classes (no 'classes' attribute): "
            f"its classes would be 0..{top}, {top + 1} of them for {len(values)} images. Labels are class "
            "indices 0..C-1: fix the file's labels, or set source.labels_key to such a dataset"
        )
    return [str(c) for c in range(top + 1)]


def check_labels(values, num_classes: int | None, where: str) -> np.ndarray:
    """``values`` as int64 class indices, or an error naming ``where``, the first bad value and its row:
    non-integer labels (0.7), negative ones, and, with ``num_classes``, ones out of range. Trailing axes of
    size 1 ((N, 1), PCam's (N, 1, 1, 1)) are dropped."""
    values = np.asarray(values)
    values = values.reshape(check_label_shape(values.shape, where))
    if values.dtype.kind == "f":
        bad = np.flatnonzero(values != np.floor(values))
        if len(bad):
            raise ValueError(
                f"{where} holds non-integer labels ({len(bad)} of {len(values)}; first: {values[bad[0]].item()!r} at "
                f"row {bad[0]}): class labels must be whole numbers; fix the file or set source.labels_key"
            )
    elif values.dtype.kind not in "ui":
        raise ValueError(
            f"{where} has dtype {values.dtype}, not integer class labels (set source.labels_key)"
        )
    values = values.astype(np.int64, copy=False)
    problems = [(values < 0, "negative")]
    if num_classes is not None:
        problems.append(
            (values >= num_classes, f"out of range for {num_classes} classes (0..{num_classes - 1})")
        )
    for mask, what in problems:
        bad = np.flatnonzero(mask)
        if len(bad):
            raise ValueError(
                f"{where} holds {what} labels ({len(bad)} of {len(values)}; first: {values[bad[0]]} at row "
                f"{bad[0]}): fix the file, or give the class names with source.classes=[...]"
            )
    return values


def check_label_shape(shape: tuple, where: str) -> int:
    """N, when ``shape`` holds one class index per image: (N,), or (N, 1, ...) with every other axis of size
    1; else an error naming ``where`` and the shape."""
    if len(shape) == 0 or any(d != 1 for d in shape[1:]):
        raise ValueError(
            f"{where} has shape {tuple(shape)}: expected one class index per image, (N,) or (N, 1); set "
            f"source.labels_key to such a dataset (one-hot or multi-label arrays are not class labels)"
        )
    return int(shape[0])


SAMPLED_ROWS = 16  # rows read at open to find the value range of float images


def _scale(images, dtype, where: str) -> float:
    """What a stored value of 1.0 means: 255.0 for 0..255 data, 1.0 for 0..1. Integer arrays are 0..255.
    Float arrays are sampled (SAMPLED_ROWS rows spread over the file): values above 1 mean 0..255, read as
    such with a warning; values outside 0..255 (normalised arrays) cannot be images and are refused."""
    if images.dtype == np.uint8:
        return SCALES[str(dtype)] if dtype else 255.0
    n = len(images)
    rows = np.unique(np.linspace(0, n - 1, min(n, SAMPLED_ROWS)).astype(np.int64)) if n else []
    sample = [np.asarray(images[int(r)]) for r in rows]
    if images.dtype.kind == "f" and any(np.isnan(x).any() for x in sample):
        raise ValueError(f"{where}: float images hold NaN values (sampled {len(sample)} rows): fix the file")
    low = min((float(np.min(x)) for x in sample), default=0.0)
    high = max((float(np.max(x)) for x in sample), default=0.0)
    if images.dtype.kind in "ui":  # wider integers: 0..255 as most tools write them, or 16-bit
        if low < 0 or high > 65535:
            raise ValueError(
                f"{where}: integer images hold values in [{low:g}, {high:g}]: not 8- or 16-bit pixels"
            )
        if dtype:
            return SCALES[str(dtype)]
        if high > 255:
            log.warning(
                "%s: %s images reach %g: reading them as 16-bit (0..65535)", where, images.dtype, high
            )
            return 65535.0
        return 255.0
    if low < 0 or high > 255:
        raise ValueError(
            f"{where}: float images hold values in [{low:g}, {high:g}] (sampled {len(sample)} rows), neither "
            f"0..1 nor 0..255: normalised arrays cannot be read as images; store them unnormalised"
        )
    if dtype:
        scale = SCALES[str(dtype)]
        if scale == 1.0 and high > 1.0:
            log.warning(
                "%s: source.dtype=%s reads values as 0..1, but they reach %g: most pixels will clip to white "
                "(set source.dtype=uint8 to read them as 0..255)",
                where,
                dtype,
                high,
            )
        return scale
    if high > 1.0:
        log.warning(
            "%s: float images hold values up to %g (sampled %d rows): reading them as 0..255 "
            "(set source.dtype=uint8 to say so, or source.dtype=float32 to read them as 0..1)",
            where,
            high,
            len(sample),
        )
        return 255.0
    return 1.0

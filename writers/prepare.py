"""The worker side of a conversion: read one sample of the source, decode it (which validates it), resize
it when asked, and hand back what the writer stores. Each worker process holds the records and the options
as module globals (set once by ``init_worker``) and exits when the converting process dies.
"""

from __future__ import annotations

import ctypes
import os
import signal

import numpy as np
import torch
from torchvision.io import encode_jpeg, encode_png
from torchvision.transforms.v2 import functional as F

from feedline.datasets.records import BadInput
from feedline.transforms.decode import DecodeError, decode
from feedline.writers.hdf5_fields import mask_geometry, prepared
from feedline.writers.options import HDF5WriteOptions

PR_SET_PDEATHSIG = 1  # prctl(2)

_records = None
_options: HDF5WriteOptions | None = None
_fields = None  # a source's named fields (records read dicts); None: (payload, label) records


def init_worker(records, options: HDF5WriteOptions, parent: int, fields=None) -> None:
    global _records, _options, _fields
    die_with(parent)
    _records, _options, _fields = records, options, fields
    torch.set_num_threads(1)


def die_with(parent: int, how: int = signal.SIGKILL) -> None:
    """Make this worker exit when ``parent`` dies, ``kill -9`` included: Linux's parent-death signal (``how``),
    and a check for a parent that died before it was set. Elsewhere the pool's own shutdown is all there is."""
    if os.getpid() == parent:  # run inline, in the converting process itself: nothing to tie
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, how)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), how) if how != signal.SIGKILL else os._exit(1)


def shrunk_size(h: int, w: int, max_side: int) -> tuple[int, int]:
    """(h, w) scaled so the longer side is at most ``max_side``, the aspect ratio kept."""
    scale = max_side / max(h, w)
    return (h, w) if scale >= 1 else (max(1, round(h * scale)), max(1, round(w * scale)))


def shrink(image: torch.Tensor, max_side: int) -> torch.Tensor:
    h, w = image.shape[-2:]
    size = shrunk_size(h, w, max_side)
    return image if size == (h, w) else F.resize(image, list(size), antialias=True)


def prepare(i: int):
    """(payload, label, None) or (None, None, 'path<TAB>error') for sample ``i``. A sample of named fields:
    (payload, {field: stored value}, None), its masks moved as its image is (``hdf5_fields.py``)."""
    try:
        record = _records[i]
        if _fields is None and isinstance(record, dict):
            raise TypeError(
                f"{_records.describe(i)} is a sample of named fields ({', '.join(record)}), and this output "
                "format writes images and labels only: convert to HDF5 (out.format=hdf5)"
            )
        payload, label = (record[_fields.input], record) if _fields is not None else record
        # beside a mask, a photo is turned as its EXIF tag says, as the reader turns it (sample_fields.py)
        image = decode(payload, exif=_fields is not None and bool(_fields.of_kind("mask")))
        if _fields is not None:
            label = prepared(_fields, record, tuple(image.shape[-2:]), _geometry(image))
    except (OSError, DecodeError, BadInput) as err:
        return None, None, f"{_records.describe(i)}\t{err}"
    if _options.mode == "raw":
        if _options.size:  # the explicit centre-crop mode: fixed-size squares
            side = int(_options.size)
            image = F.center_crop(F.resize(image, side, antialias=True), [side, side])
        elif _options.max_side:
            image = shrink(image, int(_options.max_side))
        return image.permute(1, 2, 0).contiguous().numpy(), label, None
    data = encoded_bytes(payload)
    if _options.max_side and max(image.shape[-2:]) > int(_options.max_side):
        data = encode_jpeg(shrink(image, int(_options.max_side)), quality=int(_options.quality)).numpy()
    elif data is None:  # raw pixels (a raw HDF5 file, an array source): an encoded row must be a file
        data = encode_png(image.contiguous()).numpy()  # lossless: the same pixels decode back
    return data, label, None


def _geometry(image: torch.Tensor):
    """What ``prepare`` does to this image's size, for its masks to follow."""
    h, w = image.shape[-2:]
    side = int(_options.max_side or 0)
    return mask_geometry(_options, (h, w), shrunk_size(h, w, side) if side else None)


def encoded_bytes(payload) -> np.ndarray | None:
    """The payload as a 1-D uint8 array when it is an encoded file's bytes; None when it is pixels."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return np.frombuffer(payload, dtype=np.uint8)
    array = np.asarray(payload)
    return array if array.ndim == 1 and array.dtype == np.uint8 else None


def prepare_chunk(indices: range) -> list:
    return [prepare(i) for i in indices]

"""The ``out.*`` options of ``convert.py``: one typed schema, the one place their defaults are written.

``conf/convert.yaml`` extends it (registered by ``feedline.conf.register``), so a misspelt or mistyped
``out.`` key fails at composition, and ``convert.py`` turns the composed node straight into this object.
Standard library only: Hydra imports it at start-up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional  # noqa: UP035 - OmegaConf reads typing's generics

from feedline.datasets.options import HDF5Options, LazyFolderOptions
from feedline.storage.sizes import parse_bytes

MODES = ("encoded", "raw")
MAX_SIDE = 65535  # JPEG's limit, and far beyond any image worth training on
MAX_SQUARE = 13377  # the largest square within the decoders' pixel limit (transforms/decode.py MAX_PIXELS)
MAX_CHUNK = 65536
FORMATS = ("hdf5", "shards")
CHUNK_BYTES = 64 << 20  # shards: the default chunk size
MAX_CHUNK_BYTES = 2 << 30  # a chunk's offsets are uint32, and a chunk closes one sample past its target
MAX_PARTS = 99999  # part-0000K-of-0000N


@dataclass
class WriteOptions:
    path: str = "???"  # hdf5: the file to write (as <path>.partial); shards: the directory; required
    format: str = "hdf5"  # hdf5: one file | shards: a directory of chunks (LitData's format)
    mode: str = "encoded"  # encoded: files (JPEG when resized, PNG from raw pixels) | raw: HWC pixels
    max_side: Optional[int] = None  # noqa: UP045 - shrink so the longer side is at most this (aspect kept)
    size: Optional[int] = None  # noqa: UP045 - raw only: resize the shorter side, centre-crop a square
    quality: int = 90  # JPEG quality for re-encoded images
    workers: Any = "auto"  # decode/resize processes (auto: one per CPU)
    chunk: int = 256  # rows per task and per write
    chunk_bytes: Any = None  # shards: bytes per chunk, 64MB when null (an integer, or "256MB", "1GiB")
    shuffle: Optional[bool] = None  # noqa: UP045 - shards: write in a seeded random order (null: true)
    seed: int = 0  # shards: the seed of that order
    part: Optional[int] = None  # noqa: UP045 - shards: write part K of out.parts (out.path/part-0000K-of-0000N)
    parts: Optional[int] = None  # noqa: UP045 - shards: the number of parts the conversion is split into
    # shards to a URL (out.path=s3://bucket/prefix): boto3's settings for it, as source.storage_options
    storage_options: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006

    def check(self) -> None:
        """Every ``out.*`` value in range, or an error naming its key, before any work starts."""
        if self.format not in FORMATS:
            raise ValueError(f"out.format={self.format!r} is not one of: {', '.join(FORMATS)}")
        path = str(self.path or "")
        if path in ("", "???"):
            raise ValueError(
                "out.path must be set: the HDF5 file to write (out.path=/data/train.h5), or with "
                "out.format=shards the directory (out.path=/data/train-shards)"
            )
        if self.format == "shards":
            self._check_shards(path)
        else:
            self._check_hdf5(path)
        self._check_common()

    def _check_shards(self, path: str) -> None:
        if "://" not in path and os.path.isfile(os.path.expanduser(path)):
            raise ValueError(
                f"out.path={path} is a file: with out.format=shards it names a directory to write"
            )
        if self.mode != "encoded":
            raise ValueError(
                f"out.mode={self.mode} is not offered with out.format=shards: shards hold image files (JPEG when "
                f"out.max_side resizes them); use out.mode=encoded, or out.format=hdf5 for raw pixels"
            )
        self.chunk_byte_count()
        if (self.part is None) != (self.parts is None):
            raise ValueError(
                f"out.part={self.part} and out.parts={self.parts}: set both (part K of N, K from 0) or neither"
            )
        if self.parts is not None:
            parts = _whole(self.parts, "out.parts")
            if not 1 <= parts <= MAX_PARTS:
                raise ValueError(f"out.parts={self.parts} must be in 1..{MAX_PARTS}")
            if not 0 <= _whole(self.part, "out.part") < parts:
                raise ValueError(f"out.part={self.part} must be in 0..{parts - 1} (out.parts={parts})")
        if _whole(self.seed, "out.seed") < 0:
            raise ValueError(f"out.seed={self.seed} must be an integer >= 0 (the seed of the order written)")

    def chunk_byte_count(self) -> int:
        """``out.chunk_bytes`` as a number of bytes."""
        value = CHUNK_BYTES if self.chunk_bytes is None else self.chunk_bytes
        return parse_bytes(value, "out.chunk_bytes", 1000, MAX_CHUNK_BYTES, "256MB")

    def _check_hdf5(self, path: str) -> None:
        for key in ("chunk_bytes", "shuffle", "part", "parts"):
            if getattr(self, key) is not None:
                raise ValueError(
                    f"out.{key}={getattr(self, key)} is an option of out.format=shards; an HDF5 file keeps the "
                    f"source's order in one file (unset out.{key}, or set out.format=shards)"
                )
        if "://" in path:
            raise ValueError(
                f"out.path={path}: an HDF5 file is written to a local (or network) path; to write to object "
                f"storage, set out.format=shards"
            )
        if self.storage_options:
            raise ValueError("out.storage_options is an option of out.format=shards written to a URL")
        if path.endswith(("/", os.sep)) or os.path.isdir(os.path.expanduser(path)):
            raise ValueError(
                f"out.path={path} is a directory: name the HDF5 file to write (out.path={path.rstrip('/')}/train.h5), "
                f"or set out.format=shards to write shards into it"
            )

    def _check_common(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"out.mode={self.mode!r} is not one of: {', '.join(MODES)}")
        if self.size is not None and not 1 <= _whole(self.size, "out.size") <= MAX_SQUARE:
            raise ValueError(
                f"out.size={self.size} must be in 1..{MAX_SQUARE} (a {MAX_SQUARE}-pixel square is the largest image a "
                f"decoder accepts: {MAX_SQUARE**2:,} pixels)"
            )
        if self.max_side is not None and not 1 <= _whole(self.max_side, "out.max_side") <= MAX_SIDE:
            raise ValueError(
                f"out.max_side={self.max_side} must be in 1..{MAX_SIDE} (or null: keep every image's size)"
            )
        if self.size is not None and self.mode != "raw":
            raise ValueError(
                f"out.size={self.size} centre-crops raw squares: set out.mode=raw, or use out.max_side"
            )
        if self.size is not None and self.max_side is not None:
            raise ValueError(
                f"out.size={self.size} (centre-cropped squares) and out.max_side={self.max_side} (whole images, "
                f"aspect kept) are two raw layouts: set one"
            )
        if not 1 <= _whole(self.quality, "out.quality") <= 100:
            raise ValueError(f"out.quality={self.quality} must be in 1..100")
        if self.workers not in ("auto", None) and _whole(self.workers, "out.workers", "or 'auto'") < 1:
            raise ValueError(f"out.workers={self.workers} must be an integer >= 1, or 'auto' (one per CPU)")
        if not 1 <= _whole(self.chunk, "out.chunk") <= MAX_CHUNK:
            raise ValueError(
                f"out.chunk={self.chunk} must be in 1..{MAX_CHUNK}: each task holds that many decoded images in "
                f"memory"
            )


HDF5WriteOptions = WriteOptions  # the name callers used before shards


def _whole(value, key: str, alternative: str = "") -> int:
    """``value`` as an int, or an error naming ``key``: 1.5, 'abc' and true are not counts."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).lstrip("-").isdigit():
        raise ValueError(f"{key}={value!r} must be an integer{' ' + alternative if alternative else ''}")
    return int(value)


@dataclass
class ConvertedHDF5Options(HDF5Options):
    """``source.*`` of ``feedline.writers.derived.ConvertedHDF5Source``: hdf5, written from ``origin``."""

    _target_: str = "feedline.writers.derived.ConvertedHDF5Source"
    origin: Any = None  # any source config
    convert_options: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006 - out.* keys, less path


@dataclass
class LaidOutLazyFolderOptions(LazyFolderOptions):
    """``source.*`` of ``feedline.writers.derived.LaidOutLazyFolderSource``: a layout made from ``origin``."""

    _target_: str = "feedline.writers.derived.LaidOutLazyFolderSource"
    origin: Any = None  # a class-folder source config (folder, digits)

"""The ``out.*`` options of ``convert.py``: one typed schema, the one place their defaults are written.

``conf/convert.yaml`` extends it (registered by ``feedline.conf.register``), so a misspelt or mistyped
``out.`` key fails at composition, and ``convert.py`` turns the composed node straight into this object.
Standard library only: Hydra imports it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional  # noqa: UP035 - OmegaConf reads typing's generics

from feedline.datasets.options import HDF5Options, LazyFolderOptions

MODES = ("encoded", "raw")


@dataclass
class HDF5WriteOptions:
    path: str = "???"  # the HDF5 file to write (as <path>.partial, renamed when complete); required
    mode: str = "encoded"  # encoded: files (JPEG when resized, PNG from raw pixels) | raw: HWC pixels
    max_side: Optional[int] = None  # noqa: UP045 - shrink so the longer side is at most this (aspect kept)
    size: Optional[int] = None  # noqa: UP045 - raw only: resize the shorter side, centre-crop a square
    quality: int = 90  # JPEG quality for re-encoded images
    workers: Any = "auto"  # decode/resize processes (auto: one per CPU)
    chunk: int = 256  # rows per task and per write

    def check(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"out.mode={self.mode!r} is not one of: {', '.join(MODES)}")
        if self.size is not None and self.mode != "raw":
            raise ValueError(
                f"out.size={self.size} centre-crops raw squares: set out.mode=raw, or use out.max_side"
            )
        if self.size is not None and self.max_side is not None:
            raise ValueError(
                f"out.size={self.size} (centre-cropped squares) and out.max_side={self.max_side} (whole images, "
                f"aspect kept) are two raw layouts: set one"
            )
        if self.size is not None and int(self.size) < 1:
            raise ValueError(f"out.size={self.size} must be >= 1")
        if self.max_side is not None and int(self.max_side) < 1:
            raise ValueError(f"out.max_side={self.max_side} must be >= 1 (or null: keep the size)")
        if not 1 <= int(self.quality) <= 100:
            raise ValueError(f"out.quality={self.quality} must be in 1..100")


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

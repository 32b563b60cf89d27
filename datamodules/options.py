"""The ``data.*`` knobs: one typed schema, the one place their defaults are written.

``conf/data/default.yaml`` extends this schema (registered by ``feedline.conf.register``), so a misspelt key
(``data.batchsize=8``) or a wrong type (``data.batch_size=big``) fails when the config is composed, before
any work starts; ``ImageDataModule`` takes its defaults from here. Standard library only: Hydra imports it
at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, List, Optional  # noqa: UP035 - OmegaConf reads typing.List

# Functional form, because `raise` cannot be a class attribute.
OnBadSample = Enum("OnBadSample", {"skip": "skip", "raise": "raise"})


def parse_on_bad_sample(value) -> OnBadSample:
    try:
        return OnBadSample(getattr(value, "value", value))
    except ValueError:
        raise ValueError(f"data.on_bad_sample={value!r} is not one of: skip, raise") from None


MEMORY_FORMATS = ("contiguous", "channels_last")


@dataclass
class DataConfig:
    _target_: str = "feedline.datamodules.ImageDataModule"
    _recursive_: bool = False  # the datamodule builds source/transforms/collate and saves their config
    source: Any = "${source}"
    transforms: Any = "${transforms}"
    collate: Any = "${collate}"
    batch_size: int = 64  # per device, Lightning's convention
    global_batch_size: Optional[int] = None  # noqa: UP045 - OmegaConf needs Optional; split over the devices
    num_workers: Any = "auto"  # int >= 0 or "auto": the CPUs per device, minus one
    pin_memory: Any = "auto"  # true, false or "auto": on when training on a GPU
    persistent_workers: bool = True
    prefetch_factor: Optional[int] = 2  # noqa: UP045
    on_bad_sample: OnBadSample = OnBadSample.skip  # skip (report the path, train on) | raise
    max_bad_fraction: float = 0.01  # skip: stop once more than this share of a split is unreadable
    multiprocessing_context: Optional[str] = None  # noqa: UP045 - fork, spawn, forkserver; null: the default
    drop_last: bool = False
    reduced_decode: bool = True  # JPEGs decode at 1/2, 1/4, 1/8 when the first transform shrinks that much
    window_decode: bool = True  # JPEGs decode only what the first crop keeps (the C extension); same crops
    max_pixels: Optional[int] = None  # noqa: UP045 - an image claiming more is a bad sample; null: PIL's limit, 0: none
    predict_root: Optional[str] = None  # noqa: UP045 - trainer.predict: every image below it, sorted by path
    memory_format: str = "contiguous"  # image batches on the device, every split: contiguous | channels_last
    seed: Optional[int] = None  # noqa: UP045 - train order and augmentation; null: the run's seed, else 0
    resume: str = "strict"  # loader state that does not fit the run: strict (refuse) | lenient (warn, go on)
    # the stages a run will use (fit, validate, test, predict): the first setup() builds every split they need,
    # so a missing test split fails before training; null: each split is built when its stage starts
    stages: Optional[List[str]] = None  # noqa: UP006, UP045

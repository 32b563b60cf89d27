"""Structured-config schemas: the knobs users type most are type-checked before any work starts.

Registered in Hydra's ConfigStore on import; ``conf/data/default.yaml`` extends ``data_schema``, so a
misspelt key (``data.batchsize=``) or a wrong type (``data.batch_size=big``) fails at composition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from datamodules.samples import OnBadSample


@dataclass
class DataConfig:
    _target_: str = "datamodules.image.ImageDataModule"
    source: Any = None
    transforms: Any = None
    collate: Any = None
    batch_size: int = 64  # per device, Lightning's convention
    global_batch_size: Optional[int] = None  # noqa: UP045 - OmegaConf needs Optional
    num_workers: Any = "auto"  # int >= 0 or "auto"
    pin_memory: Any = "auto"  # true, false or "auto"
    persistent_workers: bool = True
    prefetch_factor: Optional[int] = 2  # noqa: UP045
    on_bad_sample: OnBadSample = OnBadSample.skip  # skip | raise
    multiprocessing_context: Optional[str] = None  # noqa: UP045 - fork, spawn, forkserver
    drop_last: bool = False
    reduced_decode: bool = True  # JPEGs decode at 1/2, 1/4, 1/8 when the first transform shrinks that much


def register_configs() -> None:
    ConfigStore.instance().store(group="data", name="data_schema", node=DataConfig)


register_configs()

"""The ``bench.*`` keys of ``bench.py``: one typed schema, the one place their defaults are written.

``conf/bench.yaml`` extends it (registered by ``feedline.conf.register``), so a misspelt key
(``bench.batchs=``) or a wrong type (``bench.batches=abc``) fails when the config is composed, naming the
key; ``check()`` refuses values out of range (``bench.batches=0``, ``bench.seconds=-1``) before any work
starts. Standard library only: Hydra imports it at start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

SWEEP = "sweep"
WORKERS_PER_CPU = 8  # bench.workers above this many per CPU is refused: each worker is a process


@dataclass
class BenchOptions:
    batches: int = 50  # batches timed after the warm-up ...
    seconds: Optional[float] = None  # noqa: UP045 - ... or time this many seconds instead
    warmup: int = 3  # batches skipped first (worker start-up, page cache)
    sample_items: int = 128  # items timed stage by stage, in this process
    workers: Any = None  # null: data.num_workers | an integer >= 0 | sweep: 0, 1, 2, ... up to the CPU count
    sweep_batches: int = 20  # batches per point of the sweep
    model_step: bool = False  # true: also time one training step of the model on the trainer's device
    anchor: bool = (
        False  # true: also time torchvision's ImageFolder on the same class folders (folder sources)
    )
    json_path: Optional[str] = None  # noqa: UP045 - where the result is written as JSON; null: nowhere
    plot_path: Optional[str] = None  # noqa: UP045 - where the result is drawn (PNG); null: not drawn

    def check(self, cpus: int | None = None) -> BenchOptions:
        """Refuse what would measure nothing, or something other than asked, naming the key; returns self."""
        for key in ("batches", "sample_items", "sweep_batches"):
            _at_least(key, getattr(self, key), 1)
        _at_least("warmup", self.warmup, 0)
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(
                f"bench.seconds={self.seconds} must be a number of seconds > 0, or null to time bench.batches"
            )
        self.workers = parse_workers(self.workers, cpus)
        return self


def _at_least(key: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"bench.{key}={value!r} must be an integer >= {least}")


def parse_workers(value, cpus: int | None = None) -> int | str | None:
    """``bench.workers``: null (data.num_workers), ``sweep``, or a count from 0 to WORKERS_PER_CPU per CPU."""
    if value is None or value == SWEEP:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"bench.workers={value!r} must be an integer >= 0, 'sweep' (0, 1, 2, ... up to the CPU count) or "
            f"null (data.num_workers)"
        )
    if cpus is not None and value > WORKERS_PER_CPU * cpus:
        raise ValueError(
            f"bench.workers={value} is more than {WORKERS_PER_CPU} worker processes per CPU ({cpus} CPU(s) "
            f"here): at most {WORKERS_PER_CPU * cpus}; bench.workers=sweep measures 0..{cpus}"
        )
    return value

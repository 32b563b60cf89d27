"""Callbacks: Lightning's (throughput) and Hydra's (the sweep summary)."""

from typing import TYPE_CHECKING

from feedline.public import exports as _exports

if TYPE_CHECKING:  # for type checkers and editors; at run time each name is imported on first use
    from feedline.callbacks.checkpoint import ModelCheckpoint
    from feedline.callbacks.csv_logger import CSVLogger
    from feedline.callbacks.model_summary import ModelSummary
    from feedline.callbacks.sweep_summary import SweepSummary
    from feedline.callbacks.throughput import ThroughputMonitor

__all__ = [
    "ModelCheckpoint",
    "CSVLogger",
    "ModelSummary",
    "ThroughputMonitor",
    "SweepSummary",
]
__getattr__, __dir__ = _exports(__name__)

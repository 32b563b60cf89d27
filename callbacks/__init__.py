"""Callbacks: Lightning's (throughput) and Hydra's (the sweep summary)."""

from feedline.public import exports

__getattr__, __dir__ = exports(__name__)

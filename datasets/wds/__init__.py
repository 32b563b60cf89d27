"""The wds family: WebDataset tars as they are published, indexed once and read by offset."""

from feedline.public import exports as _exports

__getattr__, __dir__ = _exports(__name__)

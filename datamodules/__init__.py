"""LightningDataModules: wire a source, transform stacks and a collate into Lightning's hooks."""

from feedline.public import exports

__getattr__, __dir__ = exports(__name__)

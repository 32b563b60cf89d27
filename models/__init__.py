"""LightningModules and networks the default runs and tests train."""

from feedline.public import exports

__getattr__, __dir__ = exports(__name__)

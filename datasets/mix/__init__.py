"""The mix family: several sources as one, each part drawn by weight or count every epoch."""

from feedline.public import exports as _exports

__getattr__, __dir__ = _exports(__name__)

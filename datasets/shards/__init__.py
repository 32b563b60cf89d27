"""The shards family: LitData's chunk format on a disk or in object storage, read in O(1) per sample, in a chunk-aware order."""

from feedline.public import exports as _exports

__getattr__, __dir__ = _exports(__name__)

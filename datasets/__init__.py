"""Sources: where samples live. Each implements ``classes``, ``prepare()`` and ``split(name)``."""

from typing import TYPE_CHECKING

from feedline.public import exports as _exports

if TYPE_CHECKING:  # for type checkers and editors; at run time each name is imported on first use
    from feedline.datasets.coco.source import CocoSource
    from feedline.datasets.fields import Field, Fields
    from feedline.datasets.folder.digits import DigitsSource
    from feedline.datasets.folder.lazy import LazyFolderSource
    from feedline.datasets.folder.seg import SegFolderSource
    from feedline.datasets.folder.source import FolderSource
    from feedline.datasets.hdf5.source import HDF5Source
    from feedline.datasets.manifest.source import ManifestSource
    from feedline.datasets.mix.source import MixSource
    from feedline.datasets.records import BadInput, RecordSet, Source
    from feedline.datasets.shapes.coco import ShapesCocoSource
    from feedline.datasets.shapes.source import ShapesSource
    from feedline.datasets.shards.source import ShardsSource
    from feedline.datasets.wds.source import WdsSource

__all__ = [
    "Source",
    "RecordSet",
    "BadInput",
    "Field",
    "Fields",
    "FolderSource",
    "LazyFolderSource",
    "DigitsSource",
    "HDF5Source",
    "SegFolderSource",
    "ShardsSource",
    "WdsSource",
    "MixSource",
    "ManifestSource",
    "ShapesSource",
    "CocoSource",
    "ShapesCocoSource",
]
__getattr__, __dir__ = _exports(__name__)

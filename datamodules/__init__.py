"""LightningDataModules: wire a source, transform stacks and a collate into Lightning's hooks."""

from typing import TYPE_CHECKING

from feedline.public import exports as _exports

if TYPE_CHECKING:  # for type checkers and editors; at run time each name is imported on first use
    from feedline.datamodules.image import ImageDataModule
    from feedline.datamodules.loaders import ImageLoaders
    from feedline.datamodules.options import DataConfig

__all__ = [
    "ImageDataModule",
    "ImageLoaders",
    "DataConfig",
]
__getattr__, __dir__ = _exports(__name__)

"""Decode, transform stacks and collate: payload -> uint8 CHW tensor -> batch."""

from typing import TYPE_CHECKING

from feedline.public import exports as _exports

if TYPE_CHECKING:  # for type checkers and editors; at run time each name is imported on first use
    from feedline.transforms.batch import Batch
    from feedline.transforms.boxes import SanitizeBoxes
    from feedline.transforms.collate import DefaultCollate, PadCollate, Uint8Collate
    from feedline.transforms.crop import RandomResizedCrop
    from feedline.transforms.detection_collate import DetectionCollate
    from feedline.transforms.flip import RandomHorizontalFlip
    from feedline.transforms.mix import MixupCutmix
    from feedline.transforms.stacks import TransformStacks

__all__ = [
    "TransformStacks",
    "DefaultCollate",
    "Uint8Collate",
    "PadCollate",
    "DetectionCollate",
    "SanitizeBoxes",
    "MixupCutmix",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "Batch",
]
__getattr__, __dir__ = _exports(__name__)

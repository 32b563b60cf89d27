"""LightningModules and networks the default runs and tests train."""

from typing import TYPE_CHECKING

from feedline.public import exports as _exports

if TYPE_CHECKING:  # for type checkers and editors; at run time each name is imported on first use
    from feedline.models.classifier import ImageClassifier
    from feedline.models.detector import Detector
    from feedline.models.multilabel import MultiLabelClassifier
    from feedline.models.nets import SmallCNN, SmallUNet
    from feedline.models.regressor import ImageRegressor
    from feedline.models.segmenter import Segmenter

__all__ = [
    "ImageClassifier",
    "SmallCNN",
    "SmallUNet",
    "Segmenter",
    "MultiLabelClassifier",
    "ImageRegressor",
    "Detector",
]
__getattr__, __dir__ = _exports(__name__)

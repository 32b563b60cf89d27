"""RandomHorizontalFlip with a fast path for the one uint8 image a worker passes.

torchvision's v2 transform walks its input as a pytree and checks every leaf before it draws; for a single
plain tensor that walk costs more than the flip of a 224x224 crop. This one draws the same ``torch.rand(1)``
and flips with the same kernel, so its output equals torchvision's bit for bit; every other input (boxes,
masks, ``tv_tensors``, several inputs) goes through torchvision's path.
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F


class RandomHorizontalFlip(v2.RandomHorizontalFlip):
    """``torchvision.transforms.v2.RandomHorizontalFlip``, same argument and output, faster on one tensor."""

    def forward(self, *inputs):
        if len(inputs) == 1 and type(inputs[0]) is torch.Tensor:
            image = inputs[0]
            if torch.rand(1) >= self.p:
                return image
            return F.horizontal_flip(image)
        return super().forward(*inputs)

"""RandomResizedCrop that keeps uint8 images channels-last, where torch's resize kernel is fastest.

Decoders return (C, H, W) tensors laid out (H, W, C) in memory. torchvision's crop is a view, so the window
it hands to the resize is neither layout's contiguous form, and torch falls back to its slower planar uint8
path. Packing the window (a copy of at most the image) first gives the same pixels, bit for bit, in about 3/4
of the time (`benchmarks/throughput.py`). The image of a sample of named fields (a ``tv_tensors.Image`` beside
its masks or boxes) is packed alike. Everything else is torchvision's: parameters, the resize kernel, and every
other input type (masks, boxes).
"""

from __future__ import annotations

import math

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F


def channels_last(image: torch.Tensor) -> torch.Tensor:
    """(C, H, W) with (H, W, C) memory order; a no-op when it already is."""
    c, _, w = image.shape
    if image.stride() == (1, c * w, c):
        return image
    return image.permute(1, 2, 0).contiguous().permute(2, 0, 1)


def _is_uint8_image(inpt) -> bool:
    return type(inpt) is torch.Tensor and inpt.dim() == 3 and inpt.dtype == torch.uint8


class RandomResizedCrop(v2.RandomResizedCrop):
    """``torchvision.transforms.v2.RandomResizedCrop``, same arguments and the same output, faster on uint8."""

    def forward(self, *inputs):
        # One plain uint8 image (what the workers pass): skip the pytree walk that mixed inputs need.
        if len(inputs) == 1 and _is_uint8_image(inputs[0]):
            image = inputs[0]
            return self.transform(image, self.make_params([image]))
        return super().forward(*inputs)

    def transform(self, inpt, params):
        if isinstance(inpt, tv_tensors.Image) and _is_uint8_image(inpt.as_subclass(torch.Tensor)):
            # a sample of named fields (masks, boxes beside it): the image packed too, the rest torchvision's
            return tv_tensors.wrap(self.transform(inpt.as_subclass(torch.Tensor), params), like=inpt)
        if not _is_uint8_image(inpt):
            return super().transform(inpt, params)
        top, left, height, width = params["top"], params["left"], params["height"], params["width"]
        window = channels_last(inpt[:, top : top + height, left : left + width])
        return F.resize(window, list(self.size), interpolation=self.interpolation, antialias=self.antialias)


class CropDraws:
    """``RandomResizedCrop.make_params`` for one (H, W) image: the same generator calls on the same kinds of
    tensors, in the same order, so the same box for the same generator state (tested against torchvision's),
    in a third of the time: bounds are floats computed once, and three 1-element tensors are reused rather
    than a dozen made per sample. Then the flip's one draw, compared in float32 as torchvision compares it."""

    def __init__(self, crop: v2.RandomResizedCrop, flip_p: float | None):
        self.scale = (float(crop.scale[0]), float(crop.scale[1]))
        self.log_ratio = (float(crop._log_ratio[0]), float(crop._log_ratio[1]))
        self.ratio = (min(crop.ratio), max(crop.ratio))
        self.flip_p = None if flip_p is None else torch.tensor(flip_p, dtype=torch.float32).item()
        self._uniform, self._exp = torch.empty(1), torch.empty(1)
        self._int = torch.empty(1, dtype=torch.int64)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop window."""
        uniform, area = self._uniform, height * width
        for _ in range(10):  # torchvision's attempts: area and aspect ratio drawn, kept when the box fits
            target = area * uniform.uniform_(*self.scale).item()
            aspect = torch.exp(uniform.uniform_(*self.log_ratio), out=self._exp).item()
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = self._int.random_(0, height - h + 1).item()  # what torch.randint draws
                return top, self._int.random_(0, width - w + 1).item(), h, w
        low, high = self.ratio  # none fitted: the centre crop nearest the allowed ratios
        w, h = width, height
        if width / height < low:
            h = round(w / low)
        elif width / height > high:
            w = round(h * high)
        return (height - h) // 2, (width - w) // 2, h, w

    def flip(self) -> bool:
        return self.flip_p is not None and self._uniform.uniform_().item() < self.flip_p

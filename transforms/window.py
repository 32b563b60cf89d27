"""A stack whose first step is RandomResizedCrop, its window drawn before the image is decoded.

The crop's window depends only on the image's size and the random generator, and a JPEG's header tells the size.
So the decode stage can draw the window first (``CropFirst.draw``), decode only those pixels
(``transforms/jpeg_window.py``), and hand the stack a ``Windowed`` image: the stack then crops the box already
drawn, and its later steps (a flip, colour jitter) draw as they always do. The draws are the stack's own, in its
order, so a sample's seed gives the same crop and flip whether its image was decoded whole or in part, in any
worker and after a resume. The pixels are equal too, bit for bit (``tests/test_jpeg_window.py``).

An evaluation stack that starts ``Resize`` then ``CenterCrop`` draws nothing: its crop reads a fixed region of
the resized image, so only the pixels the resize reads for it are decoded (``kept_region``), into a buffer of
the image's size, and the stack runs on that buffer as it always did: the same pixels, bit for bit.

Only the exact crop classes take this road (torchvision's and feedline's, which draw alike; ``CropDraws`` is
tested against torchvision's draws). A subclass with draws of its own, a stack that starts with anything else,
and every sample of named fields keep the ordinary path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2.functional._geometry import _compute_resized_output_size as _resized_size

from feedline.transforms.crop import CropDraws, RandomResizedCrop

# torchvision's transform and feedline's fast subclass of it: the same draws and pixels
CROPS = (v2.RandomResizedCrop, RandomResizedCrop)
# DCT scales a window may decode at (libjpeg's 1/8, 1/4, 1/2), largest first
SCALES = (8, 4, 2)
# A window decodes at a DCT scale only where it keeps at least this many times the output's pixels on each side:
# then the crop differs from the unscaled path's by about 1 level in 255 on average, PSNR above 33 dB
# (benchmarks/crop_decode.py measures it; at 1x, 1/8-scale windows fell to 27 dB).
MARGIN = 2


class Windowed:
    """A decoded uint8 (3, H, W) image and the crop's box (top, left, height, width) in its pixels, drawn before
    the decode: the window decoded alone (the box is then the whole image), or, where the window decoder
    declined the data, the whole image decoded as before. Only the box's pixels are read."""

    __slots__ = ("image", "box")

    def __init__(self, image: torch.Tensor, box: tuple[int, int, int, int]):
        self.image, self.box = image, box


class CropFirst(v2.Compose):
    """A stack that starts with RandomResizedCrop, for the decode stage to draw its window: ``draw`` makes the
    crop's draws from the image's size, ``scale`` says how far the window may be decoded down, and the stack
    called on a ``Windowed`` image crops its box and runs the rest. Any other input goes through the stack as
    it always did."""

    def __init__(self, transforms, flip_p: float | None = None):
        super().__init__(list(transforms))
        self.crop = self.transforms[0]
        self.draws = CropDraws(self.crop, flip_p)
        size = self.crop.size
        self.out_size = (int(size[0]), int(size[-1]))

    def draw(self, height: int, width: int) -> tuple[int, int, int, int]:
        """The crop's box (top, left, height, width) for an image of this size: the crop's own draws."""
        return self.draws.box(height, width)

    def scale(self, box: tuple[int, int, int, int]) -> int:
        """The largest DCT scale (8, 4, 2) at which the window still holds ``MARGIN`` times the crop's output
        size on both sides; 1 when none does."""
        out_h, out_w = self.out_size
        for denom in SCALES:
            if box[2] // denom >= MARGIN * out_h and box[3] // denom >= MARGIN * out_w:
                return denom
        return 1

    def __call__(self, *inputs):  # called per sample: skip nn.Module's dispatch
        if len(inputs) == 1 and type(inputs[0]) is Windowed:
            return self.finish(inputs[0])
        return self.forward(*inputs)

    def finish(self, windowed: Windowed):
        """The crop of the box already drawn, then the rest of the stack."""
        top, left, height, width = windowed.box
        out = self.crop.transform(
            windowed.image, {"top": top, "left": left, "height": height, "width": width}
        )
        for transform in self.transforms[1:]:
            out = transform(out)
        return out


def crop_first(stack):
    """``CropFirst(stack)`` when the stack is a ``v2.Compose`` whose first step is RandomResizedCrop (a
    ``CropFirst`` already: itself), else ``stack`` unchanged."""
    if isinstance(stack, CropFirst):
        return stack
    if type(stack) is not v2.Compose or not stack.transforms or type(stack.transforms[0]) not in CROPS:
        return stack
    return CropFirst(stack.transforms)


def kept_region(stack) -> Callable[[int, int], tuple[int, int, int, int] | None] | None:
    """For a stack that starts ``Resize`` then ``CenterCrop`` (torchvision's, as evaluation stacks do): (height,
    width) -> the box of the image's pixels that the crop's output reads (the resize kernel's reach around it, with
    a margin), or None where it reads them all. None for any other stack: it reads the whole image."""
    steps = getattr(stack, "transforms", None)
    if type(stack) not in (v2.Compose, CropFirst) or not steps or len(steps) < 2:
        return None
    resize, center = steps[0], steps[1]
    if type(resize) is not v2.Resize or type(center) is not v2.CenterCrop:
        return None
    crop_h, crop_w = (int(s) for s in _pair(center.size))

    def region(height: int, width: int):
        out_h, out_w = _resized_size((height, width), resize.size, resize.max_size)
        if crop_h > out_h or crop_w > out_w:  # the crop pads: it reads the whole image
            return None
        top, left = round((out_h - crop_h) / 2.0), round((out_w - crop_w) / 2.0)  # torchvision's anchor
        first_row, last_row = _reach(top, top + crop_h, height / out_h, height)
        first_col, last_col = _reach(left, left + crop_w, width / out_w, width)
        return first_row, first_col, last_row - first_row, last_col - first_col

    return region


def _reach(first: int, last: int, scale: float, size: int) -> tuple[int, int]:
    """The input pixels [a, b) that output pixels [first, last) of a resize by ``scale`` (input over output) read:
    every kernel torchvision uses (nearest, bilinear, bicubic, antialiased or not) reaches at most two of its
    widths, ``max(scale, 1)``, from a pixel's centre; two pixels more are kept as margin."""
    reach = 2 * max(scale, 1.0) + 2
    a = math.floor(scale * (first + 0.5) - reach)
    b = math.ceil(scale * (last - 0.5) + reach)
    return max(a, 0), min(b, size)


def _pair(size) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    size = list(size)
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])

"""Reduced-size JPEG decoding: how far a stack lets an image shrink before its first transform sees it.

libjpeg can decode at 1/2, 1/4 or 1/8 scale in the DCT domain, skipping most of the work. That is safe when
the stack's first transform would shrink the image at least that much anyway, so no pixel it keeps is lost:
- ``Resize``: the resized side must still be reached after the reduction;
- ``RandomResizedCrop``: its smallest possible crop (``scale[0]`` of the area at the extreme ratio) must
  still cover the output size after the reduction;
- anything else (``CenterCrop``, ``Pad``, ...): no reduction.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torchvision.transforms import v2

FACTORS = (8, 4, 2)


def _pair(size) -> tuple[int, int] | int | None:
    if size is None:
        return None
    if isinstance(size, int):
        return size
    size = list(size)
    return size[0] if len(size) == 1 else (size[0], size[1])


def _first(transform):
    while isinstance(transform, v2.Compose) and transform.transforms:
        transform = transform.transforms[0]
    return transform


def minimum_size(transform) -> Callable[[int, int], tuple[float, float]] | None:
    """(height, width) -> the smallest (height, width) the image may be decoded at; None: always full size."""
    first = _first(transform)
    if isinstance(first, v2.RandomResizedCrop):
        out_h, out_w = first.size
        low, (r_low, r_high) = first.scale[0], first.ratio

        def crop_floor(height: int, width: int) -> tuple[float, float]:
            area = low * height * width
            # The smallest crop, relative to the full image, must still cover the output size.
            min_h, min_w = math.sqrt(area / r_high) - 1, math.sqrt(area * r_low) - 1
            return height * out_h / max(min_h, 1), width * out_w / max(min_w, 1)

        return crop_floor
    if isinstance(first, v2.Resize):
        size, max_size = _pair(first.size), first.max_size
        if isinstance(size, tuple):
            return lambda height, width: (size[0], size[1])
        if size is None:
            return lambda height, width: (
                max_size * height / max(height, width),
                max_size * width / max(height, width),
            )

        def shorter_side(height: int, width: int) -> tuple[float, float]:
            short = min(height, width)
            return size * height / short, size * width / short

        return shorter_side
    return None


def reduction(floor: Callable[[int, int], tuple[float, float]] | None, height: int, width: int) -> int:
    """The largest of 8, 4, 2 that keeps the decoded image at or above ``floor``; 1 when none does."""
    if floor is None:
        return 1
    need_h, need_w = floor(height, width)
    for factor in FACTORS:
        if math.floor(height / factor) >= need_h and math.floor(width / factor) >= need_w:
            return factor
    return 1

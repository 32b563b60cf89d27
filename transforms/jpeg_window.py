"""Decode only the crop: a JPEG's window, drawn from its header before a pixel is decoded.

RandomResizedCrop keeps on average about half of an image, and every loader that decodes the whole image and then
crops it pays for the rest. Here the crop's box is drawn first (``window.CropFirst.draw``, from the size in the
JPEG's header), and libjpeg-turbo decodes only that window (``_jpeg_window.c``: the rows above it are skipped,
the rows below it never decoded, and in between only the columns around it are transformed). The window comes
back alone, packed channels-last as the resize reads it fastest, with the pixels a full decode would have given
there, bit for bit; a ``Windowed`` image carries it on to the stack, whose crop is then the whole window.

Where ``data.reduced_decode`` is on and the window decoded at 1/2, 1/4 or 1/8 (libjpeg's DCT scaling) still covers
the crop's output size (``CropFirst.scale``), it is decoded at that scale: a 12-megapixel photo's window costs a
fraction of its full decode. The pixels then differ from the unscaled path
as two resize paths differ (``docs/transforms.md`` gives the measured mean and maximum difference).

The C extension is optional, as PyYAML treats libyaml: where it was not built (no compiler or no libjpeg headers
when feedline was installed), every JPEG decodes whole through torchvision, and ``say_if_off`` says so once.
Whatever the extension does not take (CMYK, bytes after the image's end, a libjpeg error) is decoded whole by
torchvision too, which judges it as it judges every other payload: a corrupt file is a ``DecodeError`` named by
the same words on either path.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from feedline.transforms.decode import claimed_size, decode
from feedline.transforms.reduce import reduction
from feedline.transforms.window import CropFirst, Windowed

try:
    from feedline.transforms import _jpeg_window as _native
except ImportError as err:  # not built: no C compiler or no libjpeg headers when feedline was installed
    _native, _WHY = None, str(err)
else:
    _WHY = ""

log = logging.getLogger(__name__)

HOW_TO_BUILD = (
    "install a C compiler and libjpeg-turbo's headers (Debian/Ubuntu: apt install build-essential libjpeg-dev; "
    "Fedora: dnf install gcc libjpeg-turbo-devel; macOS: brew install jpeg-turbo), then reinstall feedline "
    "from source (pip install --no-binary feedline --force-reinstall --no-deps feedline; in a checkout: "
    "pip install -e .)"
)
_told = False


def available() -> bool:
    """Whether the crop-window decoder was built."""
    return _native is not None


def say_if_off() -> None:
    """Once per process: the crop-window decoder is not built, what that costs, and how to build it."""
    global _told
    if _native is None and not _told:
        _told = True
        log.warning(
            "crop-window JPEG decoding is off: feedline's C extension was not built (%s). JPEGs decode whole "
            "through torchvision (the same crops, more CPU per image). To turn it on, %s",
            _WHY,
            HOW_TO_BUILD,
        )


def decode_drawn(
    payload, stack: CropFirst, reduced: bool, max_pixels: int | None, window_decode: bool = True
):
    """A JPEG's crop, drawn by ``stack`` from the size in its header, as a ``Windowed`` image: with
    ``window_decode`` (and the extension built) only the window is decoded; else, or where the extension
    declines the data, the whole image, through torchvision (PIL at a reduced scale). Either way the box is
    drawn at the image's full size and decoded at the DCT scale ``reduced`` allows for it (``CropFirst.scale``),
    so the crops are the same whether the window was decoded alone or not. Any other payload is decoded whole,
    as ``decode`` does, and the stack draws on it."""
    jpeg = _jpeg(payload, max_pixels)
    if jpeg is None:
        return decode(payload, None, max_pixels)
    array, size = jpeg
    box = stack.draw(*size)
    denom = stack.scale(box) if reduced else 1
    image = window(array, size, box, denom) if window_decode and _native is not None else None
    if image is not None:
        return Windowed(image, (0, 0, *image.shape[1:]))
    whole = decode(array, None, max_pixels, scale=denom)  # torchvision decodes it whole, and judges it
    return Windowed(
        whole, box if tuple(whole.shape[1:]) == tuple(size) else scaled(box, denom, whole.shape[1:])
    )


def window(array: np.ndarray, size: tuple[int, int], box, denom: int = 1) -> torch.Tensor | None:
    """The window ``box`` (full-size pixels) of the image at 1/``denom``, decoded alone: a (3, h, w) uint8 view
    of an (h, w, 3) buffer (channels-last, as the crop's resize reads fastest); None where the extension does
    not take this data."""
    reduced = (-(-size[0] // denom), -(-size[1] // denom))
    box = scaled(box, denom, reduced)
    out = torch.empty((box[2], box[3], 3), dtype=torch.uint8)
    return _decoded(array, out, box, denom)


def decode_region(payload, region, floor, max_pixels: int | None) -> torch.Tensor:
    """A JPEG of which only ``region(height, width)`` (``window.kept_region``: what an evaluation stack's centre
    crop reads) is decoded, into a buffer of the image's size, at the reduced size ``floor`` allows as
    ``decode`` reduces; any other payload, or a region that is the whole image, decoded whole."""
    jpeg = _jpeg(payload, max_pixels) if _native is not None else None
    if jpeg is None:
        return decode(payload, floor, max_pixels)
    array, size = jpeg
    denom = reduction(floor, *size)
    reduced = (-(-size[0] // denom), -(-size[1] // denom))
    box = region(*reduced)
    image = _decoded(array, torch.empty((*reduced, 3), dtype=torch.uint8), box, denom) if box else None
    return image if image is not None else decode(payload, floor, max_pixels)


def _decoded(array: np.ndarray, out: torch.Tensor, box, denom: int) -> torch.Tensor | None:
    """``out`` (H, W, 3), the image's size at 1/``denom`` or the window's, with the window ``box`` (in the pixels
    of the image at that scale) decoded into it, as a (3, H, W) view; None where the extension does not take
    this data."""
    try:
        done = _native.decode_into(array, out.numpy(), *box, denom)
    except _native.JpegError:
        return None
    return out.permute(2, 0, 1) if done else None


def scaled(box, denom: int, size) -> tuple[int, int, int, int]:
    """``box`` (full-size pixels) in the pixels of the image at 1/``denom`` of ``size`` (height, width): each
    edge at the nearest scaled pixel edge, at least one pixel."""
    if denom == 1:
        return tuple(box)
    top, left, h, w = box
    first_row, first_col = min(round(top / denom), size[0] - 1), min(round(left / denom), size[1] - 1)
    last_row = min(max(round((top + h) / denom), first_row + 1), size[0])
    last_col = min(max(round((left + w) / denom), first_col + 1), size[1])
    return first_row, first_col, last_row - first_row, last_col - first_col


def _jpeg(payload, max_pixels: int | None) -> tuple[np.ndarray, tuple[int, int]] | None:
    """(the bytes as a 1-D uint8 array, (height, width) from the header) of a JPEG; None for anything else. A header claiming more than ``max_pixels`` is refused here, as ``decode`` refuses it."""
    array = _encoded(payload)
    if array is None or array[:3].tobytes() != b"\xff\xd8\xff":
        return None
    size = claimed_size(array, array[:12].tobytes(), max_pixels)
    if size is None or not size[0] or not size[1]:  # a side of 0: the whole decode names the file
        return None
    return array, size


def _encoded(payload) -> np.ndarray | None:
    """Encoded bytes as a 1-D uint8 array (no copy), or None (a raw pixel array, a tensor)."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return np.frombuffer(payload, dtype=np.uint8)
    if isinstance(payload, np.ndarray) and payload.ndim == 1 and payload.dtype == np.uint8 and payload.size:
        return payload if payload.flags.c_contiguous else None
    return None

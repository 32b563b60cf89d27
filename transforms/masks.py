"""Mask payload -> uint8 (1, H, W) tensor of class indices, never expanded to RGB.

A segmentation mask's pixel value is a class index. Palette PNGs (VOC, ADE20K) keep the index in the palette
entry, so they are read through PIL, which returns the indices (torchvision's PNG decoder expands the palette
to colours). 8-bit grayscale PNGs go through torchvision's decoder (libpng), the fastest. A mask stored as colours
(RGB) is refused by name: the colours would have to be mapped to indices first.
"""

from __future__ import annotations

import io
import logging

import numpy as np
import torch
from torchvision.io import ImageReadMode

from feedline.transforms.decode import _DECODE_OP, DecodeError, claimed_size, failure

log = logging.getLogger(__name__)
_GRAY = ImageReadMode.GRAY.value
_PNG = b"\x89PNG\r\n\x1a\n"


def decode_mask(payload, max_pixels: int | None = None) -> torch.Tensor:
    """Encoded mask bytes (a palette or grayscale image), or a uint8 (H, W) / (1, H, W) array -> uint8
    (1, H, W), each pixel its class index."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        payload = np.frombuffer(payload, dtype=np.uint8)
    if not (isinstance(payload, np.ndarray) and payload.ndim == 1):
        data = torch.as_tensor(np.asarray(payload) if not isinstance(payload, torch.Tensor) else payload)
        if data.dim() == 3 and data.shape[0] == 1:
            data = data[0]
        if data.dim() != 2 or data.dtype != torch.uint8:
            raise DecodeError(
                f"a mask array must be uint8 (H, W) of class indices, got {data.dtype} of shape {tuple(data.shape)}"
            )
        return data[None]
    if payload.dtype != np.uint8:
        raise DecodeError(f"expected encoded mask bytes (uint8), got {payload.dtype}")
    if payload.size == 0:
        raise DecodeError("empty mask file")
    head = payload[:12].tobytes()
    claimed_size(payload, head, max_pixels, "mask")
    if head.startswith(_PNG) and payload.size > 25 and payload[25] == 0 and payload[24] == 8 and _DECODE_OP:
        try:  # 8-bit grayscale PNG: libpng, as the values are
            return _DECODE_OP(torch.as_tensor(payload), _GRAY, False)
        except Exception as err:  # noqa: BLE001 - the decoder's errors have many types
            raise DecodeError(failure(err, head)) from err
    return _decode_mask_pil(payload, head)


_warned_jpeg = False


def _lossy(head: bytes) -> None:
    global _warned_jpeg
    if head.startswith(b"\xff\xd8\xff") and not _warned_jpeg:
        _warned_jpeg = True
        log.warning(
            "a mask is stored as JPEG: its lossy compression changes class indices along the edges; store masks "
            "as PNG (convert.py writes them so)"
        )


def _decode_mask_pil(payload: np.ndarray, head: bytes) -> torch.Tensor:
    from PIL import Image

    _lossy(head)
    try:
        with Image.open(io.BytesIO(payload.tobytes())) as img:
            img.load()
            mode = img.mode
            if mode in ("RGB", "RGBA", "CMYK", "YCbCr", "LA", "PA"):
                raise DecodeError(
                    f"a {mode} mask: feedline reads a mask as one channel of class indices (a palette or "
                    "grayscale image); map its colours to indices first"
                )
            array = np.array(img)  # a writable copy: torch refuses to share a read-only buffer quietly
    except DecodeError:
        raise
    except Exception as err:  # noqa: BLE001
        raise DecodeError(failure(err, head)) from err
    if array.dtype != np.uint8:
        if array.dtype == bool:
            array = array.astype(np.uint8)
        elif array.size and (array.min() < 0 or array.max() > 255):
            raise DecodeError(
                f"a mask with values up to {int(array.max())}: class indices must fit in 0..255"
            )
        else:
            array = array.astype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(array))[None]

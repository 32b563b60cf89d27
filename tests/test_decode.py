"""Every input format and mode decodes to 3-channel uint8."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from feedline.transforms.decode import DecodeError, decode


def _encode(img: Image.Image, fmt: str) -> np.ndarray:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()


RGB = Image.fromarray(np.random.default_rng(0).integers(0, 256, (10, 14, 3), dtype=np.uint8))
GRAY16 = Image.fromarray(np.full((10, 14), 40000, dtype=np.uint16))

CASES = {
    "jpeg-rgb": (RGB, "JPEG"),
    "jpeg-gray": (RGB.convert("L"), "JPEG"),
    "jpeg-cmyk": (RGB.convert("CMYK"), "JPEG"),
    "png-palette": (RGB.convert("P"), "PNG"),
    "png-rgba": (RGB.convert("RGBA"), "PNG"),
    "png-gray-alpha": (RGB.convert("LA"), "PNG"),
    "png-16bit": (GRAY16, "PNG"),
    "gif": (RGB.convert("P"), "GIF"),
    "webp": (RGB, "WEBP"),
    "bmp (PIL)": (RGB, "BMP"),
    "tiff (PIL)": (RGB, "TIFF"),
    "tiff-16bit (PIL)": (GRAY16, "TIFF"),
    "ppm (PIL)": (RGB, "PPM"),
}


@pytest.mark.parametrize("case", CASES)
def test_decodes_to_three_channel_uint8(case):
    img, fmt = CASES[case]
    out = decode(_encode(img, fmt))
    assert out.dtype == torch.uint8 and out.shape == (3, 10, 14)


def test_sixteen_bit_is_scaled_not_clipped():
    for fmt in ("PNG", "TIFF"):
        out = decode(_encode(GRAY16, fmt))
        assert int(out.max()) == 40000 >> 8  # 156, not 255


def test_lossless_rgb_round_trips_exactly():
    out = decode(_encode(RGB, "PNG"))
    assert torch.equal(out.permute(1, 2, 0), torch.from_numpy(np.asarray(RGB)))


@pytest.mark.parametrize("data", [b"", b"\xff\xd8\xff\x00garbage", b"plain text, not an image"])
def test_corrupt_payloads_raise_decode_error(data):
    with pytest.raises(DecodeError):
        decode(np.frombuffer(data, dtype=np.uint8))

"""Every input format and mode decodes to 3-channel uint8."""

from __future__ import annotations

import io
import logging
import os

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


TORCHVISION_READS = [case for case in CASES if "PIL" not in case and case != "png-16bit"]


@pytest.mark.parametrize("case", TORCHVISION_READS)
def test_formats_torchvision_reads_decode_as_its_public_function(case):
    from torchvision.io import ImageReadMode, decode_image

    data = _encode(*CASES[case])
    expected = decode_image(torch.from_numpy(data), mode=ImageReadMode.RGB)
    assert torch.equal(decode(data), expected)


@pytest.mark.parametrize("form", [bytes, bytearray, memoryview, np.asarray, torch.from_numpy])
def test_every_payload_form_decodes_alike(form):
    data = _encode(RGB, "JPEG")
    assert torch.equal(decode(form(data)), decode(data))


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


def _bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header claiming ``width`` x ``height`` pixels, followed by nothing worth decoding."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


def test_a_decompression_bomb_is_refused_from_its_header():
    from feedline.transforms.decode import DecodeError, decode

    with pytest.raises(DecodeError, match=r"30000x30000 = 900,000,000 pixels.*data\.max_pixels"):
        decode(np.frombuffer(_bomb_png(30000, 30000), np.uint8))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_the_pixel_limit_reads_each_format_header(fmt):
    from feedline.transforms.decode import DecodeError, decode, image_size

    buffer = io.BytesIO()
    Image.new("RGB", (40, 30)).save(buffer, fmt)
    data = np.frombuffer(buffer.getvalue(), np.uint8)
    assert image_size(data, data[:12].tobytes()) == (30, 40)
    assert decode(data, max_pixels=1200).shape == (3, 30, 40)  # at the limit: decoded
    with pytest.raises(DecodeError, match="1,200 pixels, over the limit of 1,199"):
        decode(data, max_pixels=1199)


def test_a_bomb_in_a_tree_is_a_bad_sample(tmp_path, caplog):
    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.folder.source import FolderSource
    from tests.helpers import make_tree

    root = make_tree(tmp_path / "t", {"a": ["0.png", "1.png"], "b": ["2.png"]})
    with open(os.path.join(root, "a", "1.png"), "wb") as f:
        f.write(_bomb_png(30000, 30000))
    records = FolderSource(root, val_fraction=0, cache_dir=tmp_path / "c").split("train")
    with caplog.at_level(logging.WARNING):
        image, label = SampleDataset(records)[1]
    assert "a/1.png" in caplog.text and "pixels" in caplog.text and image.shape[1:] == (10, 12)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (lambda jpeg, png: jpeg[:300], "a corrupt or truncated JPEG file (image is incomplete or truncated)"),
        (lambda jpeg, png: png[:200], "a corrupt or truncated PNG file"),
        (lambda jpeg, png: b"plain text, not an image", "not an image: its first bytes match no format"),
    ],
)
def test_a_bad_payload_is_named_in_words_without_decoder_internals(payload, expected):
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    encoded = {}
    for fmt in ("JPEG", "PNG"):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, fmt)
        encoded[fmt] = buffer.getvalue()
    with pytest.raises(DecodeError) as caught:
        decode(np.frombuffer(bytearray(payload(encoded["JPEG"], encoded["PNG"])), dtype=np.uint8))
    message = str(caught.value)
    assert message.startswith(expected)
    assert ".cpp" not in message and " at 0x" not in message and "BytesIO" not in message

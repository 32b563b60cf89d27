"""Payload -> uint8 CHW RGB tensor.

torchvision.io (libjpeg-turbo, libpng, libwebp, giflib) decodes what it can read, chosen by the file's
magic bytes; PIL reads the rest (BMP, TIFF, PPM/PGM, ...). Every input comes out as 3-channel uint8:
grayscale and palette are expanded, alpha dropped, CMYK converted, 16-bit scaled down.
"""

from __future__ import annotations

import io
import re
import struct
import warnings

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2.functional import to_dtype

from feedline.transforms.reduce import reduction

# torchvision 0.29 marks its decoders deprecated in favour of TorchCodec and warns on every call; they
# remain the fastest image decoders installed with torchvision, so feedline keeps them quiet.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")
# Payloads read from memory maps or ``bytes`` are read-only; the decoders only read them, so torch's notice
# that it cannot guard writes to such an array is noise (once per worker). Narrowed to this module's calls.
warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable", category=UserWarning, module=__name__
)

# torchvision.io's decoder as its registered op. The public ``decode_image`` wraps it with per-call usage
# logging, the deprecation warning and a library check, about 30 us a sample (a tenth of a 256 px JPEG's
# decode); the op gives the same tensor. Where a torchvision build lacks it, the public function is used.
try:
    _DECODE_OP = torch.ops.image.decode_image
except (AttributeError, RuntimeError):
    _DECODE_OP = None
_RGB = ImageReadMode.RGB.value

# PIL's limit (twice Image.MAX_IMAGE_PIXELS, where it raises DecompressionBombError): the convention.
MAX_PIXELS = 178_956_970

_TORCHVISION_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a")


class DecodeError(ValueError):
    """The payload is not an image this pipeline can read (corrupt, truncated or unknown format)."""


def claimed_size(array: np.ndarray, head: bytes, max_pixels: int | None, what: str = "image"):
    """(height, width) from the header (None where it cannot tell), refused when it claims more than
    ``max_pixels`` pixels (None: MAX_PIXELS; 0: no limit) before a byte is decoded: a decompression bomb."""
    size = image_size(array, head)
    limit = MAX_PIXELS if max_pixels is None else int(max_pixels)
    if size is not None and limit and size[0] * size[1] > limit:
        raise DecodeError(
            f"the {what} claims {size[1]}x{size[0]} = {size[0] * size[1]:,} pixels, over the limit of "
            f"{limit:,} (data.max_pixels): a decompression bomb, or raise data.max_pixels"
        )
    return size


def _torchvision_reads(head: bytes) -> bool:
    return head.startswith(_TORCHVISION_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")


def decode(
    payload, floor=None, max_pixels: int | None = None, exif: bool = False, scale: int | None = None
) -> torch.Tensor:
    """Payload -> uint8 (3, H, W) tensor. Encoded bytes (numpy uint8 array, bytes or uint8 tensor) are
    decoded; a uint8 (C, H, W) array (raw HDF5 rows) is passed through, grayscale expanded to RGB.

    ``floor`` (from ``transforms.reduce.minimum_size``) lets a JPEG decode at 1/2, 1/4 or 1/8 scale when
    the image stays at or above the size the first transform needs. An image whose header says it has more
    than ``max_pixels`` pixels (None: MAX_PIXELS, PIL's limit; 0: no limit) is refused before it is decoded:
    a small file can claim a huge image (a decompression bomb). ``exif``: turn the image as its EXIF
    orientation says (a phone's photo, as viewers show it and annotators draw masks on it); off by default, as
    torchvision's ImageFolder reads it. ``scale`` (1, 2, 4 or 8) decodes a JPEG at 1/``scale`` in place of what
    ``floor`` would choose (``jpeg_window.decode_drawn``: the scale its crop's window allows)."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        payload = np.frombuffer(payload, dtype=np.uint8)
    if isinstance(payload, np.ndarray) and payload.ndim == 1 and payload.dtype == np.uint8:
        array = payload  # encoded bytes, the usual payload: checked in numpy, cheaper per call than torch
    else:
        data = torch.as_tensor(payload)
        if data.dim() == 3 and data.dtype == torch.uint8:
            channels = data.shape[0]
            if channels == 3:
                return data
            if channels in (1, 4):
                return data[:1].expand(3, -1, -1) if channels == 1 else data[:3]
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise DecodeError(
                f"expected encoded image bytes (1-D uint8) or a uint8 (C, H, W) array, "
                f"got {data.dtype} of shape {tuple(data.shape)}"
            )
        array = data.numpy()
    if array.size == 0:
        raise DecodeError("empty file")
    head = array[:12].tobytes()
    size = claimed_size(array, head, max_pixels)
    data = torch.as_tensor(array)
    try:
        jpeg = head.startswith(b"\xff\xd8\xff")
        if scale is not None:
            factor = scale if jpeg else 1
        else:
            factor = reduction(floor, *size) if floor is not None and size and jpeg else 1
        if factor > 1:
            image = _decode_pil(data, factor, exif)
        elif _torchvision_reads(head):
            image = _decode_torchvision(data, exif)
        else:
            image = _decode_pil(data, exif=exif)
    except DecodeError:
        raise
    except Exception as err:  # decoders raise RuntimeError / OSError / ValueError / ...
        raise DecodeError(failure(err, head)) from err
    if image.dtype != torch.uint8:
        image = to_dtype(image, torch.uint8, scale=True)
    return image


_FORMATS = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG", "PNG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    *((b"P%d" % n, "PPM/PGM") for n in range(1, 7)),
)
# What a decoder's message carries that says nothing to a user: its source file and line, its function,
# and the address of the in-memory file it read.
_INTERNALS = re.compile(
    r"\b\w+(\(\))?, \S+\.(?:cpp|cc|c|h):\d+, |<[^>]* at 0x[0-9a-f]+>|\s*Exception raised from.*"
)


def failure(err: Exception, head: bytes) -> str:
    """Why a payload did not decode, in words: the format its first bytes claim and the decoder's reason,
    without the decoder's internals (source paths, object addresses)."""
    kind = next((name for magic, name in _FORMATS if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "WebP"
    reason = _INTERNALS.sub("", str(err).splitlines()[0] if str(err) else "").strip(" .:,")
    if kind is None:
        return "not an image: its first bytes match no format feedline reads (JPEG, PNG, GIF, WebP, BMP, TIFF, PPM)"
    if not reason or reason.startswith("cannot identify image file"):
        return f"a corrupt {kind} file"
    return f"a corrupt or truncated {kind} file ({reason[0].lower()}{reason[1:]})"


def _decode_torchvision(data: torch.Tensor, exif: bool = False) -> torch.Tensor:
    """JPEG, PNG, GIF or WebP bytes -> uint8 (3, H, W), through torchvision.io (libjpeg-turbo, ...)."""
    if _DECODE_OP is None:
        return decode_image(data, mode=ImageReadMode.RGB, apply_exif_orientation=exif)
    return _DECODE_OP(data, _RGB, exif)


def image_size(data: np.ndarray, head: bytes) -> tuple[int, int] | None:
    """(height, width) from the header of a JPEG, PNG, GIF or WebP, without decoding; None for other formats
    (PIL reads those, and applies its own pixel limit) or a header too short to tell."""
    try:
        if head.startswith(b"\xff\xd8\xff"):
            return jpeg_size(data)
        buf = memoryview(data)
        if head.startswith(b"\x89PNG\r\n\x1a\n") and len(buf) >= 24 and bytes(buf[12:16]) == b"IHDR":
            width, height = struct.unpack(">II", buf[16:24])
            return height, width
        if head[:6] in (b"GIF87a", b"GIF89a") and len(buf) >= 10:
            width, height = struct.unpack("<HH", buf[6:10])
            return height, width
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(buf) >= 30:
            chunk = bytes(buf[12:16])
            if chunk == b"VP8X":
                return 1 + int.from_bytes(buf[27:30], "little"), 1 + int.from_bytes(buf[24:27], "little")
            if chunk == b"VP8 ":
                width, height = struct.unpack("<HH", buf[26:30])
                return height & 0x3FFF, width & 0x3FFF
            if chunk == b"VP8L":
                bits = int.from_bytes(buf[21:25], "little")
                return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    except (IndexError, struct.error):
        return None
    return None


# Start-of-frame markers: every SOFn except DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_size(data: np.ndarray) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, without decoding; None when there is none."""
    buf = memoryview(data)  # Python ints per byte, no numpy scalars: this runs for every sample
    pos, end = 2, len(buf) - 9
    while pos < end:
        if buf[pos] != 0xFF:
            return None
        marker = buf[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _SOF:
            return buf[pos + 5] << 8 | buf[pos + 6], buf[pos + 7] << 8 | buf[pos + 8]
        pos += 2 + (buf[pos + 2] << 8 | buf[pos + 3])
    return None


def _decode_pil(data: torch.Tensor, factor: int = 1, exif: bool = False) -> torch.Tensor:
    """PIL's decoders; ``factor`` > 1 asks libjpeg for a DCT-scaled decode (``Image.draft``)."""
    from PIL import Image

    with Image.open(io.BytesIO(data.numpy().tobytes())) as img:
        if factor > 1:
            img.draft("RGB", (img.width // factor, img.height // factor))
        img.load()
        if exif:
            from PIL import ImageOps

            img = ImageOps.exif_transpose(img)
        if img.mode.startswith("I;16") or img.mode == "I":
            array = (np.asarray(img, dtype=np.uint32) >> 8).clip(0, 255).astype(np.uint8)
            array = np.repeat(array[:, :, None], 3, axis=2)
        else:
            array = np.array(img.convert("RGB"))
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)  # channels-last, as torchvision's

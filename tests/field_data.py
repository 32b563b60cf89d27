"""A source of named fields whose pixels encode each sample's identity and its mask, for alignment tests.

Sample ``row``'s image has red = the row everywhere, and a grid of 8 px blocks whose green and blue say the
block's column and row (20 per step); its mask's pixel is ``(bx + 2 * by) % 4``, a function of the block. So
after any crop, resize and flip, every pixel whose colour is a pure block colour tells which mask value must
lie under it, and its red which sample it is.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from feedline.datasets import Field, Fields, Source
from feedline.datasets.records import Records

BLOCK, STEP = 8, 20
FIELDS = Fields(
    [
        Field("image", "image"),
        Field("mask", "mask", classes=("a", "b", "c", "d")),
        Field("id", "number"),
        Field("caption", "text"),
        Field("tags", "classes", classes=("x", "y", "z")),
        Field("meta", "json"),
        Field("emb", "vector"),
    ],
    target="mask",
)


def png(array: np.ndarray, mode: str) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(array, mode).save(buffer, "PNG")
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()


def pixels(row: int) -> tuple[np.ndarray, np.ndarray]:
    """(image (H, W, 3), mask (H, W)) of sample ``row``: sizes vary with the row."""
    h, w = 40 + 8 * (row % 3), 48 + 8 * (row % 2)
    by, bx = np.mgrid[0:h, 0:w] // BLOCK
    image = np.stack([np.full((h, w), row), bx * STEP, by * STEP], axis=-1).astype(np.uint8)
    return image, ((bx + 2 * by) % 4).astype(np.uint8)


class PixelRecords(Records):
    def __init__(self, rows, bad=()):
        super().__init__()
        self.rows, self.bad = list(rows), set(bad)

    @property
    def total(self) -> int:
        return len(self.rows)

    def read(self, row: int) -> dict:
        n = self.rows[row]
        image, mask = pixels(n)
        if n in self.bad:
            mask = mask[:-8]  # a mask of another size than its image: bad input
        return {
            "image": png(image, "RGB"),
            "mask": png(mask, "L"),
            "id": float(n),
            "caption": f"sample {n}",
            "tags": np.array([n % 3]),
            "meta": f'{{"n": {n}}}',
            "emb": np.array([n, -n, 0.5], dtype=np.float64),
        }

    def where(self, row: int) -> str:
        return f"pixels row {self.rows[row]}"


class PixelSource(Source):
    """``n`` train samples (rows 0..n-1) and 4 val samples (rows 100..103); ``bad``: rows whose mask is cut."""

    fields = FIELDS
    classes = list(FIELDS.classes)

    def __init__(self, n: int = 12, bad=()):
        self.n, self.bad = n, tuple(bad)

    def prepare(self) -> None:
        pass

    def split(self, name: str) -> PixelRecords:
        rows = range(self.n) if name == "train" else range(100, 104)
        return PixelRecords(rows, self.bad)


def misaligned(image, mask, valid=None) -> tuple[int, int]:
    """(pure-colour pixels, those whose mask value is not their block's) of one uint8 (3, H, W) image and
    its (H, W) mask; ``valid``: where the image has data (a padded batch)."""
    g, b = image[1].long(), image[2].long()
    pure = (g % STEP == 0) & (b % STEP == 0)
    if valid is not None:
        pure &= valid
    expected = (g // STEP + 2 * (b // STEP)) % 4
    return int(pure.sum()), int((pure & (mask.long() != expected)).sum())

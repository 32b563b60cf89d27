"""A source of detection samples whose boxes are drawn into the pixels, for alignment tests.

Sample ``row``'s image is ``(row, 0, 0)`` everywhere but in its boxes: box ``k`` (label ``k % 3``) is a filled
rectangle of ``(row, 60 + 60 * label, 200)``, and no two boxes touch. So after any crop, resize and flip,
every box that remains must still frame a rectangle of its label's colour, and red names the sample.
Every fifth row has no box at all.
"""

from __future__ import annotations

import numpy as np
import torch

from feedline.datasets import Field, Fields, Source
from feedline.datasets.records import Records
from tests.field_data import png

CLASSES = ("circle", "square", "triangle")
FIELDS = Fields(
    [Field("image", "image"), Field("objects", "boxes", classes=CLASSES, format="XYWH")], "objects"
)
SIZE = 64


def drawn(row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image (H, W, 3), boxes (M, 4) XYWH, labels (M,)) of sample ``row``."""
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    image[..., 0] = row
    boxes, labels = [], []
    if row % 5:
        for k in range(1 + row % 3):  # 1-3 boxes in a column of cells, each 18 px apart
            x, y = 4 + 20 * k, 6 + (row * 7 + 11 * k) % 30
            w, h = 14 + (row + k) % 4, 12 + (row * k) % 14
            label = (row + k) % 3
            image[y : y + h, x : x + w] = (row, 60 + 60 * label, 200)
            boxes.append((x, y, w, h))
            labels.append(label)
    return image, np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int64)


class BoxRecords(Records):
    def __init__(self, rows):
        super().__init__()
        self.rows = list(rows)

    @property
    def total(self) -> int:
        return len(self.rows)

    def read(self, row: int) -> dict:
        n = self.rows[row]
        image, boxes, labels = drawn(n)
        objects = {"boxes": boxes, "labels": labels, "image_id": n, "iscrowd": np.zeros(len(boxes), np.uint8)}
        return {"image": png(image, "RGB"), "objects": objects}

    def where(self, row: int) -> str:
        return f"boxes row {self.rows[row]}"


class BoxSource(Source):
    """``n`` train samples (rows 0..n-1) and 5 val samples (rows 100..104)."""

    fields = FIELDS
    classes = list(CLASSES)

    def __init__(self, n: int = 12):
        self.n = n

    def prepare(self) -> None:
        pass

    def split(self, name: str) -> BoxRecords:
        return BoxRecords(range(self.n) if name == "train" else range(100, 105))


def unframed(image: torch.Tensor, target: dict) -> list[str]:
    """What is wrong with ``target``'s boxes on ``image`` (uint8 (3, H, W)): a box whose inside is not of its
    label's colour, or whose colour spills 2 px beyond it. Empty when every box frames its rectangle."""
    wrong = []
    height, width = image.shape[-2:]
    for (x1, y1, x2, y2), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
        colour = 60 + 60 * label
        if x2 - x1 < 3 or y2 - y1 < 3:  # too thin to hold an inside (SanitizeBoxes drops those under 1 px)
            continue
        inner = image[1, round(y1) + 1 : round(y2) - 1, round(x1) + 1 : round(x2) - 1].long()
        if (abs(inner - colour) > 12).float().mean() > 0.1:
            wrong.append(f"box {(x1, y1, x2, y2)} label {label}: inside is not its colour")
        for x, y in (
            ((x1 + x2) / 2, y1 - 3),
            ((x1 + x2) / 2, y2 + 2),
            (x1 - 3, (y1 + y2) / 2),
            (x2 + 2, (y1 + y2) / 2),
        ):
            xi, yi = int(x), int(y)
            if (
                0 <= xi < width
                and 0 <= yi < height
                and abs(int(image[1, yi, xi]) - colour) <= 12
                and image[2, yi, xi] > 150
            ):
                wrong.append(
                    f"box {(x1, y1, x2, y2)} label {label}: its colour spills beyond it at {(xi, yi)}"
                )
    return wrong

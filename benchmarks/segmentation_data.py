"""``segmentation.py``'s data, made once under ``--data-dir``: the JPEG photos of ``throughput.py``, a palette
PNG mask of each one's size, a CSV table of the pairs, and the same pairs as LitData chunks of dict samples."""

from __future__ import annotations

import csv
import io
import os

import numpy as np
from peer_data import optimize_once
from peer_work import samples

CLASSES = ["background", "ellipse", "rectangle", "triangle"]
PALETTE = [0, 0, 0, 220, 40, 40, 40, 180, 60, 40, 70, 220]  # index -> RGB, for a viewer; pixels stay indices


def draw_mask(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """A (height, width) uint8 mask of 1-4 shapes (class 1-3) on background 0; later shapes cover earlier."""
    mask = np.zeros((height, width), np.uint8)
    yy, xx = np.ogrid[0:height, 0:width]
    for _ in range(int(rng.integers(1, 5))):
        kind = int(rng.integers(1, len(CLASSES)))
        h, w = (int(v) for v in rng.integers(height // 8, height // 2, 2))
        top, left = int(rng.integers(0, height - h)), int(rng.integers(0, width - w))
        y, x = (yy - top) / h, (xx - left) / w  # the shape's box is [0, 1) x [0, 1)
        inside = (y >= 0) & (y < 1) & (x >= 0) & (x < 1)
        if kind == 1:
            inside &= (2 * y - 1) ** 2 + (2 * x - 1) ** 2 <= 1
        elif kind == 3:  # apex at the top middle, base along the bottom
            inside &= np.abs(2 * x - 1) <= y
        mask[inside] = kind
    return mask


def ensure_table(data_dir: str, images: int) -> str:
    """The CSV table (columns image, mask: paths relative to ``data_dir``) of the JPEG tree's photos and their
    masks; masks and table written once."""
    from PIL import Image
    from throughput import ensure_jpeg_tree

    tree = ensure_jpeg_tree(data_dir, images)
    table = os.path.join(data_dir, f"{os.path.basename(tree)}-segmentation.csv")
    if os.path.exists(table):  # written last, renamed into place
        return table
    masks = f"{tree}-masks"
    os.makedirs(masks, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for path, _ in samples(tree):
        with Image.open(path) as photo:
            width, height = photo.size  # the header only
        mask = Image.fromarray(draw_mask(width, height, rng), mode="P")
        mask.putpalette(PALETTE)
        mask_path = os.path.join(masks, os.path.splitext(os.path.basename(path))[0] + ".png")
        mask.save(mask_path)
        rows.append([os.path.relpath(p, data_dir) for p in (path, mask_path)])
    with open(table + ".tmp", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "mask"])
        writer.writerows(rows)
    os.replace(table + ".tmp", table)
    return table


def pairs(table: str) -> list[tuple[str, str]]:
    """The table's (image, mask) absolute paths, in its order."""
    root = os.path.dirname(table)
    with open(table, newline="") as f:
        return [(os.path.join(root, r["image"]), os.path.join(root, r["mask"])) for r in csv.DictReader(f)]


def _litdata_item(pair):
    image, mask = pair
    with open(image, "rb") as f, open(mask, "rb") as g:
        return {"image": f.read(), "mask": g.read()}


def ensure_litdata(table: str) -> str:
    """The table's pairs as LitData chunks of dict samples {"image": JPEG bytes, "mask": PNG bytes}."""
    return optimize_once(_litdata_item, pairs(table), os.path.splitext(table)[0] + "-litdata")


def decode_mask(data: bytes):
    """PNG bytes -> the (1, H, W) uint8 tensor of palette indices, as PIL reads it (mode P, never RGB)."""
    from PIL import Image
    from torchvision.transforms.v2.functional import pil_to_tensor

    with Image.open(io.BytesIO(data)) as mask:
        return pil_to_tensor(mask)

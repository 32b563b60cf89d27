"""The embedded shapes data set: small RGB images of coloured shapes, a mask per image and one table.

    <root>/images/0000.png   RGB, SIZE x SIZE: 1-3 shapes (circle, square, triangle; red, green or blue)
    <root>/masks/0000.png    one channel: each pixel's class index (0 background, 1 circle, 2 square, 3 triangle)
    <root>/shapes.csv        image, mask (paths relative to <root>), shapes (the classes present, space
                             separated), coverage (the fraction of pixels inside a shape), caption
                             ("two red circles and a blue square"), largest (the class covering most pixels)
    <root>/instances.json    COCO instances: each shape's tight box (XYWH pixels), its pixel area and its mask
                             (uncompressed RLE); categories 1 circle, 2 square, 3 triangle; file_name
                             relative to <root>/images (``source=shapes_coco`` reads it through ``source=coco``)
    <root>/shapes.json       the parameters it was generated with

Shapes never overlap, so the table, the caption and the mask tell the same story. Seeded and deterministic,
numpy drawing only, no download; ``materialise`` writes it once, into a temporary directory renamed into place
(as the digits are), so a killed run or a concurrent one never leaves half a data set.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import tempfile

import numpy as np

log = logging.getLogger(__name__)

CLASSES = ["background", "circle", "square", "triangle"]
SHAPES = CLASSES[1:]
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220)}
COLUMNS = ["image", "mask", "shapes", "coverage", "caption", "largest"]
TABLE = "shapes.csv"
INSTANCES = "instances.json"
_WORDS = {1: "a", 2: "two", 3: "three"}


def _footprint(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One shape's pixels (a bool mask) on a size x size canvas, at a random size and place."""
    extent = int(rng.integers(size // 5, 2 * size // 5 + 1))
    top, left = (int(v) for v in rng.integers(0, size - extent + 1, 2))
    yy, xx = np.mgrid[0:size, 0:size]
    y, x = yy - top, xx - left
    inside = (y >= 0) & (y < extent) & (x >= 0) & (x < extent)
    if kind == "circle":
        r = extent / 2
        return inside & ((y + 0.5 - r) ** 2 + (x + 0.5 - r) ** 2 <= r * r)
    if kind == "square":
        return inside
    # an upright triangle: the apex at the top middle, the base along the bottom
    return inside & (np.abs(x + 0.5 - extent / 2) <= (y + 1) / 2)


def _caption(drawn: list[tuple[str, str]]) -> str:
    """("red", "circle") pairs -> "two red circles and a blue square" (shape order, then colour order)."""
    counts: dict[tuple[str, str], int] = {}
    for colour, kind in sorted(drawn, key=lambda d: (SHAPES.index(d[1]), list(COLOURS).index(d[0]))):
        counts[(colour, kind)] = counts.get((colour, kind), 0) + 1
    parts = [f"{_WORDS[n]} {colour} {kind}{'s' if n > 1 else ''}" for (colour, kind), n in counts.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def draw(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray, str]:
    """One sample: the (size, size, 3) uint8 image, its (size, size) uint8 mask and its caption."""
    image, mask, caption, _ = draw_shapes(rng, size)
    return image, mask, caption


def draw_shapes(
    rng: np.random.Generator, size: int
) -> tuple[np.ndarray, np.ndarray, str, list[tuple[str, np.ndarray]]]:
    """``draw``, and each shape drawn: (its kind, its (size, size) bool pixels), in drawing order."""
    background = rng.integers(90, 200) + rng.integers(-12, 13, (size, size, 1))
    image = np.repeat(background, 3, axis=2)
    mask = np.zeros((size, size), np.uint8)
    taken = np.zeros((size, size), bool)
    drawn: list[tuple[str, str]] = []
    shapes: list[tuple[str, np.ndarray]] = []
    for _ in range(int(rng.integers(1, 4))):
        kind, colour = SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]
        for _attempt in range(20):
            pixels = _footprint(kind, size, rng)
            if not (pixels & taken).any():
                break
        else:
            continue  # no free place: one shape fewer
        # a one-pixel margin keeps shapes apart, so none touches another in the mask
        grown = pixels.copy()
        grown[1:] |= pixels[:-1]
        grown[:-1] |= pixels[1:]
        grown[:, 1:] |= grown[:, :-1]
        grown[:, :-1] |= grown[:, 1:]
        taken |= grown
        mask[pixels] = SHAPES.index(kind) + 1
        image[pixels] = np.asarray(COLOURS[colour]) + rng.integers(-20, 21, 3)
        drawn.append((colour, kind))
        shapes.append((kind, pixels))
    return np.clip(image, 0, 255).astype(np.uint8), mask, _caption(drawn), shapes


def row(image_path: str, mask_path: str, mask: np.ndarray, caption: str) -> dict:
    """The table's row for one sample, every column derived from its mask (and the caption)."""
    counts = np.bincount(mask.ravel(), minlength=len(CLASSES))
    present = [CLASSES[c] for c in range(1, len(CLASSES)) if counts[c]]
    return {
        "image": image_path,
        "mask": mask_path,
        "shapes": " ".join(present),
        "coverage": repr(float(counts[1:].sum() / mask.size)),  # k / size**2: exact in a float, and in repr
        "caption": caption,
        "largest": CLASSES[1 + int(np.argmax(counts[1:]))],
    }


def _rle(pixels: np.ndarray) -> dict:
    """COCO's uncompressed RLE of a bool mask: run lengths in column-major order, starting with a 0s run."""
    flat = pixels.ravel(order="F").astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    return {"size": list(pixels.shape), "counts": np.diff(np.concatenate([[0], edges])).tolist()}


def annotations(image_id: int, shapes: list[tuple[str, np.ndarray]], first_id: int) -> list[dict]:
    """COCO annotations of one image's shapes: the tight box around each shape's pixels (XYWH: a box
    [x, y, w, h] covers pixel columns x..x+w-1 and rows y..y+h-1), its pixel count and its RLE mask."""
    out = []
    for k, (kind, pixels) in enumerate(shapes):
        rows, cols = np.flatnonzero(pixels.any(axis=1)), np.flatnonzero(pixels.any(axis=0))
        x, y = int(cols[0]), int(rows[0])
        box = [x, y, int(cols[-1]) + 1 - x, int(rows[-1]) + 1 - y]
        out.append(
            {
                "id": first_id + k,
                "image_id": image_id,
                "category_id": SHAPES.index(kind) + 1,
                "bbox": box,
                "area": int(pixels.sum()),
                "iscrowd": 0,
                "segmentation": _rle(pixels),
            }
        )
    return out


def instances(drawn: list[list[tuple[str, np.ndarray]]], size: int) -> dict:
    """The COCO instances JSON (as a dict) of the images whose shapes ``draw_shapes`` returned, in order."""
    images, annots = [], []
    for k, shapes in enumerate(drawn):
        images.append({"id": k, "file_name": f"{k:04d}.png", "width": size, "height": size})
        annots += annotations(k, shapes, first_id=len(annots) + 1)
    categories = [{"id": c + 1, "name": name, "supercategory": "shape"} for c, name in enumerate(SHAPES)]
    return {"images": images, "annotations": annots, "categories": categories}


def _write_instances(root: str, coco: dict) -> None:
    """``<root>/instances.json``, written beside it and renamed into place."""
    fd, tmp = tempfile.mkstemp(prefix=".instances-", suffix=".json", dir=root)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(coco, f, separators=(",", ":"))
        os.replace(tmp, os.path.join(root, INSTANCES))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def materialise(root: str, n: int = 600, size: int = 64, seed: int = 0) -> str:
    """Write ``n`` samples under ``root`` unless they are there already; atomic. Returns ``root``."""
    params = {"n": int(n), "size": int(size), "seed": int(seed)}
    if os.path.isdir(root):
        _check_params(root, params)
        if not os.path.isfile(os.path.join(root, INSTANCES)):  # written before the shapes had boxes:
            rng = np.random.default_rng(seed)  # the same seed draws the same shapes again
            _write_instances(root, instances([draw_shapes(rng, size)[3] for _ in range(n)], size))
        return root
    from PIL import Image

    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".shapes-tmp-", dir=parent)
    try:
        os.mkdir(os.path.join(tmp, "images"))
        os.mkdir(os.path.join(tmp, "masks"))
        rng = np.random.default_rng(seed)
        rows, drawn = [], []
        for k in range(n):
            image, mask, caption, shapes = draw_shapes(rng, size)
            drawn.append(shapes)
            image_path, mask_path = f"images/{k:04d}.png", f"masks/{k:04d}.png"
            Image.fromarray(image, mode="RGB").save(os.path.join(tmp, image_path))
            Image.fromarray(mask, mode="L").save(os.path.join(tmp, mask_path))
            rows.append(row(image_path, mask_path, mask, caption))
        with open(os.path.join(tmp, TABLE), "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        _write_instances(tmp, instances(drawn, size))
        with open(os.path.join(tmp, "shapes.json"), "w", encoding="utf-8") as f:
            json.dump(params, f)
        try:
            os.rename(tmp, root)
            log.info("wrote %d images of shapes with their masks, %s and %s: %s", n, TABLE, INSTANCES, root)
        except OSError:
            if not os.path.isdir(root):  # another process published it first: keep theirs
                raise
            _check_params(root, params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _check_params(root: str, params: dict) -> None:
    try:
        with open(os.path.join(root, "shapes.json"), encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError) as err:
        raise RuntimeError(
            f"{root} exists but is not a shapes data set written by feedline ({err}); remove it, or set "
            "source.root to another directory"
        ) from err
    if found != params:
        raise RuntimeError(
            f"{root} holds shapes generated with {found}, not {params}: set source.root to another directory "
            "for these parameters, or remove it to write it again"
        )

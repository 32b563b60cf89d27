"""``detection.py``'s data, made once under ``--data-dir``: the JPEG photos of ``throughput.py`` as one COCO image
folder with an instances JSON (1-8 boxes per image over 5 categories with sparse ids, some images without
boxes), a second JSON of the same images holding ``--annotations`` boxes in all (the worker-memory rows), and
the same samples as shards written by ``convert.py`` (LitData's chunk format, dict samples)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

CATEGORIES = [(1, "person"), (3, "car"), (18, "dog"), (44, "bottle"), (62, "chair")]  # COCO's sparse ids


def _tree_images(data_dir: str, images: int) -> tuple[str, list[str]]:
    """One flat folder of the JPEG tree's photos (hard links, else copies) and their names, in order."""
    from peer_work import samples
    from throughput import ensure_jpeg_tree

    tree = ensure_jpeg_tree(data_dir, images)
    folder = f"{tree}-coco"
    names = [f"{k:07d}.jpg" for k in range(images)]
    if not os.path.exists(os.path.join(folder, ".done")):
        os.makedirs(folder, exist_ok=True)
        for (path, _), name in zip(samples(tree), names):
            target = os.path.join(folder, name)
            if not os.path.exists(target):
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copyfile(path, target)
        open(os.path.join(folder, ".done"), "w").close()
    return folder, names


def instances(folder: str, names: list[str], per_image: tuple[int, int], seed: int) -> dict:
    """A COCO instances dict for ``names`` in ``folder``: ``per_image`` (low, high) boxes each, every tenth
    image without any, XYWH boxes inside their image, an area and iscrowd 0."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for k, name in enumerate(names):
        with Image.open(os.path.join(folder, name)) as photo:
            width, height = photo.size  # the header only
        images.append({"id": k + 1, "file_name": name, "width": width, "height": height})
        count = 0 if k % 10 == 9 else int(rng.integers(per_image[0], per_image[1] + 1))
        for _ in range(count):
            w, h = float(rng.uniform(16, width / 2)), float(rng.uniform(16, height / 2))
            x, y = float(rng.uniform(0, width - w)), float(rng.uniform(0, height - h))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": k + 1,
                    "category_id": CATEGORIES[int(rng.integers(len(CATEGORIES)))][0],
                    "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
                    "area": round(w * h, 2),
                    "iscrowd": 0,
                }
            )
    categories = [{"id": i, "name": n, "supercategory": "thing"} for i, n in CATEGORIES]
    return {"images": images, "annotations": annotations, "categories": categories}


def _write_json(path: str, content: dict) -> str:
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            json.dump(content, f)
        os.replace(path + ".tmp", path)
    return path


def ensure_coco(data_dir: str, images: int, annotations: int) -> dict:
    """{"images": folder, "json": the instances JSON (1-8 boxes per image), "large": one of ``annotations``
    boxes over the same images}."""
    folder, names = _tree_images(data_dir, images)
    small = _write_json(os.path.join(data_dir, f"coco-{images}.json"), instances(folder, names, (1, 8), 0))
    per = max(
        1, -(-annotations // (images - images // 10))
    )  # nine images in ten hold boxes: at least that many
    large_path = os.path.join(data_dir, f"coco-{images}-{annotations}.json")
    large = _write_json(large_path, instances(folder, names, (per, per), 1)) if annotations else None
    return {"images": folder, "json": small, "large": large}


def ensure_shards(data_dir: str, coco: dict) -> str:
    """The COCO samples as shards, written once by ``convert.py`` (LitData's chunks: dict samples of the JPEG's
    bytes and the boxes as numpy arrays)."""
    import subprocess
    import sys

    out = os.path.join(data_dir, f"{os.path.basename(coco['images'])}-shards")
    if os.path.exists(out):
        return out
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [
        sys.executable,
        os.path.join(root, "convert.py"),
        "source=coco",
        f"source.annotations={coco['json']}",
        f"source.images={coco['images']}",
        "source.val_fraction=0",
        "out.format=shards",
        f"out.path={out}",
        f"hydra.run.dir={os.path.join(data_dir, 'convert-logs')}",
    ]
    subprocess.run(command, check=True)
    return out

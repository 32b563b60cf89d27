"""``crop_decode.py``'s held-out large photos, made once under ``--data-dir``: camera-sized JPEGs (4000x3000 or
3000x4000, quality 90, 4:2:0) of realistic content, cut from the two photos scikit-learn ships. Each is a random
crop of one of them, perhaps mirrored, with its own colour shift, upscaled, with mild sensor-like noise, so no two
files are alike."""

from __future__ import annotations

import os

import numpy as np

QUALITY = 90
NOISE = 3.0  # the noise's standard deviation, in levels of 255


def ensure_large(data_dir: str, count: int, side: int) -> str:
    """A class-folder tree (``c0``, ``c1``: which photo it came from) of ``count`` JPEGs whose long side is
    ``side`` and short side 3/4 of it, landscape or portrait; written once, named by its parameters."""
    root = os.path.join(data_dir, f"large-{count}x{side}-q{QUALITY}")
    if os.path.exists(root + ".complete"):
        return root
    from PIL import Image
    from sklearn.datasets import load_sample_images
    from tqdm import tqdm

    photos = load_sample_images().images  # two 427x640 RGB arrays
    for c in range(len(photos)):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
    for i in tqdm(range(count), desc="writing large photos", unit="img"):
        rng = np.random.default_rng([7, i])
        pixels = photo(photos[i % len(photos)], side, rng)
        path = os.path.join(root, f"c{i % len(photos)}", f"photo_{i:05d}.jpg")
        Image.fromarray(pixels).save(path, quality=QUALITY, subsampling=2)  # 2: 4:2:0
    open(root + ".complete", "w").close()
    return root


def photo(source: np.ndarray, side: int, rng: np.random.Generator) -> np.ndarray:
    """One large (H, W, 3) uint8 photo from ``source``: a random 4:3 or 3:4 crop, mirrored half the time,
    colour-shifted, upscaled to ``side`` on its long side, with Gaussian noise."""
    from PIL import Image

    landscape = rng.random() < 0.5
    height = int(rng.integers(300, source.shape[0] + 1))
    width = height * 4 // 3 if landscape else height * 3 // 4
    top = int(rng.integers(0, source.shape[0] - height + 1))
    left = int(rng.integers(0, source.shape[1] - width + 1))
    crop = source[top : top + height, left : left + width].astype(np.float32)
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    crop = crop * rng.uniform(0.85, 1.15, 3).astype(np.float32) + rng.uniform(-12, 12, 3).astype(np.float32)
    size = (side, side * 3 // 4) if landscape else (side * 3 // 4, side)  # PIL: (width, height)
    big = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize(size, Image.BICUBIC)
    noisy = (
        np.asarray(big, dtype=np.float32)
        + rng.standard_normal((size[1], size[0], 3), dtype=np.float32) * NOISE
    )
    return np.clip(noisy, 0, 255).astype(np.uint8)

"""The work every loader of ``peers.py`` does, shared by the loaders of this environment and of the overlays.
Only the standard library at module level: torch and torchvision are imported where the work runs."""

from __future__ import annotations

import os


def crop_and_flip():
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])


def decode_jpeg(data: bytes):
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


def samples(tree: str) -> list[tuple[str, int]]:
    classes = sorted(os.listdir(tree))
    return [
        (os.path.join(tree, c, f), k)
        for k, c in enumerate(classes)
        for f in sorted(os.listdir(os.path.join(tree, c)))
    ]

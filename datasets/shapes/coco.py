"""``source=shapes_coco``: the embedded shapes (``generate.py``) as a detection set, read by ``source=coco``.

The shapes are written once into the cache (the very files ``source=shapes`` reads), with
``<root>/instances.json``: each shape's tight box, area and mask, categories circle, square and triangle. This
source is ``CocoSource`` over that file and ``<root>/images``, so ``experiment=shapes_detection`` takes the path
a user's own COCO file takes: the fields ``image`` and ``objects`` (the target, kind boxes).
"""

from __future__ import annotations

import os

from feedline.datasets.coco.source import CocoSource
from feedline.datasets.options import ShapesCocoOptions as _O  # the defaults, written once
from feedline.datasets.shapes.generate import INSTANCES, materialise


class ShapesCocoSource(CocoSource):
    """``CocoSource`` over ``<root>/instances.json``, written first with the shapes if it is not there yet
    (``n`` images of ``size`` pixels; val a seeded ``val_fraction`` of them)."""

    def __init__(
        self,
        root: str,
        n: int = _O.n,
        size: int = _O.size,
        val_fraction: float = _O.val_fraction,
        test_fraction: float = _O.test_fraction,
        seed: int = _O.seed,
        masks: bool = _O.masks,
        cache_dir: str | None = _O.cache_dir,
    ):
        self.shapes_root = materialise(os.path.expanduser(root), n=n, size=size)
        super().__init__(
            annotations=os.path.join(self.shapes_root, INSTANCES),
            images=os.path.join(self.shapes_root, "images"),
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            seed=seed,
            masks=masks,
            cache_dir=cache_dir,
        )

    def __repr__(self) -> str:
        return f"ShapesCocoSource(root={self.shapes_root!r})"

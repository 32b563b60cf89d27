"""``source=shapes``: the generated shapes (``generate.py``) read as the ``manifest`` source reads any table.

The data is written once into the cache and then indexed like a user's table, so the shapes runs take the very
path a user's own manifest takes. Its fields, one per column of ``shapes.csv``:

    image     the RGB picture                   caption   "two red circles and a blue square" (text)
    mask      each pixel's class (mask)         shapes    the classes present (classes: multi-label)
    largest   the class covering most (class)   coverage  the fraction of pixels inside a shape (number)

``source.target`` picks what ``y`` is: ``mask`` (segmentation), ``shapes`` (multi-label), ``coverage``
(regression), ``largest`` (classification) or ``caption`` (image-text).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from feedline.datasets.manifest.source import ManifestSource
from feedline.datasets.options import ShapesOptions as _O  # the defaults, written once
from feedline.datasets.shapes.generate import CLASSES, SHAPES, TABLE, materialise

FIELDS = {
    "image": {"kind": "image"},
    "mask": {"kind": "mask", "classes": list(CLASSES)},
    "shapes": {"kind": "classes", "classes": list(SHAPES)},
    "coverage": {"kind": "number"},
    "caption": {"kind": "text"},
    "largest": {"kind": "class", "classes": list(SHAPES)},
}


class ShapesSource(ManifestSource):
    """``ManifestSource`` over ``<root>/shapes.csv``, which is written first if it is not there yet (``n``
    images of ``size`` pixels; a few seconds, once)."""

    def __init__(
        self,
        root: str,
        fields: Mapping | None = None,
        target: str = _O.target,
        n: int = _O.n,
        size: int = _O.size,
        val_fraction: float = _O.val_fraction,
        test_fraction: float = _O.test_fraction,
        seed: int = _O.seed,
        cache_dir: str | None = _O.cache_dir,
    ):
        self.shapes_root = materialise(os.path.expanduser(root), n=n, size=size)
        super().__init__(
            path=os.path.join(self.shapes_root, TABLE),
            root=self.shapes_root,
            fields=fields or FIELDS,
            target=target,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            seed=seed,
            cache_dir=cache_dir,
        )

    def __repr__(self) -> str:
        return f"ShapesSource(root={self.shapes_root!r})"

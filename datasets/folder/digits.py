"""The embedded default: scikit-learn's 1,797 handwritten digits, as a real class-folder tree.

``prepare()`` writes them once as PNG files (``root/<digit>/<n>.png``) and then indexes the tree with
the ordinary ``folder`` source, so the default run exercises exactly the path a user's data takes.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import numpy as np

from feedline.datasets.folder.source import FolderSource

log = logging.getLogger(__name__)

CLASSES = [str(d) for d in range(10)]


def materialise(root: str) -> str:
    """Write the digits under ``root`` unless a complete copy is already there; atomic."""
    if os.path.isdir(root):
        return root
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 8x8, values 0..16
    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".digits-tmp-", dir=parent)
    try:
        for name in CLASSES:
            os.mkdir(os.path.join(tmp, name))
        for n, (image, target) in enumerate(zip(images, digits.target)):
            Image.fromarray(image, mode="L").save(os.path.join(tmp, str(target), f"{n:04d}.png"))
        try:
            os.rename(tmp, root)
            log.info("wrote scikit-learn's %d digits as a class-folder tree: %s", len(images), root)
        except OSError:
            if not os.path.isdir(root):  # another process published it first: keep theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


class DigitsSource(FolderSource):
    """``FolderSource`` over the materialised digits tree; the tree appears in ``prepare()``."""

    def _check_roots(self) -> None:  # the tree does not exist until prepare()
        pass

    @property
    def classes(self) -> list[str]:
        return list(CLASSES)

    def prepare(self) -> None:
        materialise(self.root)
        super().prepare()

    def split(self, name: str):
        materialise(self.root)  # a no-op after prepare(); lets split() work on its own
        return super().split(name)

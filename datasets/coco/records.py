"""One split of a COCO file: its index's mapped arrays, the image folder and the file's name; never a dict per
annotation.

``records[i] -> {"image": the file's bytes, "objects": {"boxes", "labels", "iscrowd", "area", "image_id"}}``
(and ``"masks"`` (M, H, W) uint8 with ``source.masks=true``), as the ``boxes`` kind reads (``fields.py``). It
pickles as paths and numbers (each ``LazyArray`` as its file's path), so a spawned DataLoader worker gets a few
hundred bytes whatever the file's size, and forked ones share the mapped pages.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np

from feedline.datasets.manifest.columns import unpack
from feedline.datasets.records import BadInput, Records, read_bytes

BOX_FORMAT = "XYXY"  # the records' boxes: COCO's [x, y, width, height] converted when indexed


class CocoRecords(Records):
    """``records[i] -> {"image": bytes, "objects": {...}}``, images in id order (a subset: a seeded split)."""

    def __init__(self, index: dict, root: str, subset=None):
        super().__init__(subset)
        self.arrays = dict(index["arrays"])
        self.root = root
        self.annotations = index["meta"]["file"]
        self.rows = int(index["meta"]["images"])
        self.masks = "segmentation.text" in self.arrays
        self._content = index["meta"]["digest"]

    @property
    def total(self) -> int:
        return self.rows

    def _array(self, name: str) -> np.ndarray:
        return self.arrays[name].array

    def path(self, row: int) -> str:
        return os.path.join(self.root, unpack(self._array("paths.text"), self._array("paths.offsets"), row))

    def image_id(self, row: int) -> int:
        return int(self._array("image_id")[row])

    def read(self, row: int) -> dict:
        offsets = self._array("box_offsets")
        start, end = int(offsets[row]), int(offsets[row + 1])
        objects = {
            "boxes": np.array(self._array("boxes")[start:end], dtype=np.float32).reshape(-1, 4),
            "labels": np.array(self._array("labels")[start:end], dtype=np.int64),
            "iscrowd": np.array(self._array("iscrowd")[start:end], dtype=np.uint8),
            "area": np.array(self._array("area")[start:end], dtype=np.float32),
            "image_id": self.image_id(row),
        }
        if self.masks:
            height, width = int(self._array("height")[row]), int(self._array("width")[row])
            objects["masks"] = self._masks(row, start, end, height, width)
        return {"image": read_bytes(self.path(row)), "objects": objects}

    def _masks(self, row: int, start: int, end: int, height: int, width: int) -> np.ndarray:
        """The instance masks of annotations ``start:end``, (M, H, W) uint8, through pycocotools."""
        from pycocotools import mask as mask_utils  # only where masks are asked for

        blob, offsets = self._array("segmentation.text"), self._array("segmentation.offsets")
        if end == start:
            return np.zeros((0, height, width), dtype=np.uint8)
        rles = []
        for k in range(start, end):
            seg = json.loads(unpack(blob, offsets, k))
            try:
                if isinstance(seg, list):  # polygons: one mask, their union
                    rles.append(mask_utils.merge(mask_utils.frPyObjects(seg, height, width)))
                elif isinstance(seg["counts"], list):  # uncompressed RLE
                    rles.append(mask_utils.frPyObjects(seg, height, width))
                else:  # compressed RLE
                    rles.append({"size": seg["size"], "counts": seg["counts"].encode("ascii")})
            except (ValueError, TypeError, UnicodeEncodeError, IndexError) as err:
                aid = int(self._array("annotation_id")[k])
                raise BadInput(
                    f"{self.where(row)}: annotation id {aid}'s segmentation does not decode ({err}): fix it, or set "
                    "source.masks=false"
                ) from None
        with warnings.catch_warnings():  # pycocotools' own use of numpy 2's __array__, harmless
            warnings.simplefilter("ignore", DeprecationWarning)
            masks = mask_utils.decode(rles)  # (H, W, M), Fortran order
        return np.ascontiguousarray(masks.transpose(2, 0, 1), dtype=np.uint8)

    def where(self, row: int) -> str:
        return f"{self.annotations} image id {self.image_id(row)} ({self.path(row)})"

    def content_digest(self) -> str:
        """The annotation file's content, as 16 hex digits: a strict resume refuses a file that changed."""
        return self._content

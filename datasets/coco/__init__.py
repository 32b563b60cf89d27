"""The ``coco`` source: a COCO instances JSON and its image folder, read as ``image`` and ``objects`` (boxes)."""

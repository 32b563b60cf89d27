"""What is wrong with a COCO annotation file, gathered by kind and said together: the first few of each kind,
the count, and what to do. Reading the file: a JSON error names its line and column."""

from __future__ import annotations

import json

SHOWN = 5  # problems named per kind; the rest counted
SLACK = 1.0  # pixels a box may pass its image's edge (rounding in exporters): clipped, not refused

# kind of problem -> (what it is, in the plural, what to do)
FIXES = {
    "json": ("entries that are not what COCO holds", "fix the entry (see cocodataset.org/#format-data)"),
    "key": ("missing keys", "add the key to the entry, or drop the entry"),
    "duplicate": ("ids given twice", "give each image, category and annotation its own id"),
    "file": (
        "images with no file",
        "put the file under source.images, fix the image's file_name, or point source.images at the folder",
    ),
    "image": (
        'annotations naming an image id not in "images"',
        'fix the annotation\'s image_id, or add the image to "images"',
    ),
    "category": (
        "unknown category ids",
        'fix the annotation\'s category_id, or add the category to "categories"',
    ),
    "negative": ("boxes of negative width or height", "a bbox is [x, y, width, height]: fix it, or drop it"),
    "outside": (
        "boxes outside their image",
        f"fix the bbox (up to {SLACK:g} px past an edge is clipped), the image's width/height, or drop it",
    ),
    "segmentation": (
        "segmentations that do not read",
        "give polygons [[x1, y1, x2, y2, x3, y3, ...], ...] or an RLE {size: [h, w], counts: ...}, or set "
        "source.masks=false",
    ),
}


class CocoError(ValueError):
    """An annotation file that cannot be trained on as it is (every problem found, by kind)."""

    names_its_input = (
        True  # its message names the file, the ids and the fix: the command line prints it alone
    )


class Problems:
    """The problems of one file, by kind: the first ``SHOWN`` of each kept in words, all counted."""

    def __init__(self, path: str):
        self.path, self.found = path, {}

    def add(self, kind: str, where: str, detail: str) -> None:
        count, shown = self.found.get(kind, (0, []))
        if len(shown) < SHOWN:
            shown.append(f"{where}: {detail}")
        self.found[kind] = (count + 1, shown)

    def raise_any(self) -> None:
        if not self.found:
            return
        total = sum(count for count, _ in self.found.values())
        lines = [f"{self.path}: {total} problem(s), found before training:"]
        for kind, (count, shown) in self.found.items():
            what, fix = FIXES[kind]
            more = f" (the first {len(shown)})" if count > len(shown) else ""
            lines.append(f"  {count} {what}{more}: {fix}")
            lines += [f"    {s}" for s in shown]
        raise CocoError("\n".join(lines))


def load_json(path: str, data: bytes):
    """The parsed file, or an error naming its line and column."""
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as err:
        raise CocoError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno} (a truncated download "
            "or a hand edit? fetch or export the file again)"
        ) from None
    except UnicodeDecodeError as err:
        raise CocoError(f"{path} is not UTF-8 JSON ({err}): export it as UTF-8") from None
    if not isinstance(doc, dict):
        raise CocoError(f'{path} holds a JSON {type(doc).__name__}, not a COCO object with "images"')
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(doc.get(k), list)]
    if missing:
        raise CocoError(
            f"{path} has no list {', '.join(map(repr, missing))} (its keys: {', '.join(map(str, doc)) or 'none'}): "
            'an instances file holds "images", "annotations" and "categories" (an unlabelled set: '
            '"annotations": [])'
        )
    return doc

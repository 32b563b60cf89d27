"""One COCO instances JSON read into packed arrays, every problem in it named before training.

    images        sorted by id (torchvision's ``CocoDetection`` order): file path (one uint8 blob + int64
                  offsets), width, height, image id, and ``box_offsets`` (N+1): image i's annotations are rows
                  ``box_offsets[i]:box_offsets[i + 1]`` of the annotation arrays
    annotations   in the file's order within an image: ``boxes`` (K, 4) float32 XYXY pixels (COCO's XYWH,
                  converted and clipped to the image), ``labels`` (K,) int64 contiguous ids 0..C-1 (categories
                  in id order), ``iscrowd`` uint8, ``area`` float32, ``annotation_id`` int64, and with masks
                  the segmentation as JSON text (one blob + offsets)

This runs once per node (``index.py`` caches what it returns); the Python dicts of the parsed JSON live in that
process only, never in a worker. Problems are gathered over the whole file and raised together: the first few of
each kind, and the count.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from feedline.datasets.coco.problems import SHOWN, SLACK, CocoError, Problems
from feedline.datasets.manifest.columns import pack

INT64 = 2**63  # ids are kept in int64 arrays: one at or past this bound is named, not wrapped or rounded


def _int(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if float(value).is_integer() else None


def _too_big(value: int) -> bool:
    return not -INT64 <= value < INT64


def _crowd(value) -> int | None:
    """COCO's iscrowd as 0 or 1: the integers 0 and 1, or a JSON boolean; anything else (the string "0", "no",
    2) is None, named as a problem rather than read as truthy."""
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, int) and value in (0, 1) else None


def categories(doc: dict, path: str) -> list[tuple[int, str]]:
    """(COCO id, name) of each category, in id order: index = the contiguous label."""
    problems, found = Problems(path), {}
    for k, cat in enumerate(doc["categories"]):
        where = f"categories[{k}]"
        if not isinstance(cat, dict):
            problems.add("json", where, f"{cat!r} is not an object")
            continue
        missing = [key for key in ("id", "name") if key not in cat]
        if missing:
            problems.add("key", where, f"no {' or '.join(map(repr, missing))}")
            continue
        cid = _int(cat["id"])
        if not isinstance(cat["name"], str) or not cat["name"].strip():  # null would become the class "None"
            problems.add(
                "json", f"{where} (category id {cat['id']!r})", f"name {cat['name']!r} is not a name"
            )
        elif cid is None:
            problems.add("json", f"{where} (category id {cat['id']!r})", "the id is not an integer")
        elif cid in found:
            problems.add("duplicate", f"category id {cid}", f"named {found[cid]!r} and {cat['name']!r}")
        else:
            found[cid] = str(cat["name"])
    problems.raise_any()
    if not found:
        raise CocoError(f"{path} lists no categories: a detection target needs at least one")
    names = [found[c] for c in sorted(found)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        ids = {n: [c for c in sorted(found) if found[c] == n] for n in twice[:SHOWN]}
        said = "; ".join(f"{n!r}: ids {', '.join(map(str, v))}" for n, v in ids.items())
        raise CocoError(f"{path} names categories alike ({said}): give each category its own name")
    return [(c, found[c]) for c in sorted(found)]


def _images(doc: dict, root: str, problems: Problems) -> tuple[list, dict, set]:
    """(id, file_name, width, height) per image, id -> its position in that list, and the ids of images refused
    (their annotations are not named again)."""
    images, position, refused = [], {}, set()
    for k, image in enumerate(doc["images"]):
        where = f"images[{k}]"
        if not isinstance(image, dict):
            problems.add("json", where, f"{image!r:.60} is not an object")
            continue
        missing = [key for key in ("id", "file_name", "width", "height") if key not in image]
        if missing:
            said = f"image id {image['id']}" if "id" in image else where
            problems.add("key", said, f"no {', '.join(map(repr, missing))}")
            refused.add(_int(image.get("id")))
            continue
        iid, w, h = _int(image["id"]), _int(image["width"]), _int(image["height"])
        if iid is None:
            problems.add("json", where, f"id {image['id']!r} is not an integer")
            continue
        if _too_big(iid):
            problems.add("json", where, f"id {iid} is beyond int64 (-2**63..2**63-1)")
            refused.add(iid)
            continue
        if w is None or h is None or w <= 0 or h <= 0:
            problems.add("json", f"image id {iid}", f"width/height {image['width']!r} x {image['height']!r}")
            refused.add(iid)
            continue
        if iid in position:
            problems.add(
                "duplicate",
                f"image id {iid}",
                f"listed twice ({images[position[iid]][1]!r} and {image['file_name']!r})",
            )
            continue
        name = str(image["file_name"])
        full = os.path.join(root, name)
        if os.path.isabs(name) or os.path.normpath(name).split(os.sep)[0] == os.pardir:
            problems.add(
                "file",
                f"image id {iid}",
                f"file_name {name!r} leaves source.images (absolute, or through ..): give it relative to that folder",
            )
        elif not os.path.isfile(full):
            problems.add(
                "file",
                f"image id {iid}",
                f"{full} {'is not a file' if os.path.exists(full) else 'does not exist'}",
            )
        position[iid] = len(images)
        images.append((iid, name, w, h))
    return images, position, refused


def _segmentation(seg, h: int, w: int):
    """(the segmentation to keep, None) or (None, why ``seg`` is no COCO segmentation of an h x w image). A
    polygon of fewer than 3 points (a line, a point: some exporters write them) is left out of its object's
    polygons, as Detectron2 leaves it; an object left with none is refused."""
    if isinstance(seg, list):
        for poly in seg:
            if not isinstance(poly, list) or len(poly) % 2:
                return None, f"polygon {str(poly)[:40]} is not a list of x, y pairs"
            if not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in poly
            ):
                return None, f"polygon {str(poly)[:40]} holds a value that is not a finite number"
        kept = [poly for poly in seg if len(poly) >= 6]
        return (kept, None) if kept else (None, f"{str(seg)[:40]}: no polygon of 3 or more points")
    if isinstance(seg, dict):
        if "counts" not in seg or "size" not in seg:
            return None, "an RLE without 'counts' and 'size'"
        if not isinstance(seg["size"], list) or seg["size"] != [h, w]:
            return None, f"an RLE of size {seg['size']}, its image is {h} x {w} (height, width)"
        counts = seg["counts"]
        if not isinstance(counts, (list, str)):
            return None, "RLE counts that are neither a list nor a string"
        if isinstance(counts, list) and (
            not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
            or sum(counts) != h * w
        ):
            return (
                None,
                f"uncompressed RLE counts that are not whole numbers summing to {h} x {w} = {h * w} pixels",
            )
        return seg, None
    return None, f"{type(seg).__name__} {str(seg)[:40]} (neither polygons nor an RLE)"


def build(doc: dict, path: str, root: str, label_of: dict, crowd: bool, empty: str, masks: bool):
    """The arrays of one file (module docstring) and what was kept, or every problem named. ``label_of``:
    COCO category id -> contiguous label (the train file's, for val and test)."""
    problems = Problems(path)
    images, position, refused = _images(doc, root, problems)
    # per annotation kept: its image's position; its numbers; its segmentation; its id (int64, apart from the
    # float64 numbers, so that an id past 2**53 keeps every digit)
    owner, rows, segs, annotation_ids = [], [], [], []
    excluded, seen = 0, {}  # annotation id -> its position in the file
    for k, ann in enumerate(doc["annotations"]):
        if not isinstance(ann, dict):
            problems.add("json", f"annotations[{k}]", f"{ann!r:.60} is not an object")
            continue
        where = f"annotation id {ann['id']}" if "id" in ann else f"annotations[{k}]"
        aid = -1  # an annotation without an id keeps -1
        if "id" in ann:
            aid = _int(ann["id"])
            if aid is None:
                problems.add("json", f"annotations[{k}]", f"id {ann['id']!r:.40} is not an integer")
                continue
            if _too_big(aid):
                problems.add("json", f"annotations[{k}]", f"id {aid} is beyond int64 (-2**63..2**63-1)")
                continue
            if aid in seen:
                problems.add("duplicate", where, f"given to annotations[{seen[aid]}] and annotations[{k}]")
                continue
            seen[aid] = k
        missing = [
            key
            for key in ("image_id", "category_id", "bbox") + (("segmentation",) if masks else ())
            if key not in ann
        ]
        if missing:
            problems.add("key", where, f"no {', '.join(map(repr, missing))}")
            continue
        iid = _int(ann["image_id"])
        if iid in refused and iid not in position:
            continue  # its image's problem is named
        if iid not in position:
            problems.add("image", where, f"image_id {ann['image_id']!r}")
            continue
        _, _, w, h = images[position[iid]]
        where += f" (image id {iid})"
        cid = _int(ann["category_id"])
        if cid not in label_of:
            known = ", ".join(map(str, sorted(label_of)[:12])) + (", ..." if len(label_of) > 12 else "")
            problems.add("category", where, f"category_id {ann['category_id']!r} (the categories: {known})")
            continue
        box = ann["bbox"]
        if not (
            isinstance(box, list)
            and len(box) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)
        ):
            problems.add("json", where, f"bbox {str(box)[:60]} is not 4 finite numbers [x, y, width, height]")
            continue
        x, y, bw, bh = (float(v) for v in box)
        if bw < 0 or bh < 0:
            problems.add("negative", where, f"bbox {box}: width {bw:g}, height {bh:g}")
            continue
        if x < -SLACK or y < -SLACK or x + bw > w + SLACK or y + bh > h + SLACK:
            problems.add(
                "outside",
                where,
                f"bbox {box} spans x {x:g}..{x + bw:g}, y {y:g}..{y + bh:g} of a {w} x {h} image",
            )
            continue
        is_crowd = _crowd(ann.get("iscrowd", 0))
        if is_crowd is None:
            problems.add("json", where, f"iscrowd {ann['iscrowd']!r:.40} is not 0, 1, true or false")
            continue
        if masks:
            seg, why = _segmentation(ann["segmentation"], h, w)
            if why:
                problems.add("segmentation", where, why)
                continue
        if is_crowd and not crowd:
            excluded += 1
            continue
        x0, y0 = min(max(x, 0.0), w), min(max(y, 0.0), h)
        x1, y1 = min(max(x + bw, 0.0), w), min(max(y + bh, 0.0), h)
        area = ann.get("area")
        if (
            isinstance(area, bool)
            or area is not None
            and not (isinstance(area, (int, float)) and math.isfinite(area) and area >= 0)
        ):
            problems.add("json", where, f"area {area!r:.40} is not a number of pixels (0 or more)")
            continue
        area = float(area) if area is not None else bw * bh
        owner.append(position[iid])
        rows.append((x0, y0, x1, y1, label_of[cid], is_crowd, area))
        annotation_ids.append(aid)
        if masks:
            segs.append(json.dumps(seg, separators=(",", ":")))
    problems.raise_any()
    return _pack(images, owner, rows, segs, annotation_ids, empty, masks, excluded, path)


def _pack(images, owner, rows, segs, annotation_ids, empty, masks, excluded, path) -> tuple[dict, dict]:
    ids = np.array([i[0] for i in images], dtype=np.int64)
    order = np.argsort(ids, kind="stable")  # images by id; new position of each old one:
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    owner = rank[np.asarray(owner, dtype=np.int64)] if owner else np.zeros(0, dtype=np.int64)
    counts = np.bincount(owner, minlength=len(images))  # by new position
    kept = order if empty == "keep" else order[counts > 0]  # old positions, by id
    if not len(kept):
        raise CocoError(
            f"{path} holds no image to train on ({len(images)} images, {len(rows)} annotations kept"
            + (", source.empty=skip" if empty == "skip" else "")
            + ")"
        )
    by_image = np.argsort(owner, kind="stable")  # annotations grouped by image, the file's order within one
    table = np.array(rows, dtype=np.float64).reshape(-1, 7)[by_image]
    per_image = counts if empty == "keep" else counts[counts > 0]
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(per_image, out=offsets[1:])
    blob, path_offsets = pack(images[i][1] for i in kept)
    arrays = {
        "paths.text": blob,
        "paths.offsets": path_offsets,
        "width": np.array([images[i][2] for i in kept], dtype=np.int32),
        "height": np.array([images[i][3] for i in kept], dtype=np.int32),
        "image_id": ids[kept],
        "box_offsets": offsets,
        "boxes": np.ascontiguousarray(table[:, :4], dtype=np.float32),
        "labels": table[:, 4].astype(np.int64),
        "iscrowd": table[:, 5].astype(np.uint8),
        "area": table[:, 6].astype(np.float32),
        "annotation_id": np.array(annotation_ids, dtype=np.int64).reshape(-1)[by_image],
    }
    if masks:
        arrays["segmentation.text"], arrays["segmentation.offsets"] = pack(segs[j] for j in by_image)
    found = {
        "images": len(kept),
        "annotations": len(rows),
        "skipped_empty": int(len(images) - len(kept)),
        "crowd_excluded": excluded,
    }
    return arrays, found

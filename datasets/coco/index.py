"""The index of one COCO annotation file: its packed arrays (``annotations.py``), built once per node, mapped
everywhere after.

    <cache_dir>/coco/<file name>-<digest>/
        <array>.npy    paths.text + paths.offsets, width, height, image_id, box_offsets (N+1);
                       boxes (K, 4), labels, iscrowd, area, annotation_id; segmentation.text + .offsets (masks)
        meta.json      the file, its content digest, the classes and their COCO ids, the counts,
                       written last with its own checksum: an index without it is never read

The directory's digest hashes the file's path and content digest (its bytes, so an edit within a timestamp tick
still rebuilds), ``source.images``, the options that change what is kept (crowd, empty, masks) and, for val and
test, the train file's categories. Each array is written atomically with its checksum (``cache.save_array``);
a damaged one is found on load and the index rebuilt, with a warning. Seeded splits are cached beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

from feedline.datasets.arrays import LazyArray
from feedline.datasets.cache import (
    cache_path,
    check_array,
    checked_meta,
    json_checksum,
    save_array,
    write_text,
)
from feedline.datasets.coco import annotations as coco_json
from feedline.datasets.coco.problems import CocoError, load_json

log = logging.getLogger(__name__)

FORMAT = 3  # 2: iscrowd, duplicate and int64-overflowing ids checked; 3: areas, category names, file names
# leaving the folder checked (an index of an earlier format may hold them)
ARRAYS = (
    "paths.text",
    "paths.offsets",
    "width",
    "height",
    "image_id",
    "box_offsets",
    "boxes",
    "labels",
    "iscrowd",
    "area",
    "annotation_id",
)
MASK_ARRAYS = ("segmentation.text", "segmentation.offsets")


def file_digest(path: str) -> str:
    """The file's bytes as 16 hex digits: what the cache and a resume compare."""
    h = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def open_index(path: str, digest: str, root: str, options: dict, categories=None, cache_dir=None) -> dict:
    """The index of annotation file ``path`` (its content ``digest``) over image folder ``root``: from the
    cache, else built and cached. ``options``: crowd, empty, masks. ``categories``: [(COCO id, name), ...] that
    fix the labels (the train file's), or None to take the file's own. A dict: ``meta``, ``arrays``
    (name -> LazyArray) and ``directory``."""
    key = [FORMAT, path, digest, root, options, categories]
    directory = cache_path("coco", os.path.splitext(os.path.basename(path))[0], key, cache_dir)
    names = ARRAYS + (MASK_ARRAYS if options["masks"] else ())
    index = _load(directory, names)
    if index is None:
        started = time.perf_counter()
        with open(path, "rb") as f:
            doc = load_json(path, f.read())
        own = coco_json.categories(doc, path)
        if categories is None:
            categories = own
        else:
            _same_categories(path, own, categories)
        label_of = {int(cid): label for label, (cid, _) in enumerate(categories)}
        arrays, found = coco_json.build(doc, path, root, label_of, **options)
        del doc
        for name, array in arrays.items():
            save_array(directory / f"{name}.npy", array)
        meta = {
            "format": FORMAT,
            "file": path,
            "digest": digest,
            "root": root,
            "classes": [name for _, name in categories],
            "category_ids": [int(cid) for cid, _ in categories],
            **found,
        }
        meta["checksum"] = json_checksum(meta)
        write_text(directory / "meta.json", json.dumps(meta, ensure_ascii=False))  # last
        index = _load(directory, names)
        log.info(
            "indexed %d images (%d without boxes skipped, source.empty), %d annotations (%d crowd left out, "
            "source.crowd) of %s in %.2f s",
            found["images"],
            found["skipped_empty"],
            found["annotations"],
            found["crowd_excluded"],
            path,
            time.perf_counter() - started,
        )
    index["directory"] = directory
    return index


def _same_categories(path: str, own, train) -> None:
    """A val or test file labels with the train file's categories: one it names otherwise is refused."""
    names = dict(train)
    other = [(cid, name) for cid, name in own if cid in names and names[cid] != name]
    if other:
        said = "; ".join(
            f"id {cid} is {name!r} here, {names[cid]!r} in the train file" for cid, name in other[:5]
        )
        raise CocoError(
            f"{path} names categories otherwise than source.annotations ({said}): val and test are labelled "
            "with the train file's categories; export them with the same category list"
        )


def _load(directory, names) -> dict | None:
    """The cached index in ``directory``, or None when there is none or it is damaged (with a warning)."""
    try:
        meta = checked_meta(directory, FORMAT)
        if meta is None:
            return None
        arrays = {}
        for name in names:
            reason = check_array(directory / f"{name}.npy")
            if reason:
                raise ValueError(reason)
            arrays[name] = LazyArray(directory / f"{name}.npy")
            arrays[name].array  # noqa: B018 - mapped now: workers inherit this file, or refuse a new one
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("the COCO index %s is damaged (%s); rebuilding it", directory, err)
        return None
    return {"meta": meta, "arrays": arrays}

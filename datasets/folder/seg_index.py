"""The index of a segmentation tree (``<tree>/images/**/<stem>.<ext>`` beside ``<tree>/masks/**/<stem>.png``):
images paired with their masks once, by stem, and kept as a folder index (``index.py``) of two classes.

    class 0 "images"   the N images, in ImageFolder order (sorted directories, then names)
    class 1 "masks"    the N masks, in the same order: row i's mask is entry N + i

So the packed arrays, the atomic publish, the checksums, the staleness signature (every directory of both
halves) and the O(1) pickles are the folder index's own. Pairing happens when the index is built: an image
without a mask or a mask without an image is named (up to ``SHOWN`` of each) before training, never skipped.
"""

from __future__ import annotations

import logging
import os
import time

from feedline.datasets.cache import cache_path, check_refresh, stale_dirs
from feedline.datasets.folder.index import RACY_WINDOW_NS, _check, publish_scan
from feedline.datasets.folder.listing import ClassScan, _NameFilter, scan_class
from feedline.datasets.folder.packed import FolderIndex
from feedline.datasets.folder.scan import TreeScan
from feedline.datasets.paths import normalize_extensions, require_dir

log = logging.getLogger(__name__)

IMAGES, MASKS = "images", "masks"
MASK_EXTENSIONS = (".png",)
SHOWN = 10  # unpaired files named in the error, of each kind


def _stems(scan: ClassScan, top: str) -> list[tuple[str, str]]:
    """(stem below ``top``, relative path) of every file of ``scan``, in its order."""
    paths = scan.paths.decode("utf-8", "surrogateescape").split("\0")[:-1]
    return [(os.path.splitext(p[len(top) + 1 :])[0], p) for p in paths]


def pair(tree: str, extensions, key: str) -> TreeScan:
    """Scan ``tree``'s images and masks and pair them by stem, or an error naming the unpaired files."""
    root_mtime = os.stat(tree).st_mtime_ns
    for top in (IMAGES, MASKS):
        if not os.path.isdir(os.path.join(tree, top)):
            raise FileNotFoundError(
                f"{key} '{tree}' has no {top}/ folder: expected {tree}/images/<stem>.<jpg|png> and "
                f"{tree}/masks/<stem>.png (or {tree}/train/images and {tree}/train/masks)"
            )
    images = scan_class(IMAGES, tree, _NameFilter(extensions))
    masks = scan_class(MASKS, tree, _NameFilter(MASK_EXTENSIONS))
    image_stems, mask_stems = _stems(images, IMAGES), _stems(masks, MASKS)
    if not image_stems:
        raise FileNotFoundError(
            f"{key} '{tree}': found 0 images in {tree}/images (extensions: {', '.join(extensions)}; set "
            f"source.extensions=[...] to change them)"
        )
    by_stem, twice = {}, []
    for stem, path in image_stems:
        if stem in by_stem:
            twice.append(f"{by_stem[stem]} and {path}")
        by_stem[stem] = path
    if twice:
        raise ValueError(
            f"{key} '{tree}': {len(twice)} image stem(s) have two files, so which one a mask belongs to is "
            f"unclear: {'; '.join(twice[:SHOWN])}. Keep one file per stem"
        )
    mask_of = dict(mask_stems)
    lonely = [path for stem, path in image_stems if stem not in mask_of]
    orphans = [path for stem, path in mask_stems if stem not in by_stem]
    if lonely or orphans:
        parts = [
            f"{len(files)} {what}: {', '.join(files[:SHOWN])}{' ...' if len(files) > SHOWN else ''}"
            for files, what in ((lonely, "image(s) without a mask"), (orphans, "mask(s) without an image"))
            if files
        ]
        raise FileNotFoundError(
            f"{key} '{tree}': every image needs a mask of the same stem (images/<stem>.<ext> and "
            f"masks/<stem>.png): {'; '.join(parts)}. Add or remove those files"
        )
    paired = "".join(mask_of[stem] + "\0" for stem, _ in image_stems).encode("utf-8", "surrogateescape")
    halves = [images, ClassScan(paired, len(image_stems))]
    found = TreeScan([IMAGES, MASKS], halves, [("", root_mtime), *images.dirs, *masks.dirs], [])
    for scan in (images, masks):
        found.loops.extend(scan.loops)
        found.unreadable.extend(scan.unreadable)
        found.odd.extend(scan.odd)
    return found


def open_pairs(tree: str, extensions, cache_dir, refresh: str, key: str) -> FolderIndex:
    """The paired index of ``tree``: mapped from the cache when it is sound and fresh, (re)built otherwise."""
    check_refresh(refresh)
    tree = require_dir(tree, key)
    extensions = normalize_extensions(extensions)
    dest = cache_path("seg-index", os.path.basename(tree), [tree, sorted(extensions)], cache_dir)
    if refresh != "always":
        index, reason = _check(dest)
        if reason is None:
            changed = [] if refresh == "never" else stale_dirs(tree, index.dirs())
            if not changed:
                return index
            log.info("%s changed since it was indexed (%s); re-indexing", tree, ", ".join(changed))
        elif reason != "missing":
            log.warning("index cache %s is unusable (%s); rebuilding it", dest, reason)
    started = time.time_ns()
    scan = pair(tree, extensions, key)
    # a directory changed within a timestamp tick of its listing may keep its mtime: listed again next load
    scan.dirs = [(d, -1 if m >= started - RACY_WINDOW_NS else m) for d, m in scan.dirs]
    index = publish_scan(tree, extensions, scan, dest, started)
    log.info("indexed %d image/mask pairs under %s", index.counts[0], tree)
    return index

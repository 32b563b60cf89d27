"""Paths as every source takes them: local paths checked against the key that names them, class folders,
and image file extensions."""

from __future__ import annotations

import os

from feedline.storage.stores import is_url

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def normalize_extensions(extensions, key: str = "source.extensions") -> tuple[str, ...]:
    """Lower-case extensions with their dot (``JPG`` -> ``.jpg``; one string is one extension). An empty
    list, or an entry with nothing after the dot, would match every file: an error naming ``key``."""
    if isinstance(extensions, str):
        extensions = [extensions]
    given = [str(e) for e in extensions]
    exts = tuple(e if e.startswith(".") else "." + e for e in (g.strip().lower() for g in given))
    bad = [g for g, e in zip(given, exts) if len(e) < 2 or "/" in e or "\0" in e]
    if not exts or bad:
        why = f"{', '.join(map(repr, bad))} is not one" if bad else "an empty list matches no image"
        raise ValueError(f"{key}={given!r} must list file extensions such as [.jpg, .png]: {why}")
    return exts


def list_classes(root: str) -> list[str]:
    """Sorted names of the visible sub-directories of ``root`` (symlinked directories count)."""
    with os.scandir(root) as it:
        return sorted(e.name for e in it if not e.name.startswith(".") and _is_dir(e))


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks; stats only for links and unknown d_type
    except OSError:  # a symlink whose target vanished
        return False


def local_path(path, key: str) -> str:
    """``path`` made absolute (``~`` expanded); a URL is an error naming ``key``: only ``source=shards`` reads
    object storage (taken as a local path, ``s3://b/x`` would be reported as a missing ``./s3:/b/x``)."""
    if is_url(path):
        raise ValueError(
            f"{key}={path} is a URL, and this source reads local paths only; data in object storage is read by "
            f"source=shards. Set {key} to a local copy, or convert a local copy once (python convert.py "
            f"source=... out.format=shards out.path=<an s3:// prefix>) and read that with source=shards "
            f"source.path=<the prefix>"
        )
    return os.path.abspath(os.path.expanduser(str(path)))


def require_dir(path: str, key: str) -> str:
    """``path`` made absolute, or an error naming it and the config key to fix."""
    path = local_path(path, key)
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise FileNotFoundError(f"{key} '{path}' {what} (set {key}=... or check the path)")
    return path


def class_folders(root: str, sample: str = "<image>", key: str = "source.root") -> list[str]:
    """The sorted class folders of ``root``, or an error naming the key and the layout expected."""
    classes = list_classes(root)
    if not classes:
        raise FileNotFoundError(f"{key} '{root}' has no class folders: expected {root}/<class>/{sample}")
    return classes

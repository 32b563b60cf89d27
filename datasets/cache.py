"""The cache every source keeps beside the data: where it lives, when it is stale, how it is written.

    <cache_dir>/<kind>/<name>-<digest>/     one directory per cached thing (an index, a manifest, labels)

``cache_dir`` is ``source.cache_dir`` when set, else ``$FEEDLINE_CACHE_DIR``, else ``~/.cache/feedline``.
The digest hashes what the cached content depends on (the absolute root, the extensions, a file's size
and mtime), so two datasets never share a directory and a changed input gets a new one. Every file is
written under a temporary name in the same directory and renamed into place: a reader sees the old file or
the new one, never half of one, and a killed writer leaves only a hidden temporary behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

REFRESH_MODES = ("auto", "always", "never")


def check_refresh(value) -> str:
    """``source.refresh`` as one of REFRESH_MODES, or an error naming the key."""
    if str(value) not in REFRESH_MODES:
        raise ValueError(f"source.refresh={value!r} is not one of: {', '.join(REFRESH_MODES)}")
    return str(value)


def default_cache_dir() -> str:
    return os.environ.get("FEEDLINE_CACHE_DIR") or os.path.join("~", ".cache", "feedline")


def cache_path(kind: str, name: str, key, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory of one thing: ``<cache_dir>/<kind>/<name>-<digest of key>``.

    ``name`` makes the directory recognisable (a root's base name); ``key`` (JSON-serialisable) is what
    the content depends on."""
    digest = hashlib.sha1(json.dumps(key).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = Path(os.path.expanduser(str(cache_dir or default_cache_dir()))) / kind
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name or "root")
    return base / f"{safe[:40]}-{digest}"


def save_array(path: str | os.PathLike, array: np.ndarray) -> Path:
    """``np.save`` to ``path`` atomically (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".npy", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def stale_dirs(root: str, dirs, limit: int = 5) -> list[str]:
    """Directories whose mtime changed (or that vanished) since they were recorded: O(directories) stats."""
    changed = []
    for rel, mtime_ns in dirs:
        try:
            now = os.stat(os.path.join(root, rel) if rel else root).st_mtime_ns
        except OSError:
            now = None
        if now != mtime_ns:
            changed.append(rel or ".")
            if len(changed) >= limit:
                break
    return changed

"""What a chunk cache has fetched (``<dir>.stats``: chunks and bytes), for ``ChunkCache.fetched`` and the
benchmarks. Written as a new file of its own and renamed over the last, so a reader never sees half of it;
a record that does not parse counts as none.
"""

from __future__ import annotations

import json
import os
import tempfile

from feedline.storage.cache_room import remove
from feedline.storage.cache_trust import open_own


def record_fetch(directory: str, size: int, setting: str) -> None:
    """One more chunk of ``size`` bytes fetched into the cache at ``directory``."""
    stats = fetched(directory, setting)
    stats["chunks"] += 1
    stats["bytes"] += int(size)
    path = stats_path(directory)
    # a new file of its own (mode 0o600, a name no one else can take first), then renamed over the last
    fd, new = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(stats, f)
        os.replace(new, path)
    except BaseException:
        remove(new)
        raise


def fetched(directory: str, setting: str) -> dict:
    """Chunks and bytes fetched into the cache at ``directory`` since it was made."""
    try:
        fd, _ = open_own(stats_path(directory), os.O_RDONLY, setting)
    except FileNotFoundError:
        return {"chunks": 0, "bytes": 0}
    with os.fdopen(fd) as f:
        try:
            stats = json.load(f)
        except ValueError:
            stats = None
    valid = isinstance(stats, dict) and all(isinstance(stats.get(k), int) for k in ("chunks", "bytes"))
    return stats if valid else {"chunks": 0, "bytes": 0}


def stats_path(directory: str) -> str:
    """Beside the directory, not in it: a limit of exactly the chunks it must hold holds them."""
    return os.path.normpath(directory) + ".stats"

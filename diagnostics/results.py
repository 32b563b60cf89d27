"""Writing results as JSON, for bench.py and the benchmark scripts alike."""

from __future__ import annotations

import json
import os


def write_json(path: str | None, result: dict) -> None:
    """Write ``result`` to ``path`` (parents created); nothing when ``path`` is empty."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)

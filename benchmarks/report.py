"""What every benchmark does with its results: write them as JSON when asked."""

from __future__ import annotations

import json
import os


def write_json(path: str | None, result: dict) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)

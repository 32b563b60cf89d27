"""What every benchmark does with its results: write them as JSON when asked (``--json``)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from utils.results import write_json  # noqa: E402

__all__ = ["write_json"]

"""Progress of long work (a conversion, a layout, an upload): a tqdm bar on a terminal, plain lines elsewhere.

tqdm redraws its bar with carriage returns, which a terminal overwrites and a file keeps: a log file, SLURM's
output or a CI log then holds every redraw on one line (``converting to x: 0%| ... 0%| ...``). Off a terminal,
``progress`` writes one line as the work starts, one every ``every_s`` seconds, and one when it ends, each on
a line of its own. Both have tqdm's ``update(k)``, ``n`` and context-manager use.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm as plain_tqdm
from tqdm.auto import tqdm

EVERY_S = 30.0


def progress(total: int, desc: str, unit: str, unit_scale: bool = False, file=None, **options):
    """A bar counting to ``total`` ``unit``s: tqdm's where ``file`` (default stderr) is a terminal."""
    out = file if file is not None else sys.stderr
    if _is_terminal(out):
        return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=file, **options)
    return Lines(total, desc, unit, unit_scale, out)


def _is_terminal(out) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


class Lines:
    """Progress as plain lines: ``<desc>: <n>/<total> <unit> (<share>)``, at the start, every ``every_s``
    seconds of updates, and at the end with the time taken."""

    def __init__(self, total, desc, unit, unit_scale=False, file=None, every_s=EVERY_S, clock=time.monotonic):
        self.total, self.desc, self.unit, self.unit_scale = total, desc, unit, unit_scale
        self.file = file if file is not None else sys.stderr
        self.every_s, self.clock = every_s, clock
        self.n = 0
        self.started = self.last = clock()
        self.closed = False
        self._line()

    def _count(self, n) -> str:
        return plain_tqdm.format_sizeof(n) if self.unit_scale else str(n)

    def _line(self, suffix: str = "") -> None:
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        print(
            f"{self.desc}: {self._count(self.n)}/{self._count(self.total)} {self.unit}{share}{suffix}",
            file=self.file,
            flush=True,
        )

    def update(self, k=1) -> None:
        self.n += k
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self._line()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._line(f", {self.clock() - self.started:.0f} s")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

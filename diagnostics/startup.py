"""Where the time to the first batch goes: marks from the process's start to the third batch.

The first mark is the process's start time (Linux: ``/proc/self/stat``), so the first step counts the
interpreter, the imports and the config; elsewhere the clock starts at the first mark.
"""

from __future__ import annotations

import os
import time


def process_start() -> float | None:
    """The wall-clock time this process started, or None where /proc does not say."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat, after the name
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - started_after_boot)


class StartupClock:
    def __init__(self, clock=time.time):
        self.clock = clock
        start = process_start() if clock is time.time else None
        self.marks: list[tuple[str, float]] = [("process start", start if start is not None else clock())]

    def mark(self, step: str) -> None:
        self.marks.append((step, self.clock()))

    def rows(self) -> list[dict]:
        """Each step with its own seconds and the seconds since the process started."""
        first = self.marks[0][1]
        return [
            {"step": step, "seconds": at - before, "since_start": at - first}
            for (_, before), (step, at) in zip(self.marks, self.marks[1:])
        ]

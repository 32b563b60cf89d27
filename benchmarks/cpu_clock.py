"""The CPU time of a loader's process tree, at the scheduler's resolution where the kernel gives it.

psutil reads ``/proc/<pid>/stat``, counted in clock ticks (10 ms): a short run (a test's 50 images at
0.6 ms each, spread over two workers) reads as 0.00 ms per image, and a ratio against it means nothing. On
Linux each process also has a CPU clock of its own (the one ``clock_getcpuclockid`` returns), counted in
nanoseconds over all its threads, those that ended included; it is read here, with psutil's ticks elsewhere.
(A thread of another process that is running at the moment of the read may be counted up to one scheduler
tick late, 1-4 ms, once per reading: far under the ticks' 10 ms per process and thread.)
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time


def _process_clock(pid: int) -> int:
    """Linux's CPU clock id of process ``pid`` (what glibc's clock_getcpuclockid builds: ~pid << 3 | SCHED)."""
    return ((~pid) << 3) | 2


def process_seconds(proc) -> float:
    """User and system CPU seconds of the psutil process ``proc``, all its threads; raises
    psutil.NoSuchProcess for a process that is gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):  # gone, or not ours: psutil says which
            return time.clock_gettime(_process_clock(proc.pid))
    return sum(proc.cpu_times()[:2])


def tree_seconds(me, reaped: bool = False) -> float:
    """CPU seconds of the psutil process ``me`` and every live descendant (loader workers); with ``reaped``,
    also the children that ended and were waited for (non-persistent workers of a finished pass)."""
    import psutil

    total = process_seconds(me)
    if reaped:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # microseconds, unlike os.times()'s ticks
        total += usage.ru_utime + usage.ru_stime
    for proc in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker that ended between the calls
            total += process_seconds(proc)
    return total


def cpu_ratio(cpu, against) -> float | None:
    """``cpu / against`` where both were measured; None where either is 0 (under the clock's resolution) or
    missing: no ratio, and no target judged on it."""
    return cpu / against if cpu and against and cpu > 0 and against > 0 else None

"""The bad-sample budget: which samples of a split turned out unreadable, shared by every worker.

One byte per sample in shared memory, set by whichever worker found the sample bad. It makes each bad file
logged once per run, whichever worker or substitution met it first, and it bounds how much of a split may
be bad: ``data.max_bad_fraction`` of its samples (at least one). A few hundred truncated files among a
million train on; a split that is mostly bad stops with a summary instead of training on what is left.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class BadSampleError(RuntimeError):
    """A sample could not be read or decoded (the message names its path), or too many could not."""


def check_max_bad_fraction(value) -> float:
    fraction = float(value)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"data.max_bad_fraction={value} must be in [0, 1] (0: stop at the first bad sample)")
    return fraction


class BadSamples:
    """Flags over a split's samples. ``shared=True`` puts them in shared memory before the workers start
    (the datamodule does that per loader), so every worker and the main process see one set of flags."""

    def __init__(self, size: int, max_fraction: float, shared: bool = False):
        self.size = int(size)
        self.max_fraction = check_max_bad_fraction(max_fraction)
        self.allowed = max(1, int(self.max_fraction * self.size)) if self.max_fraction > 0 else 0
        self.flags = torch.zeros(max(self.size, 1), dtype=torch.uint8)
        if shared:
            self.flags.share_memory_()
        self.seen_here: list[str] = []  # paths this process found bad, for the summary

    @property
    def count(self) -> int:
        return int(self.flags.sum())

    def found(self, i: int, path: str, err: Exception) -> None:
        """Record sample ``i`` as bad: logged the first time any process finds it; BadSampleError, with a
        summary, once the split holds more bad samples than its budget."""
        if not self.flags[i]:
            self.flags[i] = 1
            self.seen_here.append(path)
            log.warning("skipping bad sample %s: %s", path, err)
        count = self.count
        if count > self.allowed:
            shown = ", ".join(self.seen_here[:5])
            raise BadSampleError(
                f"{count} of {self.size} samples are unreadable, more than data.max_bad_fraction="
                f"{self.max_fraction:g} allows ({self.allowed}); found here: {shown}"
                f"{' ...' if len(self.seen_here) > 5 else ''} (each was logged as it was found, with why). Check "
                "the data; when the reasons are alike (a mask value beyond the class list, a field of the wrong "
                "kind), check the config that declares the fields first: skipping would drop every such "
                "sample. Else raise data.max_bad_fraction"
            )

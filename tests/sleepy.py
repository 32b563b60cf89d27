"""Test-only pipeline parts that are slow on purpose, for bench.py's verdict tests.

They take no real time: each advances ``CLOCK``, a fake clock that the tests hand to
``feedline.diagnostics.loader_bench`` in place of ``time.perf_counter``. Every stage that is not made slow
then measures zero, so the shares and the verdict come out the same on a busy machine as on an idle one.
"""

from __future__ import annotations

import torch

from feedline.datasets.folder.source import FolderSource


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


CLOCK = FakeClock()


class SleepyRecords:
    def __init__(self, records, delay: float):
        self.records, self.delay = records, delay

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        CLOCK.advance(self.delay)  # a slow disk or network filesystem
        return self.records[i]

    def describe(self, i: int) -> str:
        return self.records.describe(i)


class SleepyFolderSource(FolderSource):
    """``folder`` whose every read takes ``delay`` seconds more."""

    def __init__(self, *args, delay: float = 0.005, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay = delay

    def split(self, name: str):
        return SleepyRecords(super().split(name), self.delay)


class Sleep:
    """A per-sample transform that takes ``seconds``."""

    def __init__(self, seconds: float = 0.005):
        self.seconds = seconds

    def __call__(self, image):
        CLOCK.advance(self.seconds)
        return image


class SlowNet(torch.nn.Module):
    """A network (``model.net``) whose forward takes ``seconds`` per step: a model slower than the loader."""

    def __init__(self, num_classes: int, seconds: float = 1.0, **_):
        super().__init__()
        self.seconds = seconds
        self.head = torch.nn.LazyLinear(num_classes)

    def forward(self, x):
        CLOCK.advance(self.seconds)
        return self.head(x.flatten(1))


class FirstReadRecords(SleepyRecords):
    """Records whose first read in the process takes ``delay`` (opening a file, a first call), and no
    other; shared by every part built on them, as a cache file two parts map is."""

    opened = False

    def __getitem__(self, i: int):
        if not FirstReadRecords.opened:
            FirstReadRecords.opened = True
            CLOCK.advance(self.delay)
        return self.records[i]


class FirstReadFolderSource(FolderSource):
    """``folder`` whose first read in the process, of any part built on it, takes ``delay`` seconds."""

    def __init__(self, *args, delay: float = 0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay = delay

    def split(self, name: str):
        return FirstReadRecords(super().split(name), self.delay)

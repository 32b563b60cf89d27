"""Test-only pipeline parts that are slow on purpose, for bench.py's verdict tests."""

from __future__ import annotations

import time

from feedline.datasets.folder import FolderSource


class SleepyRecords:
    def __init__(self, records, delay: float):
        self.records, self.delay = records, delay

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        time.sleep(self.delay)  # a slow disk or network filesystem
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
        time.sleep(self.seconds)
        return image

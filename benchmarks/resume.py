"""Time to the first batch when a run resumes at 90% of its epoch, against a fresh start of the same epoch.

    python benchmarks/resume.py [--samples 1000000] [--small 20000] [--at 0.9] [--workers 1] [--repeat 3]
                                [--json results.json]

Data: cheap samples (an 8x8 uint8 image each, no decode, no disk), so the figure is the loader's own cost of
getting to its position. The train loader is feedline's (``ImageDataModule.train_dataloader``: shuffled by
seed and epoch, with workers); "resume" restores a state saved at ``--at`` of the epoch through
``load_state_dict``, as Lightning does, and times ``iter()`` plus the first batch. The anchor is what an exact
resume costs a loader without state: reading and dropping the batches before the position; it runs on the
``--small`` epoch only, since on the large one it would read the whole 90%. Median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from feedline.datamodules.image import ImageDataModule
from feedline.datasets.records import Records, Source
from feedline.diagnostics.results import write_json
from feedline.transforms.collate import Uint8Collate


class CheapRecords(Records):
    """``total`` rows of one shared 8x8 image: reading costs a lookup, nothing else."""

    def __init__(self, total: int):
        super().__init__()
        self._total = total
        self.image = np.zeros((3, 8, 8), dtype=np.uint8)

    @property
    def total(self) -> int:
        return self._total

    def read(self, row: int):
        return self.image, row % 10

    def where(self, row: int) -> str:
        return f"cheap[{row}]"


class CheapSource(Source):
    def __init__(self, total: int):
        self.total = total

    @property
    def classes(self) -> list[str]:
        return [str(k) for k in range(10)]

    def prepare(self) -> None:
        pass

    def split(self, name: str) -> CheapRecords:
        return CheapRecords(self.total)


def loader(samples: int, workers: int, batch_size: int):
    dm = ImageDataModule(
        CheapSource(samples),
        collate=Uint8Collate(),
        batch_size=batch_size,
        num_workers=workers,
        persistent_workers=False,
        seed=0,
    )
    dm.datasets["train"] = dm._dataset("train")
    return dm.train_dataloader()


def first_batch(samples: int, workers: int, batch_size: int, at: float | None, drop: bool = False) -> float:
    dl = loader(samples, workers, batch_size)
    skip = int(at * len(dl)) if at else 0
    start = time.perf_counter()
    if at and not drop:
        dl.load_state_dict({**dl.state_dict(), "batches": skip})
    it = iter(dl)
    for _ in range(skip if drop else 0):  # a loader without state: read the batches before the position
        next(it)
    next(it)
    seconds = time.perf_counter() - start
    del it
    return seconds


def measure(samples: int, args, modes) -> list[dict]:
    times = {mode: [] for mode in modes}
    for _ in range(args.repeat):  # alternate, so drift on a noisy machine hits every mode alike
        for mode in modes:
            at = None if mode == "fresh" else args.at
            times[mode].append(first_batch(samples, args.workers, args.batch_size, at, drop=mode == "drop"))
    fresh = statistics.median(times["fresh"])
    rows = []
    for mode in modes:
        seconds = statistics.median(times[mode])
        rows.append({"samples": samples, "start": mode, "seconds": seconds, "vs_fresh": seconds / fresh})
    return rows


LABELS = {
    "fresh": "fresh start of the epoch",
    "resume": "feedline: resume at {at:.0%} (load_state_dict)",
    "drop": "anchor: read and drop the first {at:.0%}",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--at", type=float, default=0.9)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    rows = measure(args.samples, args, ("fresh", "resume")) + measure(
        args.small, args, ("fresh", "resume", "drop")
    )
    print(
        f"time to the first batch, {args.workers} worker(s), batch {args.batch_size}, median of {args.repeat}\n"
    )
    print("| epoch (samples) | start | first batch (s) | vs fresh start |")
    print("|---:|---|---:|---:|")
    for row in rows:
        label = LABELS[row["start"]].format(at=args.at)
        print(f"| {row['samples']:,} | {label} | {row['seconds']:.3f} | {row['vs_fresh']:.2f}x |")
    big = next(r for r in rows if r["samples"] == args.samples and r["start"] == "resume")
    print(
        f"\nresume at {args.at:.0%} of {args.samples:,} samples: {big['vs_fresh']:.2f}x a fresh start (target <= 1.2x)"
    )
    write_json(args.json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()

"""Semantic segmentation loading as users write it today, against feedline, in CPU time per sample.

    python benchmarks/segmentation.py [--images 2000] [--rounds 3] [--workers 2] [--batch-size 64]
                                      [--batches N] [--data-dir DIR] [--json results.json]

Data (``segmentation_data.py``, made once under ``--data-dir``): the JPEG photos of ``throughput.py`` (about
500x375), each with a palette PNG mask of its size (1-4 shapes, 4 classes) and a CSV table of the pairs
(columns image, mask). Work, for every row: read and decode the image and its mask (the mask's palette
indices, one channel), RandomResizedCrop(224) and a horizontal flip applied to both (nearest for the mask),
uint8 batches of ``--batch-size`` from ``--workers`` worker processes.

Rows: the anchor, a torchvision-style ``Dataset`` opening both files with PIL, wrapping them as
``tv_tensors.Image``/``Mask`` and applying one ``v2.Compose`` to the pair, through a ``DataLoader`` with the
default collate; feedline's ``manifest`` source over the same table through ``ImageLoaders`` (the train stack's
crop and flip, ``collate=uint8``); LitData (when installed) on the same pairs optimized once into dict samples
{"image": JPEG bytes, "mask": PNG bytes}, decoded and transformed as the anchor does.

Each measurement runs in a fresh process (``peers.child``); rows alternate within a round; after two warm-up
batches the process tree's CPU time (``cpu_clock.py``) and the wall time are taken over ``--batches`` batches
(default: the rest of one epoch). The table gives medians over ``--rounds`` with the min-max, and each row's
CPU per sample against the anchor's. Target: feedline's CPU per sample at 0.5x the anchor's or less.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Nothing heavy at module level: a measurement's child imports what its row needs, and no more.
import cpu_clock  # noqa: E402 - standard library only
import peers  # noqa: E402 - standard library only at module level
from peer_work import crop_and_flip, decode_jpeg  # noqa: E402
from segmentation_data import CLASSES, decode_mask, ensure_litdata, ensure_table  # noqa: E402

ANCHOR = "torchvision Dataset + PIL + v2, DataLoader"
OURS = "feedline manifest, ImageLoaders"
LITDATA = "LitData dict samples, StreamingDataLoader"
TARGET = 0.5  # feedline's CPU per sample, at most this share of the anchor's


# -- rows: each build(data, args) -> an iterable of batches, (images, masks) first ----------------------------
class PilPairs:
    """The anchor: a torchvision-style map-style Dataset of (image, mask) pairs opened with PIL."""

    def __init__(self, table: str, transform):
        from segmentation_data import pairs

        self.pairs, self.transform = pairs(table), transform

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i):
        from PIL import Image
        from torchvision import tv_tensors
        from torchvision.transforms.v2.functional import pil_to_tensor

        image_path, mask_path = self.pairs[i]
        image = Image.open(image_path).convert("RGB")
        mask = Image.open(mask_path)  # mode P: its palette indices, as they are
        return self.transform(tv_tensors.Image(pil_to_tensor(image)), tv_tensors.Mask(pil_to_tensor(mask)))


def anchor_loader(data, args):
    from torch.utils.data import DataLoader

    dataset = PilPairs(data["table"], crop_and_flip())
    return DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )


def feedline_manifest(data, args):
    from peer_loaders import feedline_loader

    from feedline.datasets import ManifestSource

    source = ManifestSource(
        data["table"],
        fields={
            "image": {"column": "image", "kind": "image"},
            "mask": {"column": "mask", "kind": "mask", "classes": CLASSES},
        },
        target="mask",
        val_fraction=0,
        cache_dir=data["cache"],
    )
    return feedline_loader(source, args)


def litdata_loader(data, args):
    import litdata
    from torchvision import tv_tensors

    transform = crop_and_flip()

    class Pairs(litdata.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            image, mask = decode_jpeg(item["image"]), decode_mask(item["mask"])
            return transform(tv_tensors.Image(image), tv_tensors.Mask(mask))

    dataset = Pairs(data["litdata"], shuffle=True)
    return litdata.StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)


# name: (format, requirement, build(data, args)), as peers.LOADERS
LOADERS = {
    ANCHOR: ("JPEG + PNG files", None, anchor_loader),
    OURS: ("JPEG + PNG files", None, feedline_manifest),
    LITDATA: ("LitData chunks", "litdata", litdata_loader),
}


# -- the run ---------------------------------------------------------------------------------------------
def prepare(args, names) -> dict:
    table = ensure_table(args.data_dir, args.images)
    data = {"table": table, "cache": os.path.join(args.data_dir, "cache")}
    if LITDATA in names:
        data["litdata"] = ensure_litdata(table)
    return data


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per loader measured (``peers.summarise``: medians, the min-max), with its CPU against the anchor's."""
    rows = [peers.summarise(name, found, LOADERS) for name, found in runs.items()]
    anchor = next((row["cpu_ms"] for row in rows if row["loader"] == ANCHOR), None)
    for row in rows:
        row["vs_anchor"] = cpu_clock.cpu_ratio(row["cpu_ms"], anchor)
    return rows


def met(rows: list[dict]) -> bool | None:
    """Whether feedline's row meets the target; None where a CPU figure is missing (no ratio)."""
    ratio = next(row["vs_anchor"] for row in rows if row["loader"] == OURS)
    return None if ratio is None else ratio <= TARGET


def verdict(rows: list[dict]) -> list[str]:
    """The target, judged on this run's medians; no verdict where a CPU figure is missing."""
    ratio = next(row["vs_anchor"] for row in rows if row["loader"] == OURS)
    if ratio is None:
        return [
            "CPU time under the clock's resolution (0.00 ms per sample): no ratio and no verdict; "
            "run with more --images"
        ]
    verdict = "yes" if met(rows) else "no"
    return [f"feedline CPU per sample {ratio:.2f}x the anchor's (target <= {TARGET:.2f}x): met: {verdict}"]


def print_table(rows: list[dict], missing: list[str]) -> None:
    print("| row | CPU-ms per sample, median (min-max) | samples/s | CPU vs anchor |")
    print("|---|---:|---:|---:|")
    for row in rows:
        low, high = row["cpu_ms_range"]
        against = f"{row['vs_anchor']:.2f}x" if row["vs_anchor"] else ""
        print(
            f"| {row['loader']} | {row['cpu_ms']:.2f} ({low:.2f}-{high:.2f}) | {row['images_per_s']:.0f} "
            f"| {against} |"
        )
    for name in missing:
        print(f"| {name} | not installed (pip install litdata) | | |")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--batches", type=int, default=0, help="batches measured per run (0: the rest of one epoch)"
    )
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        peers.report_and_exit(peers.child(args.child, args, LOADERS))

    if not args.batches:  # the rest of one epoch, after the two warm-up batches, workers still alive
        args.batches = max(1, args.images // args.batch_size - 4)
    if args.images // args.batch_size < args.batches + 3:
        parser.error(
            f"--images {args.images} at --batch-size {args.batch_size} make {args.images // args.batch_size} "
            f"batches: fewer than the 2 warm-up, --batches {args.batches} and one to spare; give more --images"
        )
    names = [n for n in LOADERS if peers.installed(LOADERS[n][1])]
    missing = [n for n in LOADERS if n not in names]
    data = prepare(args, names)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:  # alternating, each in a fresh process
            arguments = ["--child", name, *peers.child_arguments(data, args)]
            runs[name].append(peers.in_overlay(None, arguments, what=name, script=__file__))

    rows = summarise(runs)
    print(
        f"{args.images} JPEG + palette PNG pairs (about 500x375, {len(CLASSES)} classes), decode both, "
        f"RandomResizedCrop 224 + flip on both, batch {args.batch_size}, {args.workers} workers; median of "
        f"{args.rounds} fresh-process runs; versions: {peers.versions()}\n"
    )
    print_table(rows, missing)
    lines = verdict(rows)
    for line in lines:
        print(line)
    result = {
        "args": {k: v for k, v in vars(args).items() if k not in ("data", "child")},
        "rows": rows,
        "target": {"feedline_vs_anchor_at_most": TARGET, "met": met(rows)},
        "verdict": lines,
        "versions": peers.versions(),
    }
    from feedline.diagnostics.results import write_json

    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

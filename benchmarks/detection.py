"""COCO-style detection loading as users write it today, against feedline, in CPU time per sample; and each
loader's worker memory as the annotation file grows.

    python benchmarks/detection.py [--images 2000] [--annotations 100000] [--rounds 3] [--workers 2]
                                   [--batch-size 32] [--batches N] [--data-dir DIR] [--json results.json]

Data (``detection_data.py``, made once under ``--data-dir``): the JPEG photos of ``throughput.py`` (about
500x375) in one folder with a COCO instances JSON (1-8 boxes per image, 5 categories with COCO's sparse ids,
every tenth image without a box), the same samples as feedline shards (``convert.py``, LitData's chunk format),
and a second JSON over the same images with ``--annotations`` boxes.

Work, for every row: read and decode the image, RandomResizedCrop(320, scale 0.3-1) and a horizontal flip
moving its boxes, the degenerate boxes dropped with their labels (SanitizeBoundingBoxes), and batches of
``--batch-size`` from ``--workers`` worker processes, as lists of detection targets.

Rows: the anchor, torchvision's ``CocoDetection`` wrapped by ``wrap_dataset_for_transforms_v2`` (PIL decode; the
targets torchvision's detection references use) through a ``DataLoader`` with their ``tuple(zip(*batch))``
collate; feedline's ``coco`` source and its shards of the same data through ``ImageLoaders`` and
``collate=detection``; LitData's ``StreamingDataset`` on those shards (its dict samples decoded with
torchvision and transformed as the anchor does).

Each measurement runs in a fresh process (``peers.child``); rows alternate within a round; after two warm-up
batches the process tree's CPU time and the wall time are taken over ``--batches`` batches. The table gives
medians over ``--rounds`` with the min-max, and CPU per sample against the anchor's. Targets: feedline's
CPU per sample at 0.5x the anchor's or less; at or below LitData's.

Worker memory: the anchor and feedline's coco source each load the small and the large JSON, with forked and
with spawned workers, read two batches, and report each worker's unique memory (USS); feedline's must not grow
with the annotation count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_clock  # noqa: E402 - standard library only
import peers  # noqa: E402 - standard library only at module level
from detection_data import CATEGORIES, ensure_coco, ensure_shards  # noqa: E402

ANCHOR = "torchvision CocoDetection + v2 wrapper, DataLoader"
OURS = "feedline coco, ImageLoaders"
SHARDS = "feedline shards, ImageLoaders"
LITDATA = "LitData dict samples (same shards), StreamingDataLoader"
TARGET = 0.5  # feedline's CPU per sample, at most this share of the anchor's
SIZE = 320


def train_stack(feedline: bool):
    from torchvision.transforms import v2

    if feedline:  # transforms=detection's train stack
        from feedline.transforms import RandomResizedCrop, SanitizeBoxes

        return [
            RandomResizedCrop(SIZE, scale=(0.3, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            SanitizeBoxes(),
        ]
    crop = v2.RandomResizedCrop(SIZE, scale=(0.3, 1.0), antialias=True)
    return [crop, v2.RandomHorizontalFlip(), v2.SanitizeBoundingBoxes()]


def pairs(batch):
    return tuple(zip(*batch))  # torchvision's detection references' collate


# -- rows: each build(data, args) -> an iterable of batches, images first -------------------------------------
def anchor_loader(data, args, annotations: str | None = None, context: str | None = None):
    from torch.utils.data import DataLoader
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2

    stack = v2.Compose([v2.PILToTensor(), *train_stack(False)])
    dataset = CocoDetection(data["images"], annotations or data["json"], transforms=stack)
    # torchvision's references drop images without boxes for training: the wrapper gives those no "boxes" and
    # "labels" keys, which SanitizeBoundingBoxes refuses
    dataset.ids = [i for i in dataset.ids if dataset.coco.getAnnIds(imgIds=i)]
    dataset = wrap_dataset_for_transforms_v2(dataset, target_keys={"image_id", "boxes", "labels"})
    return DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        collate_fn=pairs,
        persistent_workers=args.workers > 0,
        multiprocessing_context=context if args.workers else None,
    )


def feedline_loaders(source, args, context: str | None = None):
    import torch
    from torchvision.transforms import v2

    from feedline.datamodules.loaders import ImageLoaders
    from feedline.transforms import DetectionCollate, TransformStacks

    stacks = TransformStacks(train=train_stack(True), batch=[v2.ToDtype(torch.float32, scale=True)])
    return ImageLoaders(
        source,
        stacks,
        DetectionCollate(),
        batch_size=args.batch_size,
        num_workers=args.workers,
        multiprocessing_context=context if args.workers else None,
    )


def feedline_coco(data, args, annotations: str | None = None, context: str | None = None):
    from feedline.datasets.coco.source import CocoSource

    source = CocoSource(annotations or data["json"], data["images"], val_fraction=0, cache_dir=data["cache"])
    return feedline_loaders(source, args, context).train_dataloader()


def feedline_shards(data, args):
    from feedline.datasets.shards.source import ShardsSource

    return feedline_loaders(ShardsSource(data["shards"], val_fraction=0), args).train_dataloader()


def litdata_loader(data, args):
    import litdata
    import torch
    from torchvision import tv_tensors
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2

    transform = v2.Compose(train_stack(False))

    class Dicts(litdata.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            image = item["image"]
            raw = torch.frombuffer(bytearray(image), dtype=torch.uint8) if isinstance(image, bytes) else None
            raw = torch.as_tensor(image, dtype=torch.uint8) if raw is None else raw
            image = tv_tensors.Image(decode_jpeg(raw, mode=ImageReadMode.RGB))
            objects = item["objects"]
            boxes = tv_tensors.BoundingBoxes(
                torch.as_tensor(objects["boxes"]), format="XYXY", canvas_size=tuple(image.shape[-2:])
            )
            target = {"boxes": boxes, "labels": torch.as_tensor(objects["labels"])}
            return transform(image, target)

    dataset = Dicts(data["shards"], shuffle=True)
    return litdata.StreamingDataLoader(
        dataset, batch_size=args.batch_size, num_workers=args.workers, collate_fn=pairs
    )


# name: (format, requirement, build(data, args)), as peers.LOADERS
LOADERS = {
    ANCHOR: ("JPEG files + COCO JSON", None, anchor_loader),
    OURS: ("JPEG files + COCO JSON", None, feedline_coco),
    SHARDS: ("feedline shards", None, feedline_shards),
    LITDATA: ("feedline shards (LitData chunks)", "litdata", litdata_loader),
}
MEMORY = {ANCHOR: anchor_loader, OURS: feedline_coco}


CONTEXTS = ("fork", "spawn")  # Linux's default start method, and macOS's, Windows' and many launchers'


def worker_memory(name: str, args) -> dict:
    """In this (fresh) process: loader ``name`` on the small and on the large JSON, with workers started by each
    of ``CONTEXTS``, two batches each, and each worker's unique memory (USS, MB) then: the median over workers.
    A forked worker shares its parent's pages until it writes them; a spawned one unpickles its own dataset."""
    import statistics

    import psutil

    data = json.loads(args.data)
    out = {}
    for context in CONTEXTS:
        for which in ("json", "large"):
            loader = MEMORY[name](data, args, data[which], context)
            batches = iter(loader)
            for _ in range(2):
                next(batches)
            workers = psutil.Process().children(recursive=True)
            uss = [w.memory_full_info().uss / 2**20 for w in workers if w.is_running()]
            out[f"{context} {which}"] = statistics.median(uss) if uss else None
            del batches, loader
    return out


# -- the run ---------------------------------------------------------------------------------------------
def prepare(args, names) -> dict:
    coco = ensure_coco(args.data_dir, args.images, args.annotations)
    data = {**coco, "cache": os.path.join(args.data_dir, "cache")}
    if SHARDS in names or LITDATA in names:
        data["shards"] = ensure_shards(args.data_dir, coco)
    return data


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    rows = [peers.summarise(name, found, LOADERS) for name, found in runs.items()]
    anchor = next((row["cpu_ms"] for row in rows if row["loader"] == ANCHOR), None)
    litdata = next((row["cpu_ms"] for row in rows if row["loader"] == LITDATA), None)
    for row in rows:
        row["vs_anchor"] = cpu_clock.cpu_ratio(row["cpu_ms"], anchor)
        row["vs_litdata"] = cpu_clock.cpu_ratio(row["cpu_ms"], litdata) if litdata else None
    return rows


def verdict(rows: list[dict]) -> tuple[list[str], dict]:
    """The targets, judged on this run's medians, for each feedline row; none where a figure is missing."""
    lines, met = [], {}
    for row in rows:
        if row["loader"] not in (OURS, SHARDS):
            continue
        ratio = row["vs_anchor"]
        if ratio is None:
            lines.append(
                f"{row['loader']}: CPU under the clock's resolution, no verdict; run with more --images"
            )
            continue
        met[f"{row['loader']} vs anchor"] = ratio <= TARGET
        lines.append(
            f"{row['loader']}: CPU per sample {ratio:.2f}x the anchor's (target <= {TARGET:.2f}x): "
            f"met: {'yes' if ratio <= TARGET else 'no'}"
        )
        if row["vs_litdata"] is not None:
            met[f"{row['loader']} vs LitData"] = row["vs_litdata"] <= 1.0
            lines.append(
                f"{row['loader']}: CPU per sample {row['vs_litdata']:.2f}x LitData's (target <= 1.00x): "
                f"met: {'yes' if row['vs_litdata'] <= 1.0 else 'no'}"
            )
    return lines, met


def print_table(rows: list[dict], missing: list[str]) -> None:
    print("| row | CPU-ms per sample, median (min-max) | samples/s | CPU vs anchor | CPU vs LitData |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        low, high = row["cpu_ms_range"]
        against = f"{row['vs_anchor']:.2f}x" if row["vs_anchor"] else ""
        lit = f"{row['vs_litdata']:.2f}x" if row["vs_litdata"] else ""
        print(
            f"| {row['loader']} | {row['cpu_ms']:.2f} ({low:.2f}-{high:.2f}) | {row['images_per_s']:.0f} "
            f"| {against} | {lit} |"
        )
    for name in missing:
        print(f"| {name} | not installed (pip install litdata) | | | |")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument(
        "--annotations", type=int, default=100_000, help="boxes in the large JSON (0: no rows)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--batches", type=int, default=0, help="batches measured per run (0: most of an epoch)"
    )
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--memory", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        peers.report_and_exit(peers.child(args.child, args, LOADERS))
    if args.memory:
        peers.report_and_exit(worker_memory(args.memory, args))

    if not args.batches:
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
    memory = {}
    if args.annotations:
        for name in MEMORY:
            arguments = ["--memory", name, *peers.child_arguments(data, args)]
            memory[name] = peers.in_overlay(None, arguments, what=f"{name} memory", script=__file__)

    rows = summarise(runs)
    print(
        f"{args.images} JPEGs (about 500x375) with a COCO JSON of 1-8 boxes each over {len(CATEGORIES)} "
        f"categories, decode, RandomResizedCrop {SIZE} + flip moving the boxes, sanitize, batch "
        f"{args.batch_size}, {args.workers} workers; median of {args.rounds} fresh-process runs; versions: "
        f"{peers.versions()}\n"
    )
    print_table(rows, missing)
    lines, met = verdict(rows)
    if memory:
        print(
            f"\n| worker memory (USS, MB, median over workers) | workers | small JSON | {args.annotations:,} boxes "
            "| growth |"
        )
        print("|---|---|---:|---:|---:|")
        for name, found in memory.items():
            for context in CONTEXTS:
                small, large = found[f"{context} json"], found[f"{context} large"]
                print(f"| {name} | {context} | {small:.0f} | {large:.0f} | {large - small:+.0f} |")
        for context in CONTEXTS:
            grows = {n: m[f"{context} large"] - m[f"{context} json"] for n, m in memory.items()}
            flat = grows[OURS] < 8.0  # MB: the allocator's and page cache's noise, not the annotations
            met[f"feedline worker memory flat ({context})"] = flat
            lines.append(
                f"worker memory growth with {args.annotations:,} boxes, {context}ed workers: feedline "
                f"{grows[OURS]:+.0f} MB, anchor {grows[ANCHOR]:+.0f} MB: feedline flat: {'yes' if flat else 'no'}"
            )
    print()
    for line in lines:
        print(line)
    result = {
        "args": {k: v for k, v in vars(args).items() if k not in ("data", "child", "memory")},
        "rows": rows,
        "memory_mb": memory,
        "targets": {"feedline_vs_anchor_at_most": TARGET, "feedline_vs_litdata_at_most": 1.0, "met": met},
        "verdict": lines,
        "versions": peers.versions(),
    }
    from feedline.diagnostics.results import write_json

    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

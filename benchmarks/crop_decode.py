"""Crop-window JPEG decode: the single-thread kernel, large photos through the loaders, and the DCT scale's error.

    python benchmarks/crop_decode.py [--images 3000] [--large 48] [--large-side 4000] [--rounds 3]
                                     [--workers 2] [--batch-size 16] [--passes 4] [--draws 300]
                                     [--margin 2] [--sections kernel,large,tolerance] [--json results.json]
    python benchmarks/crop_decode.py --quick        # a smoke run: every section on tiny data, one round

kernel: one thread (``torch.set_num_threads(1)``), no loader, CPU time per image (``time.process_time``) on the
JPEG tree of ``throughput.py`` (about 500x375, read into memory first). Rows: torchvision's ``decode_jpeg`` of the
whole image + v2 RandomResizedCrop(224) + flip (the anchor); feedline's ``SampleDataset`` with the window decode
off (decode whole, ``DeferredCrop``, the crop resized into a preallocated batch as ``Uint8Collate`` does); the same
with the window decode on (the crop drawn from the header, only its window decoded). Every row draws from the same
per-image seeds, so each decodes and resizes the same crops.

large: held-out camera-sized photos (``crop_decode_data.py``, 4000x3000, quality 90, 4:2:0) through real
loaders, batch ``--batch-size``, ``--workers`` workers, ``--passes`` epochs: torchvision's ``ImageFolder``
(``decode_jpeg`` loader) + v2 RandomResizedCrop(224) + flip in a ``DataLoader`` (the anchor), and feedline's
``ImageLoaders`` on a ``FolderSource`` with the `imagenet` train stack and ``collate=uint8``: window decode off
and reduced decode off; window off, reduced on (the default before the window decode); window on, reduced on
(the default). Each measurement runs in a fresh process (``peers.child``): after two warm-up batches the CPU time
of the process tree (``cpu_clock.py``). Target: the window decode at 3x the anchor or more.

tolerance: on the large photos, ``--draws`` crops (224x224) decoded from the window at the DCT scale that
``CropFirst.scale`` picks (1/2, 1/4, 1/8: the window keeps ``--margin`` times the output on both sides) against
the same crop from the unscaled window: mean and maximum absolute difference, and the lowest PSNR, per scale;
and the unscaled window's crops against torchvision's whole decode + the same crop and resize: mismatches,
which must be 0.

Rows alternate within a round; tables give the median over ``--rounds`` with the min-max, and speedups against
the anchor (the anchor's CPU per image over the row's).

JSON (``--json``): ``machine`` (CPU model, cores, torch and torchvision versions, the libjpeg API level and the
libjpeg files loaded), ``args``, and one key per section run. ``kernel`` and ``large``: ``rows``, each with
``cpu_ms_runs`` (one per round), ``cpu_ms`` (their median), ``cpu_ms_range`` (min, max), ``speedup`` (against
``anchor``) and ``vs_window_off``; ``large`` also each run's raw measurement (``runs``), the photos'
``mean_file_mb`` and the ``target``'s verdict. ``tolerance``: ``draws_at_scale`` (how many draws
``CropFirst.scale`` sent to each scale), ``scales`` ("2", "4", "8": draws, mean and maximum absolute difference,
lowest PSNR) and ``unscaled_vs_torchvision`` (compared, mismatches).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_clock  # noqa: E402 - standard library only
import peers  # noqa: E402 - standard library only at module level
from crop_decode_data import ensure_large  # noqa: E402

SECTIONS = ("kernel", "large", "tolerance")
KERNEL_ANCHOR = "torchvision decode_jpeg + v2 RandomResizedCrop + flip"
KERNEL_OFF = "feedline, window decode off"
KERNEL_ON = "feedline, window decode on"
LARGE_ANCHOR = "torchvision ImageFolder (decode_jpeg) + v2 RRC + flip, DataLoader"
LARGE_OFF = "feedline, window off, reduced off"
LARGE_REDUCED = "feedline, window off, reduced on"
LARGE_ON = "feedline, window on, reduced on"
TARGET = 3.0  # the large photos: the window decode's speedup over the anchor, at least
SIZE = 224
QUICK = {"images": 24, "large": 4, "large_side": 1600, "rounds": 1, "batch_size": 2, "passes": 3, "draws": 8}


# -- kernel: one thread, no loader ---------------------------------------------------------------------------
def kernel_payloads(args) -> list:
    """The JPEG tree's files as (uint8 array, label), read once: the kernel times no I/O."""
    import numpy as np
    from peer_work import samples
    from throughput import ensure_jpeg_tree

    tree = ensure_jpeg_tree(args.data_dir, args.images)
    return [(np.fromfile(path, dtype=np.uint8), label) for path, label in samples(tree)]


def imagenet_train():
    """The `imagenet` preset's train stack, as feedline ships it."""
    from torchvision.transforms import v2

    from feedline.transforms import RandomHorizontalFlip, RandomResizedCrop

    return v2.Compose([RandomResizedCrop(SIZE, antialias=True), RandomHorizontalFlip()])


def kernel_rows(payloads) -> dict:
    """name -> run(seeds): each row's work on every image, image k drawn from ``seeds[k]``."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2

    from feedline.datamodules.samples import SampleDataset
    from feedline.transforms.deferred import defer_crop

    anchor = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])
    tensors = [torch.from_numpy(array) for array, _ in payloads]
    batch = torch.empty((128, SIZE, SIZE, 3), dtype=torch.uint8).permute(0, 3, 1, 2)  # Uint8Collate's layout

    def torchvision_row(seeds):
        for data, seed in zip(tensors, seeds):
            torch.default_generator.manual_seed(seed)
            anchor(decode_jpeg(data, mode=ImageReadMode.RGB))

    def feedline_row(window: bool):
        dataset = SampleDataset(payloads, defer_crop(imagenet_train()), window_decode=window)

        def run(seeds):
            for k, seed in enumerate(seeds):
                pending, _ = dataset[(k, seed)]
                pending.write_into(batch[k % len(batch)])

        return run

    return {KERNEL_ANCHOR: torchvision_row, KERNEL_OFF: feedline_row(False), KERNEL_ON: feedline_row(True)}


def kernel(args) -> dict:
    import torch

    torch.set_num_threads(1)  # one core, as one DataLoader worker has
    payloads = kernel_payloads(args)
    rows = kernel_rows(payloads)
    seeds = [1_000_003 * k + 17 for k in range(len(payloads))]
    for run in rows.values():  # warm-up: first calls, allocator, caches
        run(seeds[: min(len(seeds), 32)])
    ms: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(args.rounds):
        names = list(rows)[r % len(rows) :] + list(rows)[: r % len(rows)]  # each row first in turn
        for name in names:
            start = time.process_time()
            rows[name](seeds)
            ms[name].append(1000 * (time.process_time() - start) / len(payloads))
    found = [row(name, values) for name, values in ms.items()]
    speedups(found, KERNEL_ANCHOR, KERNEL_OFF)
    return {"images": len(payloads), "threads": 1, "anchor": KERNEL_ANCHOR, "rows": found}


def row(name: str, cpu_ms: list[float]) -> dict:
    return {
        "row": name,
        "cpu_ms_runs": cpu_ms,
        "cpu_ms": statistics.median(cpu_ms),
        "cpu_ms_range": [min(cpu_ms), max(cpu_ms)],
    }


def speedups(rows: list[dict], anchor: str, window_off: str) -> None:
    """Each row's speedup against the anchor and against feedline with the window decode off: their CPU per
    image over the row's (None where a figure is missing)."""
    cpu = {r["row"]: r["cpu_ms"] for r in rows}
    for r in rows:
        r["speedup"] = cpu_clock.cpu_ratio(cpu.get(anchor), r["cpu_ms"])
        r["vs_window_off"] = cpu_clock.cpu_ratio(cpu.get(window_off), r["cpu_ms"])


# -- large photos: real loaders, fresh processes -------------------------------------------------------------
class Passes:
    """``passes`` epochs of ``loader`` in a row (each a new epoch of feedline's sampler), as one iterable."""

    def __init__(self, loader, passes: int):
        self.loader, self.passes = loader, passes

    def __iter__(self):
        sampler = getattr(self.loader, "sampler", None)
        for epoch in range(self.passes):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            yield from self.loader


def read_jpeg(path: str):
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def torchvision_large(data, args):
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    stack = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])
    dataset = ImageFolder(data["large"], loader=read_jpeg, transform=stack)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    return Passes(loader, args.passes)


def feedline_large(window: bool, reduced: bool):
    def build(data, args):
        from feedline.datamodules.loaders import ImageLoaders
        from feedline.datasets.folder.source import FolderSource
        from feedline.transforms import TransformStacks, Uint8Collate

        source = FolderSource(data["large"], val_fraction=0, cache_dir=data["cache"])
        loaders = ImageLoaders(
            source,
            TransformStacks(train=list(imagenet_train().transforms)),
            Uint8Collate(),
            batch_size=args.batch_size,
            num_workers=args.workers,
            reduced_decode=reduced,
            window_decode=window,
        )
        return Passes(loaders.train_dataloader(), args.passes)

    return build


# name: (format, requirement, build(data, args)), as peers.LOADERS
LOADERS = {
    LARGE_ANCHOR: ("large JPEGs", None, torchvision_large),
    LARGE_OFF: ("large JPEGs", None, feedline_large(False, False)),
    LARGE_REDUCED: ("large JPEGs", None, feedline_large(False, True)),
    LARGE_ON: ("large JPEGs", None, feedline_large(True, True)),
}


def large(args, tree: str) -> dict:
    data = {"large": tree, "cache": os.path.join(args.data_dir, "cache")}
    arguments = [*peers.child_arguments(data, args), "--passes", str(args.passes)]
    runs: dict[str, list[dict]] = {name: [] for name in LOADERS}
    for r in range(args.rounds):
        names = list(LOADERS)[r % len(LOADERS) :] + list(LOADERS)[: r % len(LOADERS)]
        for name in names:
            runs[name].append(measure_large(name, data, arguments, args))
    rows = []
    for name, found in runs.items():
        summary = row(name, [1000 * r["cpu_seconds"] / r["images"] for r in found])
        summary["images_per_s"] = statistics.median(r["images"] / r["seconds"] for r in found)
        summary["runs"] = found
        rows.append(summary)
    speedups(rows, LARGE_ANCHOR, LARGE_REDUCED)
    ours = next(r["speedup"] for r in rows if r["row"] == LARGE_ON)
    target = {
        "row": LARGE_ON,
        "target": f">= {TARGET:g}x the anchor",
        "met": None if ours is None else ours >= TARGET,
    }
    return {
        "images": args.large,
        "side": args.large_side,
        "mean_file_mb": mean_file_mb(tree),
        "anchor": LARGE_ANCHOR,
        "rows": rows,
        "target": target,
    }


def mean_file_mb(tree: str) -> float:
    """The photos' mean file size: how much entropy-coded data every decode walks, the window's too."""
    from peer_work import samples

    sizes = [os.path.getsize(path) for path, _ in samples(tree)]
    return sum(sizes) / len(sizes) / 1e6


def measure_large(name: str, data: dict, arguments: list[str], args) -> dict:
    """One measurement of loader ``name``, in a fresh process; under ``--quick`` (a smoke run, no figures) in
    this one, which spares each row the interpreter's and torch's start."""
    if args.quick:
        args.data = json.dumps(data)
        return peers.child(name, args, LOADERS)
    return peers.in_overlay(None, ["--child", name, *arguments], what=name, script=__file__)


# -- tolerance: the DCT-scaled windows' pixels ----------------------------------------------------------------
def tolerance(args, tree: str) -> dict:
    """Per image (decoded whole once) and per draw (seeded): the unscaled window's crop against torchvision's,
    and the crop from the window at ``CropFirst.scale``'s DCT scale against the unscaled window's."""
    import numpy as np
    import torch
    from peer_work import samples
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2

    from feedline.transforms import RandomResizedCrop, window
    from feedline.transforms.jpeg_window import available, decode_drawn

    if not available():
        return {"skipped": "the crop-window decoder is not built"}
    window.MARGIN = args.margin  # read by CropFirst.scale at each call
    stack = window.CropFirst([RandomResizedCrop(SIZE, antialias=True)])
    reference = v2.RandomResizedCrop(SIZE, antialias=True)
    files = samples(tree)
    errors: dict[int, list[tuple[float, int, float]]] = {d: [] for d in (1, *window.SCALES)}
    mismatches = 0
    for j, (path, _) in enumerate(files):
        array = np.fromfile(path, dtype=np.uint8)
        whole = decode_jpeg(torch.from_numpy(array), mode=ImageReadMode.RGB)
        for draw in range(j, args.draws, len(files)):
            torch.default_generator.manual_seed(draw)
            unscaled = decode_drawn(array, stack, False, None)
            exact = stack.finish(unscaled)
            torch.default_generator.manual_seed(draw)
            mismatches += not torch.equal(exact, reference(whole))
            denom = stack.scale(unscaled.box)
            if denom == 1:  # the reduced path decodes this window unscaled too: counted, not compared
                errors[1].append((0.0, 0, math.inf))
                continue
            torch.default_generator.manual_seed(draw)
            errors[denom].append(difference(stack.finish(decode_drawn(array, stack, True, None)), exact))
    scales = {str(d): scale_stats(found) for d, found in errors.items() if d != 1}
    return {
        "draws": args.draws,
        "margin": args.margin,
        "draws_at_scale": {str(d): len(found) for d, found in sorted(errors.items())},
        "scales": scales,
        "unscaled_vs_torchvision": {"compared": args.draws, "mismatches": mismatches},
    }


def difference(crop, exact) -> tuple[float, int, float]:
    """(mean absolute difference, maximum absolute difference, PSNR in dB; inf where equal)."""
    diff = crop.int() - exact.int()
    mse = float((diff * diff).float().mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(255**2 / mse)
    return float(diff.abs().float().mean()), int(diff.abs().max()), psnr


def scale_stats(found: list[tuple[float, int, float]]) -> dict:
    if not found:
        return {"draws": 0, "mean_abs_diff": None, "max_abs_diff": None, "min_psnr_db": None}
    low = min(p for _, _, p in found)
    return {
        "draws": len(found),
        "mean_abs_diff": statistics.fmean(m for m, _, _ in found),
        "max_abs_diff": max(m for _, m, _ in found),
        "min_psnr_db": None if math.isinf(low) else low,  # None: every crop equal
    }


# -- the run ---------------------------------------------------------------------------------------------
def machine() -> dict:
    from importlib.metadata import version

    from feedline.transforms.jpeg_window import _native, available

    model = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "torch": version("torch"),
        "torchvision": version("torchvision"),
        "window_decoder_built": available(),
        "libjpeg_version": getattr(_native, "LIBJPEG_VERSION", None),  # the API level (62: libjpeg 6b's)
        "libjpeg_loaded": loaded("libjpeg"),  # which libjpeg files: the extension's and torchvision's own
    }


def loaded(name: str) -> list[str]:
    """The shared libraries of this process whose file name starts with ``name`` (Linux; else empty)."""
    if not os.path.exists("/proc/self/maps"):
        return []
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    return sorted(p for p in paths if os.path.basename(p).startswith(name))


def print_times(title: str, rows: list[dict], rounds: int) -> None:
    print(f"\n{title}; CPU-ms per image, median of {rounds} (min-max)\n")
    print("| row | CPU-ms/image (min-max) | speedup vs anchor | vs window off |\n|---|---:|---:|---:|")
    for r in rows:
        low, high = r["cpu_ms_range"]
        cells = [f"{r[k]:.2f}x" if r[k] else "" for k in ("speedup", "vs_window_off")]
        print(f"| {r['row']} | {r['cpu_ms']:.2f} ({low:.2f}-{high:.2f}) | {cells[0]} | {cells[1]} |")


def print_tolerance(found: dict) -> None:
    if "skipped" in found:
        print(f"\ntolerance: skipped ({found['skipped']})")
        return
    print(
        f"\nDCT-scaled windows against the unscaled window, {found['draws']} crops of {SIZE}x{SIZE} (margin "
        f"{found['margin']}x the output); draws per scale: {found['draws_at_scale']}\n"
    )
    print("| scale | draws | mean abs diff | max abs diff | min PSNR (dB) |\n|---|---:|---:|---:|---:|")
    for denom, s in found["scales"].items():
        if s["draws"]:
            psnr = "inf" if s["min_psnr_db"] is None else f"{s['min_psnr_db']:.1f}"
            print(f"| 1/{denom} | {s['draws']} | {s['mean_abs_diff']:.3f} | {s['max_abs_diff']} | {psnr} |")
        else:
            print(f"| 1/{denom} | 0 | | | |")
    exact = found["unscaled_vs_torchvision"]
    print(
        f"\nunscaled window vs torchvision's whole decode + crop: {exact['mismatches']} of {exact['compared']} differ"
    )


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000, help="JPEGs of the kernel's tree (about 500x375)")
    parser.add_argument("--large", type=int, default=48, help="large photos")
    parser.add_argument("--large-side", type=int, default=4000, help="their long side (the short: 3/4 of it)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--passes", type=int, default=4, help="epochs over the large photos per measurement")
    parser.add_argument("--batches", type=int, default=0, help="large: batches measured (0: all but 4)")
    parser.add_argument("--draws", type=int, default=300, help="tolerance: crops compared")
    parser.add_argument(
        "--margin", type=int, default=None, help="tolerance: CropFirst's MARGIN (default: its own)"
    )
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data, one round, the large rows in this process: a smoke run, not figures",
    )
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(
            f"--sections: no section {', '.join(map(repr, unknown))}; the sections are {', '.join(SECTIONS)}"
        )
    args.sections = sections
    if args.margin is None:
        from feedline.transforms.window import MARGIN

        args.margin = MARGIN
    total = args.passes * (args.large // args.batch_size)
    args.batches = args.batches or total - 4
    if "large" in sections and not args.child and (args.batches < 1 or args.batches + 3 > total):
        parser.error(
            f"--large {args.large} at --batch-size {args.batch_size} over --passes {args.passes} make {total} "
            f"batches: fewer than the 2 warm-up, --batches {args.batches} and one to spare; give more --passes"
        )
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.child:
        peers.report_and_exit(peers.child(args.child, args, LOADERS))
    result = {
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k not in ("child", "data")},
    }
    if "kernel" in args.sections:
        result["kernel"] = kernel(args)
        print_times(
            f"kernel: {args.images} JPEGs (about 500x375), one thread", result["kernel"]["rows"], args.rounds
        )
    tree = (
        ensure_large(args.data_dir, args.large, args.large_side)
        if {"large", "tolerance"} & set(args.sections)
        else None
    )
    if "large" in args.sections:
        result["large"] = large(args, tree)
        side = f"{args.large_side}x{args.large_side * 3 // 4}"
        print_times(
            f"large photos: {args.large} JPEGs of {side}, batch {args.batch_size}, {args.workers} workers, "
            f"{args.passes} passes, {'in this process (--quick)' if args.quick else 'fresh process per run'}",
            result["large"]["rows"],
            args.rounds,
        )
        target = result["large"]["target"]
        print(f"\ntarget: {target['row']} {target['target']}: met: {target['met']}")
    if "tolerance" in args.sections:
        result["tolerance"] = tolerance(args, tree)
        print_tolerance(result["tolerance"])
    print(f"\nmachine: {json.dumps(result['machine'])}")
    from feedline.diagnostics.results import write_json

    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

"""feedline beside the loaders its users would otherwise pick, on the same work, in CPU time per image.

    python benchmarks/peers.py [--images 3000] [--rounds 3] [--workers 2] [--batch-size 128]
                               [--loaders name,name] [--json results.json]

Work, for every loader: read, decode, RandomResizedCrop(224), horizontal flip, uint8 batches of
``--batch-size``, ``--workers`` worker processes. Data: the JPEG tree of ``throughput.py`` (about 500x375),
converted once into each loader's own format. Each measurement runs in a fresh process; loaders alternate
within a round; after two warm-up batches the process tree's CPU time (cpu_clock.py: the loader process and its
workers) and the wall time are taken over the rest of one epoch. CPU-ms per image is the figure to compare on a
shared machine (images/s swings with the neighbours, CPU time much less); the table reports medians with the
min-max and the ratio against the feedline row of the same format class.

Peers run when they are installed (``pip install .[peers]``: LitData, WebDataset; DALI, FFCV and Mosaic
Streaming when their wheels fit the environment) and are listed as "not installed" otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Nothing heavy at module level: a measurement's child process imports what its loader needs, and no more,
# so its start-up (from the process's start to the first batches) is that loader's own.
import cpu_clock  # noqa: E402 - standard library only
import peer_overlays  # noqa: E402 - standard library only
from peer_data import ensure_litdata, ensure_webdataset  # noqa: E402 - standard library only
from peer_loaders import (  # noqa: E402, F401 - tests and scaling.py read LOADERS, SCRIPTS, installed here
    ANCHOR,
    LOADERS,
    OURS,
    SCRIPTS,
    feedline_loaders,
    folder_source,
    imagefolder,
    installed,
    overlay_of,
)


# -- data, converted once per format ------------------------------------------------------------------------
def prepare(args, names=()) -> dict:
    from throughput import ensure_hdf5, ensure_jpeg_tree

    tree = ensure_jpeg_tree(args.data_dir, args.images)
    data = {"tree": tree}
    for peer in sorted({overlay_of(n) for n in names} & set(peer_overlays.CONVERTERS)):
        data.update(
            in_overlay(peer, ["--convert", peer, "--data", json.dumps(data), "--data-dir", args.data_dir])
        )
    data["cache"] = os.path.join(args.data_dir, "cache")
    data["max256"] = ensure_hdf5(tree, "max256", mode="encoded", max_side=256)
    data["rawmax256"] = ensure_hdf5(tree, "rawmax256", mode="raw", max_side=256)
    if installed("webdataset"):
        data["webdataset"] = ensure_webdataset(tree, args.data_dir)
    if installed("litdata"):
        data["litdata"] = ensure_litdata(tree, args.data_dir)
    return data


# -- one measurement, in a fresh process -------------------------------------------------------------------
def child(name: str, args, loaders: dict = LOADERS) -> dict:
    """Build loader ``name`` of ``loaders`` and time it, in this (fresh) process: the loader built and its
    first batch from the process's start, then images/s and the process tree's CPU time after two warm-up
    batches. Also ``benchmarks/shards.py``'s measurement."""
    import psutil

    from feedline.diagnostics.startup import process_start  # standard library only

    data = json.loads(args.data)
    started = process_start() or time.time()
    loader = loaders[name][2](data, args)
    ready = time.time() - started
    me = psutil.Process()

    def cpu() -> float:
        return cpu_clock.tree_seconds(me, reaped=True)  # a loader whose workers end with its epoch

    batches = iter(loader)
    count, first = 0, None
    for k, batch in enumerate(batches):
        if k == 0:
            first = time.time() - started
        if k == 2:  # warm-up over: workers running, caches filled
            third = time.time() - started
            wall, cpu_start = time.perf_counter(), cpu()
        elif k > 2:
            count += len(batch[0])
        if k == args.batches + 2:
            break
    seconds, cpu_seconds = time.perf_counter() - wall, cpu() - cpu_start
    return {
        "images": count,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "ready_s": ready,  # loader built: interpreter, imports, index
        "first_batch_s": first,
        "third_batch_s": third,
    }


def report_and_exit(measured: dict) -> None:
    """Print a child's measurement, stop its workers now (left alone, they would go on decoding their
    prefetched batches beside the next measurement) and end without tearing the loader down (FFCV aborts
    the interpreter when its threads are still running at exit)."""
    import signal

    import psutil

    print(json.dumps(measured), flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would raise for the killed workers
    workers = psutil.Process().children(recursive=True)
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
    psutil.wait_procs(workers, timeout=10)
    os._exit(0)


def measure_train(data: dict, args) -> dict:
    """feedline's train.py on the same tree and work, for its start-up alone: one optimizer step, the
    first batch's time (from the process's start) read from the run's summary."""
    out = os.path.join(args.data_dir, "train-startup")
    shutil.rmtree(out, ignore_errors=True)  # each round a fresh run: train.py refuses one over checkpoints
    command = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "source=folder",
        f"source.root={data['tree']}",
        f"paths.cache_dir={data['cache']}",
        f"paths.output_dir={out}",
        f"hydra.run.dir={out}",
        "transforms=imagenet",
        "collate=uint8",
        f"data.batch_size={args.batch_size}",
        f"data.num_workers={args.workers}",
        "+trainer.max_steps=1",
        "trainer.limit_val_batches=0",
        "logger=none",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"train.py failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        return {"first_batch_s": json.load(f)["first_batch_s"]}


def lightning_script(data: dict, args, feedline: bool = False) -> dict:
    """One optimizer step of train.py's default model in a plain Lightning script (no Hydra, no callbacks of
    train.py's), fed by ImageFolder + DataLoader (the `ImageFolder + PIL` row's loader: train.py's start-up
    anchor) or, with ``feedline``, by feedline's ``ImageDataModule`` on the same work, as a user's own
    Lightning project would use it. Runs in the child; returns when the first batch reached the Trainer,
    from the process's start."""
    from feedline.diagnostics.startup import process_start  # standard library only

    started = process_start() or time.time()
    import functools

    import lightning as L

    from feedline.models.classifier import ImageClassifier
    from feedline.models.nets import SmallCNN

    class FirstBatch(L.Callback):
        seconds = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.seconds is None:
                self.seconds = time.time() - started

    if feedline:
        datamodule = feedline_loaders(folder_source(data), args, lightning=True)
        loader, classes = None, datamodule.num_classes
    else:
        datamodule, loader = None, imagefolder(data, args)
        classes = len(loader.dataset.classes)
    model = ImageClassifier(functools.partial(SmallCNN, width=32), num_classes=classes)
    clock = FirstBatch()
    trainer = L.Trainer(
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
        accelerator="cpu",
        default_root_dir=os.path.join(args.data_dir, "lightning-script"),
    )
    trainer.fit(model, train_dataloaders=loader, datamodule=datamodule)
    return {"first_batch_s": clock.seconds}


def measure(name: str, data: dict, args) -> dict:
    return in_overlay(overlay_of(name), ["--child", name, *child_arguments(data, args)], what=name)


def child_arguments(data: dict, args) -> list[str]:
    command = ["--data", json.dumps(data), "--workers", str(args.workers)]
    return command + ["--batch-size", str(args.batch_size), "--batches", str(args.batches)]


def in_overlay(peer: str | None, arguments: list[str], what: str = "", script: str = __file__) -> dict:
    """Run ``script`` (this one) with ``arguments`` in a fresh process (in ``peer``'s overlay, if any); its
    last line of output, as JSON."""
    env = peer_overlays.overlay_env(peer) if peer else None
    command = [sys.executable, os.path.abspath(script), *arguments]
    out = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=ROOT, env=env)
    if out.returncode:
        raise RuntimeError(f"{what or arguments[:2]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def versions() -> dict:
    """Versions of the packages measured: this environment's, and each installed overlay's own."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "torchvision", "h5py", "litdata", "webdataset"):
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    for peer in peer_overlays.PEERS:
        folder = os.path.join(peer_overlays.overlays_dir(), peer)
        if peer_overlays.overlay_installed(peer):
            for entry in os.listdir(folder):
                name, _, rest = entry.partition("-")
                if rest.endswith(".dist-info") and name in (
                    "ffcv",
                    "nvidia_dali_cuda130",
                    "mosaicml_streaming",
                ):
                    found[name] = rest.removesuffix(".dist-info")
    return found


def summarise(name: str, runs: list[dict], loaders: dict = LOADERS) -> dict:
    cpu_ms = [1000 * r["cpu_seconds"] / r["images"] for r in runs]
    row = {
        "loader": name,
        "format": loaders[name][0],
        "images_per_s": statistics.median(r["images"] / r["seconds"] for r in runs),
        "cpu_ms": statistics.median(cpu_ms),
        "cpu_ms_range": [min(cpu_ms), max(cpu_ms)],
    }
    for key in ("ready_s", "first_batch_s", "third_batch_s"):
        row[key] = statistics.median(r[key] for r in runs)
    return row


def print_table(rows: list[dict], missing: list[str]) -> None:
    print(
        "| loader | format | images/s | CPU-ms/image (min-max) | feedline's lead (CPU) "
        "| loader built (s) | first batch (s) | third batch (s) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        low, high = row["cpu_ms_range"]
        lead = f"{row['feedline_lead']:.2f}x" if row["feedline_lead"] else ""
        print(
            f"| {row['loader']} | {row['format']} | {row['images_per_s']:.0f} "
            f"| {row['cpu_ms']:.2f} ({low:.2f}-{high:.2f}) | {lead} "
            f"| {row['ready_s']:.1f} | {row['first_batch_s']:.1f} | {row['third_batch_s']:.1f} |"
        )
    for name in missing:
        how = "bash benchmarks/install_peers.sh" if overlay_of(name) else 'pip install ".[peers]"'
        print(f"| {name} | {LOADERS[name][0]} | not installed ({how}) | | | | | |")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--batches", type=int, default=0, help="batches measured per run (0: the rest of one epoch)"
    )
    parser.add_argument("--loaders", default=None, help="comma-separated subset, by name")
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--no-train-startup",
        dest="train_startup",
        action="store_false",
        help="skip timing train.py's start-up (one step of feedline's own command on the same tree)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--convert", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        measured = (
            lightning_script(json.loads(args.data), args, SCRIPTS[args.child])
            if args.child in SCRIPTS
            else child(args.child, args)
        )
        report_and_exit(measured)
    if args.convert:  # in the peer's overlay: its own format, made once
        tree = json.loads(args.data)["tree"]
        print(json.dumps(peer_overlays.CONVERTERS[args.convert](tree, args.data_dir)))
        return {}

    if not args.batches:
        args.batches = max(
            1, args.images // args.batch_size - 4
        )  # the rest of one epoch, workers still alive
    wanted = [n.strip() for n in args.loaders.split(",")] if args.loaders else list(LOADERS)
    unknown = [n for n in wanted if n not in LOADERS]
    if unknown:
        parser.error(
            f"--loaders: no loader named {', '.join(map(repr, unknown))}; known: {', '.join(LOADERS)}"
        )
    names = [n for n in wanted if installed(LOADERS[n][1])]
    missing = [n for n in wanted if n not in names]
    data = prepare(args, names)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    train_runs: list[dict] = []
    for _ in range(args.rounds):
        for name in names:
            runs[name].append(measure(name, data, args))
        if args.train_startup:
            startup = {"feedline train.py": measure_train(data, args)["first_batch_s"]}
            for script in SCRIPTS:  # alternating with train.py, each in a fresh process
                measured = in_overlay(None, ["--child", script, *child_arguments(data, args)])
                startup[script] = measured["first_batch_s"]
            train_runs.append(startup)

    rows = [summarise(name, runs[name]) for name in names]
    ours = {row["format"]: row["cpu_ms"] for row in rows if row["loader"] == OURS[row["format"]]}
    for row in rows:
        lead = ours.get(row["format"])
        row["feedline_lead"] = cpu_clock.cpu_ratio(row["cpu_ms"], lead)
    print(
        f"{args.images} JPEGs, RandomResizedCrop 224 + flip, batch {args.batch_size}, {args.workers} workers,"
    )
    print(f"median of {args.rounds} fresh-process runs; versions: {versions()}\n")
    print_table(rows, missing)
    if train_runs:
        print(
            "\nFirst batch in a Lightning Trainer (same tree, work and model, one step), from the process's "
            "start, median (min-max):"
        )
        for name in train_runs[0]:
            seconds = [r[name] for r in train_runs]
            first = statistics.median(seconds)
            print(f"  {name}: {first:.2f} s ({min(seconds):.2f}-{max(seconds):.2f})")
            rows.append({"loader": name, "format": "JPEG tree", "first_batch_s": first})
    result = {
        "args": {k: v for k, v in vars(args).items() if k not in ("data", "child")},
        "rows": rows,
        "versions": versions(),
    }
    from feedline.diagnostics.results import write_json

    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

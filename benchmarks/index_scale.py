"""Index scale: torchvision ImageFolder against feedline's folder index, side by side, on one tree.

    python benchmarks/index_scale.py --files 1000000 [--classes 1000] [--json results.json]

The tree (empty files: an index never opens them) is created once under --data-dir and reused. Every
measurement runs in a fresh spawned process, so imports, page tables and RSS do not leak between rows.

Measures: first build; cached load (ImageFolder has no cache: every run, rank and job repeats its scan);
RSS the dataset adds; pickled dataset size; per-worker private memory growth over one epoch of 2 workers
reading every index (copy-on-read); time to first batch with 2 spawn workers, against a tiny dataset's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MiB = 1024 * 1024


# -- the tree -----------------------------------------------------------------------------------------
def ensure_tree(data_dir: str, classes: int, per_class: int) -> str:
    root = os.path.join(data_dir, f"tree-{classes}x{per_class}")
    marker = root + ".complete"
    if os.path.exists(marker):
        return root
    from tqdm import tqdm

    for c in tqdm(range(classes), desc=f"creating {classes * per_class} empty files", unit="class"):
        d = os.path.join(root, f"n{c:05d}")
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            os.close(os.open(os.path.join(d, f"n{c:05d}_{i:06d}.JPEG"), os.O_CREAT | os.O_WRONLY, 0o644))
    past = time.time() - 60
    for dirpath, _, _ in os.walk(root):
        os.utime(dirpath, (past, past))
    open(marker, "w").close()
    return root


# -- measurements, each run in a fresh process -----------------------------------------------------------
def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _private_dirty(pid: int) -> int:
    """Anonymous and copied pages only: what copy-on-read costs. Clean pages of a mapped file are page
    cache, shared with every process that maps it, and are not counted."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Private_Dirty:"))


def _imagefolder(root):
    from torchvision.datasets import ImageFolder

    return ImageFolder(root)


def _feedline(root, cache_dir, refresh="auto"):
    from datamodules.samples import SampleDataset
    from datasets.folder import FolderSource

    return SampleDataset(FolderSource(root, val_fraction=0, cache_dir=cache_dir, refresh=refresh).split("train"))


def _imports() -> None:
    """Imports are not part of any timing."""
    import torchvision.datasets  # noqa: F401

    import datamodules.samples  # noqa: F401
    import datasets.folder  # noqa: F401


def measure_build(kind: str, root: str, cache_dir: str) -> dict:
    _imports()

    rss0, t0 = _rss(), time.perf_counter()
    dataset = _imagefolder(root) if kind == "imagefolder" else _feedline(root, cache_dir, refresh="always")
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rss_added": _rss() - rss0, "len": len(dataset)}


def measure_load(kind: str, root: str, cache_dir: str) -> dict:
    _imports()

    rss0, t0 = _rss(), time.perf_counter()
    dataset = _imagefolder(root) if kind == "imagefolder" else _feedline(root, cache_dir)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rss_added": _rss() - rss0, "pickled": len(pickle.dumps(dataset)),
            "len": len(dataset)}


class Lookup:
    """Index lookups only (path and label), as a worker does before it opens a file."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        if hasattr(self.dataset, "samples"):  # ImageFolder: a list of (path, label) tuples
            path, label = self.dataset.samples[i]
        else:
            path, label = self.dataset.records.locate(i)
        return label


def _record_worker(worker_id: int) -> None:
    path = os.path.join(os.environ["FEEDLINE_BENCH_WORKERS"], f"{os.getpid()}")
    with open(path, "w") as f:
        f.write(str(_private_dirty(os.getpid())))


def measure_workers(kind: str, root: str, cache_dir: str, workers: int = 2) -> dict:
    from torch.utils.data import DataLoader

    dataset = _imagefolder(root) if kind == "imagefolder" else _feedline(root, cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FEEDLINE_BENCH_WORKERS"] = tmp
        loader = DataLoader(Lookup(dataset), batch_size=4096, shuffle=True, num_workers=workers,
                            persistent_workers=True, worker_init_fn=_record_worker,
                            multiprocessing_context="fork")
        seen = sum(len(batch) for batch in loader)
        growth = []
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name)) as f:
                growth.append(_private_dirty(int(name)) - int(f.read()))
        del loader
    return {"growth_per_worker": max(growth), "growth": growth, "seen": seen}


def measure_spawn(kind: str, root: str, cache_dir: str, workers: int = 2) -> dict:
    from torch.utils.data import DataLoader

    dataset = _imagefolder(root) if kind == "imagefolder" else _feedline(root, cache_dir)
    loader = DataLoader(Lookup(dataset), batch_size=256, shuffle=True, num_workers=workers,
                        multiprocessing_context="spawn")
    t0 = time.perf_counter()
    next(iter(loader))
    return {"seconds": time.perf_counter() - t0}


def _child(queue, fn, args) -> None:
    queue.put(fn(*args))


def run(fn, *args) -> dict:
    """``fn(*args)`` in a fresh spawned process (not a pool worker: it must be able to start workers)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue, fn, args))
    child.start()
    result = queue.get()
    child.join()
    return result


def run_pair(fn, root: str, cache: str, repeat: int) -> tuple[dict, dict]:
    """ImageFolder and feedline alternately, ``repeat`` times each; the run with the median time of each."""
    runs = {"imagefolder": [], "feedline": []}
    for _ in range(repeat):
        for kind in runs:
            runs[kind].append(run(fn, kind, root, cache))
    return tuple(_median(runs[kind]) for kind in runs)


def _median(results: list[dict]) -> dict:
    ordered = sorted(results, key=lambda r: r["seconds"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["all_seconds"] = [round(r["seconds"], 4) for r in results]
    return chosen


# -- report ---------------------------------------------------------------------------------------------
def _fmt_bytes(n: float) -> str:
    return f"{n / MiB:.1f} MiB" if abs(n) >= 0.1 * MiB else f"{n / 1024:.1f} KiB" if abs(n) >= 1024 else f"{int(n)} B"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per side; the median is reported")
    args = parser.parse_args(argv)

    root = ensure_tree(args.data_dir, args.classes, max(1, args.files // args.classes))
    tiny = ensure_tree(args.data_dir, 10, 10)
    cache = tempfile.mkdtemp(prefix="feedline-bench-cache-")
    for _ in os.walk(root):  # warm the directory cache once, so neither side pays for the first listing
        pass

    build_if, build_fl = run_pair(measure_build, root, cache, args.repeat)
    load_if, load_fl = run_pair(measure_load, root, cache, args.repeat)
    work_if, work_fl = run(measure_workers, "imagefolder", root, cache), run(measure_workers, "feedline", root, cache)
    spawn_tiny = _median([run(measure_spawn, "imagefolder", tiny, cache) for _ in range(args.repeat)])
    spawn_if, spawn_fl = run_pair(measure_spawn, root, cache, args.repeat)

    rows = [
        ("first build", build_if["seconds"], build_fl["seconds"], "s",
         build_if["seconds"] / build_fl["seconds"], ">= 3x faster", build_if["seconds"] / build_fl["seconds"] >= 3),
        ("cached load", load_if["seconds"], load_fl["seconds"], "s",
         load_if["seconds"] / load_fl["seconds"], "<= 50 ms", load_fl["seconds"] <= 0.050),
        ("RSS added", load_if["rss_added"], load_fl["rss_added"], "bytes",
         load_if["rss_added"] / max(load_fl["rss_added"], 1), "<= 40 MiB", load_fl["rss_added"] <= 40 * MiB),
        ("pickled dataset", load_if["pickled"], load_fl["pickled"], "bytes",
         load_if["pickled"] / load_fl["pickled"], "<= 8 KB", load_fl["pickled"] <= 8000),
        ("worker memory growth / epoch", work_if["growth_per_worker"], work_fl["growth_per_worker"], "bytes",
         work_if["growth_per_worker"] / max(work_fl["growth_per_worker"], 4096), "<= 8 MiB",
         work_fl["growth_per_worker"] <= 8 * MiB),
        ("spawn: first batch", spawn_if["seconds"], spawn_fl["seconds"], "s",
         spawn_if["seconds"] / spawn_fl["seconds"], f"<= tiny + 1.5 s (tiny: {spawn_tiny['seconds']:.2f} s)",
         spawn_fl["seconds"] <= spawn_tiny["seconds"] + 1.5),
    ]
    n = build_fl["len"]
    print(f"\nindex scale: {n:,} files in {args.classes} classes ({root}); times: median of {args.repeat}\n")
    print("| measure | ImageFolder | feedline | ratio | target | met |\n|---|---:|---:|---:|---|---|")
    for name, a, b, unit, ratio, target, ok in rows:
        fa, fb = (f"{a:.3f} s", f"{b:.3f} s") if unit == "s" else (_fmt_bytes(a), _fmt_bytes(b))
        print(f"| {name} | {fa} | {fb} | {ratio:,.1f}x | {target} | {'yes' if ok else 'NO'} |")
    print("\nImageFolder has no cache: its 'cached load' is the rescan every run, rank and job repeats.")
    print("Worker memory growth: Private_Dirty of each worker (copies of pages it only read), worst worker.")
    result = {
        "files": n, "classes": args.classes, "root": root,
        "rows": [{"measure": r[0], "imagefolder": r[1], "feedline": r[2], "unit": r[3], "ratio": r[4],
                  "target": r[5], "met": r[6]} for r in rows],
        "spawn_tiny_seconds": spawn_tiny["seconds"],
        "repeat": args.repeat,
        "raw": {"build": [build_if, build_fl], "load": [load_if, load_fl], "workers": [work_if, work_fl],
                "spawn": [spawn_if, spawn_fl, spawn_tiny]},
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()

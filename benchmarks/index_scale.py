"""Index scale: torchvision ImageFolder against feedline's folder index, side by side, on one tree.

    python benchmarks/index_scale.py --files 1000000 [--classes 1000] [--json results.json]

The tree (empty files: an index never opens them) is created once under --data-dir and reused. Every
measurement runs in a fresh spawned process, so imports, page tables and RSS do not leak between rows.

Measures: first build; cached load (ImageFolder has no cache: every run, rank and job repeats its scan);
RSS the dataset adds; pickled dataset size; per-worker private memory growth over one epoch of 2 workers
reading every index (copy-on-read); time to first batch with 2 spawn workers, against a tiny dataset's.

``--quick`` (for tests, not for figures): each measurement runs in a child forked from a process that has
imported everything once, instead of a fresh spawned one, and the worker rows use one worker.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from feedline.diagnostics.results import write_json  # noqa: E402

MiB = 1024 * 1024


# -- the tree -----------------------------------------------------------------------------------------
def ensure_tree(data_dir: str, classes: int, per_class: int, lazy: bool = False) -> str:
    """Class folders of empty files: ImageNet-like names, or ``0.JPEG``.. for a lazy_folder layout."""
    root = os.path.join(data_dir, f"{'lazy' if lazy else 'tree'}-{classes}x{per_class}")
    marker = root + ".complete"
    if os.path.exists(marker):
        return root
    from tqdm import tqdm

    for c in tqdm(range(classes), desc=f"creating {classes * per_class} empty files", unit="class"):
        d = os.path.join(root, f"n{c:05d}")
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            name = f"{i}.JPEG" if lazy else f"n{c:05d}_{i:06d}.JPEG"
            os.close(os.open(os.path.join(d, name), os.O_CREAT | os.O_WRONLY, 0o644))
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


KINDS = ("imagefolder", "folder", "lazy_folder")


def _dataset(kind: str, root: str, cache_dir: str, refresh: str = "auto"):
    if kind == "imagefolder":
        from torchvision.datasets import ImageFolder

        return ImageFolder(root)
    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.folder.lazy import LazyFolderSource
    from feedline.datasets.folder.source import FolderSource

    if kind == "folder":
        source = FolderSource(root, val_fraction=0, cache_dir=cache_dir, refresh=refresh)
    else:
        source = LazyFolderSource(root, val_fraction=0, cache_dir=cache_dir, refresh=refresh)
        if refresh == "always":
            source.prepare()  # the first build writes the manifest
    return SampleDataset(source.split("train"))


def _imports() -> None:
    """Imports are not part of any timing."""
    import torchvision.datasets  # noqa: F401

    import feedline.datamodules.samples  # noqa: F401
    import feedline.datasets.folder.lazy  # noqa: F401
    import feedline.datasets.folder.source  # noqa: F401


def measure_build(kind: str, root: str, cache_dir: str) -> dict:
    _imports()

    rss0, t0 = _rss(), time.perf_counter()
    dataset = _dataset(kind, root, cache_dir, refresh="always")
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rss_added": _rss() - rss0, "len": len(dataset)}


def measure_load(kind: str, root: str, cache_dir: str) -> dict:
    _imports()

    rss0, t0 = _rss(), time.perf_counter()
    dataset = _dataset(kind, root, cache_dir)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "rss_added": _rss() - rss0,
        "pickled": len(pickle.dumps(dataset)),
        "len": len(dataset),
    }


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
    with open(path + ".partial", "w") as f:
        f.write(str(_private_dirty(os.getpid())))
    os.replace(path + ".partial", path)  # the main process never reads a half-written figure


def _worker_baselines(directory: str, workers: int, timeout: float = 60.0) -> dict[int, int]:
    """Each worker's Private_Dirty at start-up, by pid. A small epoch can end before a worker that got no
    batch has finished starting, so wait for every worker's record."""
    deadline = time.monotonic() + timeout
    while True:
        names = [n for n in os.listdir(directory) if not n.endswith(".partial")]
        if len(names) >= workers or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    baselines = {}
    for name in names:
        with open(os.path.join(directory, name)) as f:
            baselines[int(name)] = int(f.read())
    return baselines


def measure_workers(kind: str, root: str, cache_dir: str, workers: int = 2) -> dict:
    from torch.utils.data import DataLoader

    dataset = _dataset(kind, root, cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FEEDLINE_BENCH_WORKERS"] = tmp
        loader = DataLoader(
            Lookup(dataset),
            batch_size=4096,
            shuffle=True,
            num_workers=workers,
            persistent_workers=True,
            worker_init_fn=_record_worker,
            multiprocessing_context="fork",
        )
        seen = sum(len(batch) for batch in loader)
        growth = [_private_dirty(pid) - start for pid, start in _worker_baselines(tmp, workers).items()]
        del loader
    return {"growth_per_worker": max(growth), "growth": growth, "seen": seen}


def measure_spawn(kind: str, root: str, cache_dir: str, workers: int = 2) -> dict:
    from torch.utils.data import DataLoader

    dataset = _dataset(kind, root, cache_dir)
    loader = DataLoader(
        Lookup(dataset), batch_size=256, shuffle=True, num_workers=workers, multiprocessing_context="spawn"
    )
    t0 = time.perf_counter()
    next(iter(loader))
    return {"seconds": time.perf_counter() - t0}


def _child(queue, fn, args) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException:
        import traceback

        queue.put(("error", traceback.format_exc()))


def run(fn, *args, context: str = "spawn") -> dict:
    """``fn(*args)`` in a fresh spawned process (not a pool worker: it must be able to start workers), or
    with ``context="fork"`` in a child forked from this process (``--quick``)."""
    import queue as queues

    ctx = mp.get_context(context)
    results = ctx.Queue()
    child = ctx.Process(target=_child, args=(results, fn, args))
    child.start()
    while True:
        try:
            status, value = results.get(timeout=5)
            break
        except queues.Empty:
            if not child.is_alive():
                try:  # it may have put its result and exited while we waited: take it if so
                    status, value = results.get(timeout=5)
                    break
                except queues.Empty:
                    raise RuntimeError(f"{fn.__name__}{args} died with exit code {child.exitcode}") from None
    child.join()
    if status == "error":
        raise RuntimeError(f"{fn.__name__}{args} failed in its process:\n{value}")
    return value


def run_all(fn, roots: dict[str, str], cache: str, repeat: int, *extra, context: str = "spawn") -> dict:
    """Every kind in turn, ``repeat`` rounds; per kind, the run with the median time."""
    runs = {kind: [] for kind in roots}
    for _ in range(repeat):
        for kind, root in roots.items():
            runs[kind].append(run(fn, kind, root, cache, *extra, context=context))
    return {kind: _median(results) for kind, results in runs.items()}


def _median(results: list[dict]) -> dict:
    ordered = sorted(results, key=lambda r: r["seconds"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["all_seconds"] = [round(r["seconds"], 4) for r in results]
    return chosen


# -- report ---------------------------------------------------------------------------------------------
def _fmt(value, unit: str) -> str:
    if value is None:
        return ""
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 0.1 else f"{value:.2f} s"
    return (
        f"{value / MiB:.1f} MiB"
        if abs(value) >= 0.1 * MiB
        else f"{value / 1024:.1f} KiB"
        if abs(value) >= 1024
        else f"{int(value)} B"
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per side; the median is reported")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a check that every row runs, not a measurement: forked children of one process, one worker",
    )
    args = parser.parse_args(argv)
    context, workers = ("fork", 1) if args.quick else ("spawn", 2)
    if args.quick:  # imported once here, so that no forked child pays for it
        _imports()
        import torch.utils.data  # noqa: F401

    per_class = max(1, args.files // args.classes)
    roots = {
        "imagefolder": ensure_tree(args.data_dir, args.classes, per_class),
        "lazy_folder": ensure_tree(args.data_dir, args.classes, per_class, lazy=True),
    }
    roots["folder"] = roots["imagefolder"]
    roots = {kind: roots[kind] for kind in KINDS}
    tiny = ensure_tree(args.data_dir, 10, 10)
    cache = tempfile.mkdtemp(prefix="feedline-bench-cache-")
    for root in set(roots.values()):  # warm the directory cache once, so no side pays for a first listing
        for _ in os.walk(root):
            pass

    build = run_all(measure_build, roots, cache, args.repeat, context=context)
    load = run_all(measure_load, roots, cache, args.repeat, context=context)
    bare = _median(
        [
            run(measure_load, "lazy_folder", roots["lazy_folder"], tempfile.mkdtemp(), context=context)
            for _ in range(args.repeat)
        ]
    )  # an empty cache: no manifest, counts on the fly
    work = {
        kind: run(measure_workers, kind, root, cache, workers, context=context)
        for kind, root in roots.items()
    }
    spawn_tiny = _median(
        [run(measure_spawn, "imagefolder", tiny, cache, workers, context=context) for _ in range(args.repeat)]
    )
    spawn = run_all(measure_spawn, roots, cache, args.repeat, workers, context=context)

    anchor = "imagefolder"
    rows = [
        ("first build", {k: v["seconds"] for k, v in build.items()}, "s", {"folder": ("ratio>=", 3)}),
        (
            "cached load",
            {k: v["seconds"] for k, v in load.items()},
            "s",
            {"folder": ("<=", 0.050), "lazy_folder": ("<=", 0.100)},
        ),
        (
            "setup without manifest",
            {"imagefolder": load[anchor]["seconds"], "lazy_folder": bare["seconds"]},
            "s",
            {"lazy_folder": ("ratio>=", 3)},
        ),
        ("RSS added", {k: v["rss_added"] for k, v in load.items()}, "bytes", {"folder": ("<=", 40 * MiB)}),
        ("pickled dataset", {k: v["pickled"] for k, v in load.items()}, "bytes", {"folder": ("<=", 8000)}),
        (
            "worker memory growth / epoch",
            {k: v["growth_per_worker"] for k, v in work.items()},
            "bytes",
            {"folder": ("<=", 8 * MiB)},
        ),
        (
            "spawn: first batch",
            {k: v["seconds"] for k, v in spawn.items()},
            "s",
            {"folder": ("<=", spawn_tiny["seconds"] + 1.5)},
        ),
    ]
    result_rows = []
    for name, values, unit, targets in rows:
        row = {"measure": name, "unit": unit, "values": values, "ratios": {}, "targets": {}}
        for kind in ("folder", "lazy_folder"):
            if kind in values:
                # A page (4 KiB) is the smallest memory growth that can be measured; ratios stop there.
                floor = 4096 if name.startswith("worker memory") else 1e-9
                row["ratios"][kind] = values[anchor] / max(values[kind], floor)
            if kind in targets:
                op, bound = targets[kind]
                met = row["ratios"][kind] >= bound if op == "ratio>=" else values[kind] <= bound
                text = f">= {bound}x faster" if op == "ratio>=" else f"<= {_fmt(bound, unit)}"
                row["targets"][kind] = {"target": text, "met": bool(met)}
        result_rows.append(row)

    n = build["folder"]["len"]
    print(f"\nindex scale: {n:,} files in {args.classes} classes; times: median of {args.repeat}\n")
    print("| measure | ImageFolder | folder | ratio | lazy_folder | ratio | targets |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in result_rows:
        cells = [_fmt(row["values"].get(k), row["unit"]) for k in KINDS]
        ratios = [
            f"{row['ratios'][k]:,.1f}x" if k in row["ratios"] else "" for k in ("folder", "lazy_folder")
        ]
        targets = "; ".join(
            f"{k}: {t['target']} {'(met)' if t['met'] else '(NOT MET)'}" for k, t in row["targets"].items()
        )
        print(
            f"| {row['measure']} | {cells[0]} | {cells[1]} | {ratios[0]} | {cells[2]} | {ratios[1]} | {targets} |"
        )
    print(
        f"\nspawn: a 100-image ImageFolder's first batch takes {spawn_tiny['seconds']:.2f} s (worker start-up)."
    )
    print("ImageFolder has no cache: its 'cached load' is the scan every run, rank and job repeats.")
    print(
        "Worker memory growth: Private_Dirty of the worst worker (pages copied only because they were read)."
    )
    result = {
        "files": n,
        "classes": args.classes,
        "roots": roots,
        "repeat": args.repeat,
        "quick": args.quick,
        "rows": result_rows,
        "spawn_tiny_seconds": spawn_tiny["seconds"],
        "raw": {"build": build, "load": load, "no_manifest": bare, "workers": work, "spawn": spawn},
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

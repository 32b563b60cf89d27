"""The O(N) costs of a rank's start-up besides the epoch order, one by one, on ``order_scale.py``'s datasets.

    python benchmarks/order_scale_costs.py --samples 1000000 10000000 [--json results.json]

Each size runs in a fresh process. A step is either a real call (a source's construction, ``prepare``, a split,
``digest``, ...) or, where one line of a larger function is the cost, that line's own operation on the same
arrays (marked "(the line alone)"). Per step: seconds, the peak of numpy's and Python's allocations
(tracemalloc, on a second run of the step; a step that runs once is timed under it) and the growth of the process's RSS (file pages it maps and touches included). Where it runs: per
rank (every rank, at every start and resume), per loader (every ``train_dataloader()``), or once per node.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1024 * 1024


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def costs(samples: int, data_dir: str, per_chunk: int) -> list[dict]:
    import numpy as np
    import order_scale_data as data

    from feedline.datamodules.bad_samples import BadSamples
    from feedline.datasets.folder.index import _check, index_dir
    from feedline.datasets.folder.source import FolderSource
    from feedline.datasets.mix.order import mix_order
    from feedline.datasets.paths import IMG_EXTENSIONS, normalize_extensions
    from feedline.datasets.shards.chunks import Chunks
    from feedline.datasets.shards.meta import read_sidecar
    from feedline.datasets.shards.source import ShardsSource
    from feedline.datasets.splits import subset_for

    rows = []

    def step(name: str, where: str, run, again: bool = True):
        """Timed, with the RSS it adds; then run again under tracemalloc for its allocations' peak (tracemalloc
        slows Python's allocations, so a step that can run only once is timed under it: ``again=False``)."""
        if not again:
            tracemalloc.start()
        before, t = _rss(), time.perf_counter()
        out = run()
        seconds = time.perf_counter() - t
        grown = _rss() - before
        if again:
            tracemalloc.start()
            run()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows.append({"samples": samples, "step": name, "where": where, "seconds": seconds,
                     "alloc_peak": peak, "rss_growth": grown})  # fmt: skip
        return out

    shards = data.ensure_shards(data_dir, samples, per_chunk)
    cache = os.path.join(data_dir, f"costs-cache-{samples}")
    shutil.rmtree(cache, ignore_errors=True)
    rank = "per rank"
    src = step("ShardsSource() whole (_read_dataset)", rank, lambda: ShardsSource(shards, cache_dir=cache))
    step("  read_sidecar: JSON + a regex per chunk digest", rank, lambda: read_sidecar(shards))
    step("  Chunks.of: load_index, a dict per chunk", rank, lambda: Chunks.of([shards]))
    labels = np.load(os.path.join(shards, "labels.npy"), mmap_mode="r")
    step("  blake2b of labels.npy (the line alone)", rank,
         lambda: hashlib.blake2b(np.ascontiguousarray(labels, dtype=np.int64).data, digest_size=8))  # fmt: skip
    whole = step("  np.concatenate(labels) (the line alone)", rank, lambda: np.concatenate([labels]))
    step("  labels.min(), labels.max() (the line alone)", rank, lambda: (whole.min(), whole.max()))
    step("prepare(): check_files, a stat per chunk", "once per node", src.prepare)
    step(
        "  np.bincount(labels) in split() (the line alone)", "per rank, per split", lambda: np.bincount(whole)
    )
    step("  np.argsort(labels, stable) in split() (the line alone)", "per rank, per split",
         lambda: np.argsort(whole, kind="stable"))  # fmt: skip
    step(
        "split('train'), first use: draws and writes the split",
        "once (first rank)",
        lambda: src.split("train"),
        again=False,
    )
    train = step("split('train'), cached: bincount, argsort, _sound", "per rank", lambda: src.split("train"))
    step("split('val'), cached", "per rank", lambda: src.split("val"))
    step("Records.digest(): blake2b of the train rows", "per rank (once per datamodule)", train.digest)
    step("ShardsRecords.order_identity(): _bounds + blake2b", "per train_dataloader()", train.order_identity)
    step("share_bad_samples(): BadSamples(len, shared)", "per train_dataloader(), per rank",
         lambda: BadSamples(len(train), 0.0, shared=True))  # fmt: skip
    size = step("pickle.dumps(train records): sent to each spawned worker", "per worker (spawn)",
                lambda: len(pickle.dumps(train)))  # fmt: skip
    rows[-1]["bytes"] = size
    step("(the order, for scale) records.epoch_order(seed, epoch)", "per rank, per epoch",
         lambda: train.epoch_order(0, 0))  # fmt: skip

    root, fcache = data.ensure_folder(data_dir, samples)
    dest = index_dir(root, normalize_extensions(IMG_EXTENSIONS), fcache)
    index = step("folder: open_index's _check (bincount, order of labels)", rank, lambda: _check(dest)[0])
    for name in os.listdir(dest):
        if name.startswith("split-"):
            os.remove(os.path.join(dest, name))
    folder = FolderSource(root, cache_dir=fcache)
    args = ("train", index.counts, 0.1, 0, index.directory)
    step(
        "folder: split rows, first use (stratified_split, save)",
        "once (first rank)",
        lambda: subset_for(*args),
        again=False,
    )
    step("folder: split rows, cached (_sound reads train + val)", rank, lambda: subset_for(*args))
    step("folder: Records.digest()", rank, folder.split("train").digest)

    half = samples // 2
    perm = [
        lambda s, k, n=n: np.random.default_rng([s & 0xFFFFFFFF, k, 1]).permutation(n) for n in (half, half)
    ]
    for label, counts in (("whole parts", [half, half]), ("half of each part", [half // 2, half // 2])):
        counts = np.asarray(counts, dtype=np.int64)
        for epoch in (0, 1):
            step(f"mix_order: 2 parts of {half:,}, {label}, epoch {epoch}", "per rank, per epoch",
                 lambda c=counts, e=epoch: mix_order(perm, [half, half], [0, half], c, 0, e))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--per-chunk", type=int, default=600)
    parser.add_argument("--data-dir", default=os.path.join(HERE, ".data", "order-scale"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(costs(args.child, args.data_dir, args.per_chunk)))
        return
    from feedline.diagnostics.results import write_json

    rows = []
    for samples in args.samples:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, __file__, "--child", str(samples), "--data-dir", args.data_dir]
        done = subprocess.run(
            [*cmd, "--per-chunk", str(args.per_chunk)], env=env, capture_output=True, text=True
        )
        if done.returncode:
            raise RuntimeError(done.stderr[-4000:])
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    print("| samples | step | where | seconds | allocations, peak (MiB) | RSS growth (MiB) |")
    print("|---:|---|---|---:|---:|---:|")
    for r in rows:
        what = r["step"] + (f" ({r['bytes'] / MiB:,.1f} MiB)" if "bytes" in r else "")
        print(f"| {r['samples']:,} | {what} | {r['where']} | {r['seconds']:.3f} "
              f"| {r['alloc_peak'] / MiB:,.1f} | {r['rss_growth'] / MiB:,.1f} |")  # fmt: skip
    write_json(args.json, {"args": {k: v for k, v in vars(args).items() if k != "child"}, "rows": rows})


if __name__ == "__main__":
    main()

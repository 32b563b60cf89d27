"""Order scale: one rank's start-up and mid-epoch resume on simulated datasets of 1M to 1B samples.

    python benchmarks/order_scale.py --samples 1000000 10000000 [--folder-samples 1000000] [--world 8]
        [--ranks 0 7] [--resume-world 4] [--batch-size 256] [--peers] [--profile] [--json results.json]

The datasets are simulated once under --data-dir (``order_scale_data.py``): a shards dataset in feedline's real
format with sparse chunk files, and a folder index written directly. A rank is a fresh process that builds the
datamodule as a user's run does (``ImageDataModule`` as rank r of W, no Trainer): the source, ``prepare_data``
(rank 0 only, as local rank 0 of a node), ``setup("fit")``, ``train_dataloader()``, then the first batch's
indices from the train loader's own batch sampler. No DataLoader worker starts and nothing is decoded: what is
timed is the path to the first indices. Peak RSS is ``ru_maxrss``, shown whole and less the RSS after imports.

Rows: the first start (rank 0 with an empty split cache: it draws and writes the split), then each of --ranks
on the warm cache, then a resume: a state written by rank 0 of W halfway through the epoch, loaded into rank 0
of --resume-world, to its first indices. ``--peers``: LitData's ``StreamingDataset`` on the same shards
directory (its own index format) and Mosaic Streaming on the same chunks described by an MDS index.json, each
to the first indices of rank 0 of W with no chunk read. ``--quick``: a 20k-sample smoke run for the tests,
each row in a child forked from the parent (imports done once; its RSS figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_DIR = os.environ.get("FEEDLINE_PEERS_DIR", os.path.join(HERE, ".peers"))
MiB = 1024 * 1024


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# -- in the child: one rank ------------------------------------------------------------------------------------
def feedline_rank(spec: dict) -> dict:
    from feedline.datamodules.image import ImageDataModule
    from feedline.datasets.folder.source import FolderSource
    from feedline.datasets.shards.source import ShardsSource

    class RankModule(ImageDataModule):
        """The datamodule as rank ``rank`` of ``world`` sees it, without a Trainer."""

        def _world(self):
            return spec["world"], spec["rank"], 1, False

    imported, stages, t = _peak(), {}, time.perf_counter()

    def stage(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        stages[name] = now - t
        t = now

    if spec["kind"] == "shards":
        source = ShardsSource(spec["path"], val_fraction=spec["val_fraction"], cache_dir=spec["cache"])
    else:
        source = FolderSource(spec["path"], val_fraction=spec["val_fraction"], cache_dir=spec["cache"])
    stage("source")
    dm = RankModule(source, batch_size=spec["batch_size"], num_workers=0, seed=0)
    if spec["prepare"]:
        dm.prepare_data()
    stage("prepare")
    dm.setup("fit")
    stage("setup")
    loader = dm.train_dataloader()
    stage("loader")
    if spec.get("state"):
        loader.load_state_dict(spec["state"])
    stage("resume")
    batch = next(iter(loader.batch_sampler))  # (index, seed) pairs, as the loader hands them to its workers
    stage("first")
    out = {"stages": stages, "seconds": sum(stages.values()), "peak": _peak(), "imported": imported}
    out.update(first=[int(i) for i, _ in batch[:8]], batches=len(loader), epoch_samples=loader.sampler.size)
    if spec.get("pickle_to"):  # what a spawned DataLoader worker is handed: the train dataset, pickled
        with open(spec["pickle_to"], "wb") as f:
            pickle.dump(loader.dataset, f)
    if spec.get("write_state"):  # halfway through the epoch, as a checkpoint taken there records it
        dm.position.batches = len(loader) // 2
        out["state"] = loader.state_dict()
    return out


def feedline_worker(spec: dict) -> dict:
    """A spawned DataLoader worker's start: it unpickles the train dataset; the indices come from its rank."""
    import feedline.datamodules.image  # noqa: F401 - a worker imports feedline before it unpickles

    imported, start = _peak(), time.perf_counter()
    with open(spec["pickled"], "rb") as f:
        dataset = pickle.load(f)
    seconds = time.perf_counter() - start
    return {"stages": {"worker": seconds}, "seconds": seconds, "peak": _peak(), "imported": imported,
            "first": [], "pickled_bytes": os.path.getsize(spec["pickled"]), "epoch_samples": len(dataset)}  # fmt: skip


def litdata_rank(spec: dict) -> dict:
    import numpy as np
    from litdata import StreamingDataset
    from litdata.utilities.env import _DistributedEnv

    imported, start = _peak(), time.perf_counter()
    ds = StreamingDataset(spec["path"], shuffle=True, seed=0, drop_last=True)
    ds.distributed_env = _DistributedEnv(spec["world"], spec["rank"], 1)
    ds.set_batch_size(spec["batch_size"])
    built = time.perf_counter()
    iter(ds)  # the epoch's chunks and intervals of this rank's worker; no chunk is read before __next__
    interval = ds.worker_intervals[0]
    chunk = int(ds.worker_chunks[0])
    rows = ds.shuffler(np.arange(interval[1], interval[2]), ds._shuffle_num_chunks, ds.current_epoch, chunk)
    end = time.perf_counter()
    stages = {"source": built - start, "first": end - built}
    return {"stages": stages, "seconds": end - start, "peak": _peak(), "imported": imported,
            "first": [int(i) for i in rows[:8]]}  # fmt: skip


def mosaic_rank(spec: dict) -> dict:
    """Mosaic's dataset built in one process (its shared-memory barrier would wait for every local rank), then
    the epoch's work of rank r of W as its local leader computes it, once per node (``generate_work``)."""
    from streaming import StreamingDataset
    from streaming.base.batching import generate_work
    from streaming.base.world import World

    imported, start = _peak(), time.perf_counter()
    ds = StreamingDataset(local=spec["path"], shuffle=True, shuffle_seed=0, batch_size=spec["batch_size"])
    built = time.perf_counter()
    world = World(num_nodes=1, ranks_per_node=spec["world"], workers_per_rank=1, worker=spec["rank"])
    epoch, offset = ds._resume(world, 0)  # no resume state: sets the canonical nodes and shuffle block size
    ids = generate_work(ds.batching_method, ds, world, epoch, offset)
    rows = ids[world.node, world.rank_of_node, world.worker_of_rank].reshape(-1)
    end = time.perf_counter()
    stages = {"source": built - start, "first": end - built}
    return {"stages": stages, "seconds": end - start, "peak": _peak(), "imported": imported,
            "first": [int(i) for i in rows[rows >= 0][:8]]}  # fmt: skip


def equivalence(samples: int = 10_007, world: int = 8) -> dict:
    """The lazy orders against their enumeration on a small run, as ``tests/test_lazy_order.py`` checks them:
    each is a permutation, any position read alone gives the enumeration's row, and every rank's blocks are
    its share of the whole order's segment (``segment_rows``, ``rank_rows``) from a mid-epoch start."""
    import numpy as np

    from feedline.datamodules.epoch import sampler as sampler_module
    from feedline.datamodules.epoch.order import epoch_order, rank_rows, segment_rows
    from feedline.datamodules.epoch.sampler import EpochSampler
    from feedline.datasets.shards.order import chunk_order

    bounds = np.append(np.arange(0, samples, 600), samples)
    orders = {"permutation": epoch_order(samples, 0, 3), "chunk windows": chunk_order(bounds, 4, 0, 3)}
    checked = {}
    blocks = sampler_module.FIRST_BLOCK, sampler_module.BLOCK
    sampler_module.FIRST_BLOCK, sampler_module.BLOCK = 97, 1009  # many blocks over the small run
    for name, order in orders.items():
        whole = order.take(np.arange(samples))
        at = np.random.default_rng(0).integers(0, samples, 1000)
        ok = np.array_equal(np.sort(whole), np.arange(samples)) and np.array_equal(order.take(at), whole[at])
        for rank in range(world):
            sampler = EpochSampler(
                samples, world, rank, True, 0, False, epoch=3, epoch_order=lambda s, e, o=order: o
            )
            sampler.start = samples // 3
            expected = rank_rows(segment_rows(whole, samples // 3, world, False), rank, world)
            ok = ok and [row for row, _ in sampler] == expected.tolist()
        checked[name] = bool(ok)
    sampler_module.FIRST_BLOCK, sampler_module.BLOCK = blocks
    return {"samples": samples, "world": world, "equal": checked}


def child(spec: dict) -> dict:
    run = {
        "feedline": feedline_rank,
        "worker": feedline_worker,
        "litdata": litdata_rank,
        "mosaic": mosaic_rank,
    }[spec["who"]]
    if not spec.get("profile"):
        return run(spec)
    import cProfile
    import io
    import pstats

    import feedline.datamodules.image  # noqa: F401 - imported before, so the profile shows the start alone
    import feedline.datasets.folder.source  # noqa: F401
    import feedline.datasets.shards.source  # noqa: F401

    profile = cProfile.Profile()
    out = profile.runcall(run, spec)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(spec["profile"])
    out["profile"] = text.getvalue()
    return out


# -- in the parent: each row in a fresh process -----------------------------------------------------------------
FORK = None  # --quick: each row in a child forked from this process, which imported feedline once


def spawn(spec: dict) -> dict:
    if FORK is not None and spec["who"] != "mosaic":
        with FORK(max_workers=1) as pool:
            return pool.submit(child, spec).result()
    env = dict(os.environ)
    paths = [HERE] + ([os.path.join(PEERS_DIR, "mosaic")] if spec["who"] == "mosaic" else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{spec['who']} rank {spec['rank']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(kind: str, samples: int, path: str, cache: str, args) -> list[dict]:
    base = {"who": "feedline", "kind": kind, "path": path, "cache": cache, "world": args.world,
            "batch_size": args.batch_size, "val_fraction": args.val_fraction, "prepare": False}  # fmt: skip
    plan = [("first start (writes the split cache)", {**base, "rank": 0, "prepare": True})]
    pickled = os.path.join(cache, "worker-dataset.pickle")
    plan += [
        (f"rank {r}", {**base, "rank": r, "prepare": r == 0, "write_state": r == 0, "pickle_to": pickled})
        for r in args.ranks
    ]
    forget_splits(cache)
    rows, state = [], None
    for label, spec in plan:
        rows.append({"kind": kind, "samples": samples, "row": label, **spec, **spawn(spec)})
        state = rows[-1].pop("state", state)
    spec = {**base, "rank": 0, "world": args.resume_world, "state": state}
    label = f"resume at half the epoch, world {args.world} -> {args.resume_world}, rank 0"
    rows.append({"kind": kind, "samples": samples, "row": label, **spawn(spec), **spec, "state": None})
    spec = {**base, "who": "worker", "rank": args.ranks[-1], "pickled": pickled}
    label = f"a spawned worker of rank {args.ranks[-1]} (unpickles the train dataset)"
    rows.append({"kind": kind, "samples": samples, "row": label, **spec, **spawn(spec)})
    return rows


def forget_splits(cache: str) -> None:
    """The split arrays cached by an earlier run (the index a folder source needs stays)."""
    for directory, _, files in os.walk(cache):
        for name in files:
            if name.startswith("split-"):
                os.remove(os.path.join(directory, name))


def measure_peers(samples: int, shards: str, mds: str, args) -> list[dict]:
    import importlib.util

    rows = []
    base = {"world": args.world, "rank": 0, "batch_size": args.batch_size}
    if importlib.util.find_spec("litdata"):
        spec = {**base, "who": "litdata", "path": shards}
        rows.append({"kind": "shards", "samples": samples, "row": "LitData, rank 0", **spec, **spawn(spec)})
    if samples > args.mosaic_max:  # its node leader builds the epoch's sample ids whole: ~60 B a sample
        print(f"Mosaic Streaming at {samples:,} samples: not run (its epoch's ids would need about "
              f"{samples * 60 / 1e9:.0f} GB in one process; --mosaic-max {args.mosaic_max:,})")  # fmt: skip
    elif os.path.exists(os.path.join(PEERS_DIR, "mosaic", ".installed")):
        spec = {**base, "who": "mosaic", "path": mds}
        rows.append(
            {"kind": "mds", "samples": samples, "row": "Mosaic Streaming, rank 0", **spec, **spawn(spec)}
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| dataset | samples | row | to first indices (s) | source | prepare | setup | loader | resume | first "
        "| worker | peak RSS (MiB) | less imports (MiB) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["stages"]
        cells = " | ".join(f"{s[k]:.2f}" if k in s else "-" for k in STAGES)
        lines.append(
            f"| {r['kind']} | {r['samples']:,} | {r['row']} | {r['seconds']:.2f} | {cells} "
            f"| {r['peak'] / MiB:,.0f} | {(r['peak'] - r['imported']) / MiB:,.0f} |"
        )
    return "\n".join(lines)


STAGES = ("source", "prepare", "setup", "loader", "resume", "first", "worker")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--folder-samples", type=int, nargs="*", default=None, help="default: --samples")
    parser.add_argument("--per-chunk", type=int, default=600)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--ranks", type=int, nargs="+", default=[0, 7])
    parser.add_argument("--resume-world", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--data-dir", default=os.path.join(HERE, ".data", "order-scale"))
    parser.add_argument("--peers", action="store_true", help="LitData's and Mosaic's rows too")
    parser.add_argument("--mosaic-max", type=int, default=100_000_000, help="skip Mosaic's row above this")
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N of rank 0 of each")
    parser.add_argument("--quick", action="store_true", help="20k samples, batch 64 (for tests)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.quick:
        global FORK
        import functools
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        import feedline.datamodules.image  # noqa: F401 - imported once, before the forks

        FORK = functools.partial(ProcessPoolExecutor, mp_context=mp.get_context("fork"))
        args.samples, args.folder_samples, args.batch_size = [20_000], [20_000], 64
    import order_scale_data as data

    from feedline.diagnostics.results import write_json

    same = equivalence()
    said = ", ".join(f"{name} {'equal' if ok else 'NOT EQUAL'}" for name, ok in same["equal"].items())
    print(
        f"lazy orders against their enumeration on {same['samples']:,} samples, {same['world']} ranks: {said}"
    )
    if not all(same["equal"].values()):
        raise SystemExit(
            "a lazy order differs from its enumeration: the figures below would be of a wrong order"
        )
    rows = []
    for samples in args.samples:
        shards = data.ensure_shards(args.data_dir, samples, args.per_chunk)
        rows += measure("shards", samples, shards, os.path.join(args.data_dir, f"cache-{samples}"), args)
        if args.peers:
            rows += measure_peers(
                samples, shards, data.ensure_mds(args.data_dir, samples, args.per_chunk), args
            )
    for samples in args.samples if args.folder_samples is None else args.folder_samples:
        root, cache = data.ensure_folder(args.data_dir, samples)
        rows += measure("folder", samples, root, cache, args)
    if args.profile:
        for samples in args.samples:
            spec = {**rows[0], "path": data.ensure_shards(args.data_dir, samples, args.per_chunk), "rank": 0,
                    "cache": os.path.join(args.data_dir, f"cache-{samples}"), "profile": args.profile}  # fmt: skip
            spec.update(who="feedline", kind="shards", prepare=True, state=None, write_state=False)
            print(f"\n## cProfile, shards, {samples:,} samples, rank 0\n\n{spawn(spec)['profile']}")
    print(f"\nworld {args.world}, batch {args.batch_size} per rank, val_fraction {args.val_fraction}\n")
    print(table(rows))
    write_json(
        args.json,
        {"args": {k: v for k, v in vars(args).items() if k != "child"}, "equivalence": same, "rows": rows},
    )


if __name__ == "__main__":
    main()

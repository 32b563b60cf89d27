"""The rows of ``benchmarks/shards.py --s3``: the same shards streamed from a local S3 server (SeaweedFS,
``tests/s3_server.py``), through feedline's chunk cache and through LitData's own loader.

Each row is two passes (epochs) in one fresh process, each measured alike from its third batch (the first two
of a pass wait on workers starting or refilling their prefetch), each with images/s and the process tree's
CPU-ms per image; the time to the first batch from the
process's start; the bytes fetched (the cache's own count; LitData: the size of its cache directory
afterwards); and the peak bytes of the cache directory, sampled every 5 ms from the parent process (so the
sampling costs the measured process nothing), against the limit.

    cold     an empty cache directory, a limit larger than the data
    warm     the cold row's directory again: every chunk cached
    limited  an empty directory and a limit of half the data: chunks evicted and fetched again
    LitData  StreamingDataset + StreamingDataLoader from the same bucket, with the allow_http switch an
             http:// endpoint needs (``litdata_http.py``), its own cache directory, no limit
    local    the same shards from the local disk, measured by this same two-pass child (with the same
             sampling beside it): the baseline of the warm rows
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time

import cpu_clock
from peer_work import crop_and_flip, decode_jpeg

ROWS = (
    "feedline shards, S3 cold",
    "feedline shards, S3 warm",
    "feedline shards, S3 limited",
    "LitData, S3",
    "feedline shards, local disk",
)


def start_server(data_dir: str, shards: str):
    """A SeaweedFS server with ``shards`` uploaded: (server, url)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.s3_server import S3Server, upload_dir

    root = os.path.join(data_dir, f"s3-{os.getpid()}")
    os.makedirs(root, exist_ok=True)
    server = S3Server(root).start()
    url = server.new_prefix() + "/shards"
    upload_dir(server, shards, url)
    return server, url


def plans(data: dict, args, round_: int) -> list[tuple[str, dict]]:
    """(row, what its child builds) for one round: cold and warm share a directory, fresh each round."""
    base = os.path.join(args.data_dir, f"s3-cache-{os.getpid()}-{round_}")
    data_bytes = data["s3_bytes"]
    return [
        (ROWS[0], {"cache": base + "-cold", "limit": 4 * data_bytes}),
        (ROWS[1], {"cache": base + "-cold", "limit": 4 * data_bytes}),
        (ROWS[2], {"cache": base + "-limited", "limit": data_bytes // 2}),
        (ROWS[3], {"cache": base + "-litdata", "limit": None}),
        (ROWS[4], {"cache": base + "-local", "limit": None, "local": True}),
    ]


def build(name: str, data: dict, args, plan: dict):
    env = data["s3_env"]
    os.environ.update(env)
    if name.startswith("LitData"):
        import litdata
        from litdata_http import allow_http, storage_options

        allow_http()
        transform = crop_and_flip()

        class Dataset(litdata.StreamingDataset):
            def __getitem__(self, index):
                image, label = super().__getitem__(index)
                return transform(decode_jpeg(image)), label

        options = storage_options(
            env["AWS_ENDPOINT_URL"],
            env["AWS_ACCESS_KEY_ID"],
            env["AWS_SECRET_ACCESS_KEY"],
            env["AWS_DEFAULT_REGION"],
        )
        dataset = Dataset(data["s3_url"], shuffle=True, storage_options=options, cache_dir=plan["cache"])
        return litdata.StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    from peer_loaders import feedline_loader

    from feedline.datasets.shards.source import ShardsSource

    if plan.get("local"):  # the warm rows' baseline, measured the same way
        source = ShardsSource(data["shards"], val_fraction=0, window=args.window, cache_dir=plan["cache"])
    else:
        source = ShardsSource(
            data["s3_url"],
            val_fraction=0,
            window=args.window,
            cache_dir=plan["cache"],
            cache_limit=plan["limit"],
        )
    return feedline_loader(source, args)


def child(name: str, args) -> dict:
    """Two passes of row ``name`` in this fresh process."""
    import psutil

    from feedline.diagnostics.startup import process_start

    data, plan = json.loads(args.data), json.loads(args.plan)
    started = process_start() or time.time()
    loader = build(name, data, args, plan)
    me = psutil.Process()

    def cpu() -> float:  # with the workers of a pass that ended (LitData's are not persistent)
        return cpu_clock.tree_seconds(me, reaped=True)

    cache = getattr(loader.dataset.records.chunks, "cache", None) if not name.startswith("LitData") else None
    before = cache.fetched()["bytes"] if cache else 0
    passes, first = [], None
    for _ in range(2):
        count, clock, cpu_start = 0, None, None
        for k, batch in enumerate(loader):
            if first is None:
                first = time.time() - started
            if clock is None:
                if k == 2:  # after two batches: workers starting (pass 1) or refilling (pass 2)
                    clock, cpu_start = time.perf_counter(), cpu()
                continue
            count += len(batch[0])
        seconds = time.perf_counter() - clock
        passes.append({"images": count, "seconds": seconds, "cpu_seconds": cpu() - cpu_start})
    fetched = cache.fetched()["bytes"] - before if cache else None
    return {"passes": passes, "first_batch_s": first, "fetched": fetched}


def measure(name: str, data: dict, args, plan: dict, script: str) -> dict:
    """Run row ``name`` in a fresh process, sampling its cache directory every 5 ms from here."""
    command = [
        sys.executable,
        script,
        "--child",
        name,
        "--data",
        json.dumps(data),
        "--plan",
        json.dumps(plan),
    ]
    command += [
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
        "--window",
        str(args.window),
    ]
    peak, done = [0], threading.Event()
    # feedline's chunk cache (its split arrays and chunks.stats live beside it); LitData's whole directory
    watched = plan["cache"] if name.startswith("LitData") else os.path.join(plan["cache"], "chunks")

    def sample():
        while not done.is_set():
            total = 0
            for root, _, files in os.walk(watched):
                for f in files:
                    with contextlib.suppress(FileNotFoundError):
                        total += os.stat(os.path.join(root, f)).st_size
            peak[0] = max(peak[0], total)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    finally:
        done.set()
        sampler.join()
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["fetched"] is None and name.startswith("LitData"):  # what its cache directory holds afterwards
        result["fetched"] = sum(
            os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(plan["cache"]) for f in fs
        )
    result["peak"], result["limit"] = peak[0], plan["limit"]
    return result

"""Images/s against the number of loader workers, beside ImageFolder, with the efficiency against linear.

    python benchmarks/scaling.py [--workers 1,2,4,8,16] [--images 3000] [--rounds 3] [--json out.json]

The work and the harness are those of ``peers.py`` (read, decode, RandomResizedCrop 224, flip, uint8 batches;
a fresh process per measurement, loaders alternating). Efficiency at n workers is the rate at n over n times
the rate at the smallest count measured: 100% is linear. Worker counts above the machine's cores are
dropped (they would measure the scheduler), and the table says how many cores there were.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers  # noqa: E402

LOADERS = (
    "ImageFolder + PIL",
    "feedline folder",
    "feedline hdf5 (JPEG at 256 px)",
    "feedline hdf5 (raw at 256 px)",
)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=0)
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--data-dir", default=os.path.join(peers.ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    counts = [n for n in (int(w) for w in args.workers.split(",")) if n <= cores]
    names = args.loaders.split(",")
    args.batches = args.batches or max(1, args.images // args.batch_size - 4)
    data = peers.prepare(args)
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for n in counts:
            args.workers = n
            for name in names:
                run = peers.measure(name, data, args)
                rates.setdefault((name, n), []).append(run["images"] / run["seconds"])
    rows = []
    print(
        f"{cores} cores; {args.images} JPEGs, batch {args.batch_size}; median of {args.rounds} fresh-process runs\n"
    )
    print("| loader | workers | images/s | efficiency vs linear | vs ImageFolder |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        base = statistics.median(rates[(name, counts[0])]) / counts[0]
        for n in counts:
            rate = statistics.median(rates[(name, n)])
            anchor = rates.get(("ImageFolder + PIL", n))
            row = {
                "loader": name,
                "workers": n,
                "images_per_s": rate,
                "efficiency": rate / (n * base),
                "vs_imagefolder": rate / statistics.median(anchor) if anchor else None,
            }
            rows.append(row)
            ratio = f"{row['vs_imagefolder']:.2f}x" if anchor else ""
            print(f"| {name} | {n} | {rate:.0f} | {100 * row['efficiency']:.0f}% | {ratio} |")
    result = {"cores": cores, "args": vars(args), "rows": rows}
    from feedline.diagnostics.results import write_json

    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

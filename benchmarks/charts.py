"""The manual's charts, drawn from the benchmarks' JSON (never by hand): the peer comparison and worker scaling.

python benchmarks/charts.py                      # benchmarks/results/{peers,scaling}.json -> docs/images/*.png
python benchmarks/charts.py --results DIR --out DIR

peers.png: CPU-ms per image for every loader (median, with the min-max range), grouped by format class, feedline's
rows in colour; the figure to compare across loaders on a shared machine (images/s swings with the neighbours).
scaling.png: images/s against workers per loader, each with its linear line through the one-worker rate.
"""

from __future__ import annotations

import argparse
import json
import os

from matplotlib.figure import Figure

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
IMAGES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "images")
FEEDLINE = "#1f6feb"
PEER = "#8b949e"
FEEDLINE_FORMATS = [FEEDLINE, "#2da44e", "#bf3989", "#d29922"]  # feedline's loaders, one colour each


def peers_chart(result: dict, path: str) -> str:
    rows = [row for row in result["rows"] if "cpu_ms" in row]  # start-up-only rows have no CPU figure
    classes = list(dict.fromkeys(row["format"] for row in rows))
    ordered = [row for cls in classes for row in rows if row["format"] == cls]
    figure = Figure(figsize=(9, 0.42 * len(ordered) + 1.6), layout="constrained")
    ax = figure.subplots()
    ys = list(range(len(ordered)))[::-1]
    for y, row in zip(ys, ordered):
        low, high = row.get("cpu_ms_range") or (row["cpu_ms"], row["cpu_ms"])
        colour = FEEDLINE if row["loader"].startswith("feedline") else PEER
        ax.barh(y, row["cpu_ms"], color=colour)
        ax.plot([low, high], [y, y], color="black", linewidth=1)
        lead = row.get("feedline_lead")
        note = f" {row['cpu_ms']:.2f}" + (f"  ({lead:.2f}x feedline's CPU)" if lead and lead != 1 else "")
        ax.annotate(note, (max(high, row["cpu_ms"]), y), va="center", fontsize=8)
    ax.set_yticks(ys, [f"{row['loader']}  [{row['format']}]" for row in ordered], fontsize=8)
    ax.set_xlabel("CPU-ms per image, whole process tree (lower is better; bar: median, line: min-max)")
    args = result.get("args", {})
    ax.set_title(
        f"{args.get('images', '?')} JPEGs, RandomResizedCrop 224 + flip, batch {args.get('batch_size', '?')}, "
        f"{args.get('workers', '?')} workers, median of {args.get('rounds', '?')} rounds",
        fontsize=9,
    )
    ax.margins(x=0.25)
    return _save(figure, path)


def scaling_chart(result: dict, path: str) -> str:
    figure = Figure(figsize=(7, 4.2), layout="constrained")
    ax = figure.subplots()
    loaders = list(dict.fromkeys(row["loader"] for row in result["rows"]))
    ours = iter(FEEDLINE_FORMATS * len(loaders))
    for loader in loaders:
        rows = sorted((r for r in result["rows"] if r["loader"] == loader), key=lambda r: r["workers"])
        workers = [r["workers"] for r in rows]
        rates = [r["images_per_s"] for r in rows]
        colour = next(ours) if loader.startswith("feedline") else PEER
        (line,) = ax.plot(workers, rates, "o-", label=loader, color=colour)
        one = dict(zip(workers, rates)).get(1)
        if one:
            ax.plot(workers, [one * w for w in workers], ":", color=line.get_color(), linewidth=1)
    ax.set_xticks(sorted({r["workers"] for r in result["rows"]}))
    ax.set_xlabel("workers")
    ax.set_ylabel("images/s")
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"worker scaling on {result.get('cores', '?')} cores (dotted: linear from 1 worker)", fontsize=9
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(figure, path)


def _save(figure, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


CHARTS = {"peers": peers_chart, "scaling": scaling_chart}


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=RESULTS, help="folder with peers.json and scaling.json")
    parser.add_argument(
        "--out",
        default=IMAGES,
        help="folder for the PNGs (default: docs/images, where the manual shows them)",
    )
    args = parser.parse_args(argv)
    written = []
    for name, chart in CHARTS.items():
        source = os.path.join(args.results, f"{name}.json")
        if not os.path.exists(source):
            print(f"{source}: not found, {name}.png not drawn (run benchmarks/{name}.py --json {source})")
            continue
        with open(source) as f:
            written.append(chart(json.load(f), os.path.join(args.out, f"{name}.png")))
        print(f"drawn {written[-1]} from {source}")
    return written


if __name__ == "__main__":
    main()

"""How well the shards' train order mixes, per window, against a global shuffle: label arithmetic, no images.

    python benchmarks/shard_mixing.py [--classes 1000] [--per-chunk 580] [--batch-size 256] [--worlds 1 8]
                                      [--windows 1 2 4 8 16 32 64] [--json results.json]

Data: an ImageNet-1k-like train set of labels only: 1000 classes of 732..1300 samples, 1,281,167 in all, most
classes full (1300) and a seeded tail of smaller ones; ``--per-class N`` makes them even instead. A chunk holds
``--per-chunk`` samples: 64 MB of ~110 KB JPEGs is ~580. Two layouts of the chunks: ``shuffled`` (the shards
writer's default, ``out.shuffle=true``: the labels in a seeded random order) and ``class-major`` (the samples
sorted by class: ``out.shuffle=false`` on a class tree, parts converted per class, tars sorted by class).

Orders: ``datasets/shards/order.py`` at each window k (chunks permuted per epoch, samples shuffled within k
chunks), and the global shuffle every other source reads (``datamodules/epoch/order.py epoch_order``). On W ranks of
batch B, rank r reads entries r, r+W, ... of the order (``datamodules/epoch/order.py``), so a global step is a
contiguous stretch of B*W entries. Every full step of the epoch is counted (the last partial one is not):

    classes / batch    distinct classes in a rank's batch of B, the mean over ranks and steps
    chunks / step      distinct chunks a global step reads, the mean over steps
    resident           the most chunks open at once, if each chunk is fetched once and kept from its first read
                       to its last: what a node's cache must hold (the order bounds it by about 2k)
    repeat pairs       of the pairs of samples that share a rank's batch in epoch 0, the fraction that share one
                       again in epoch 1 (exact: every pair), as a multiple of the global shuffle's; batchmates
                       again: the same per sample, how many of its B - 1 batchmates it meets again

The default window (``datasets/options.py ShardsOptions.window``) is ``pick_window`` of this measurement; the
test ``tests/test_shard_mixing.py`` holds the two together.
"""

from __future__ import annotations

import argparse

import numpy as np

from feedline.datamodules.epoch.order import epoch_order
from feedline.datasets.shards.order import chunk_order
from feedline.diagnostics.results import write_json

GLOBAL = "global"
LAYOUTS = ("shuffled", "class-major")

# The rule for the default window, applied to the shuffled layout (the writer's default) on every world.
RULE = {
    "classes_within": 0.01,  # classes per batch at least (1 - this) x the global shuffle's
    "repeat_factor": 4.0,  # repeat pairs at most this many times the global shuffle's
    "max_window": 32,  # resident chunks ~2k: 64 chunks of 64 MB, 4 GiB a node's cache must hold at most
}


# -- the data: labels, in the order the chunks hold them ---------------------------------------------------------
def class_sizes(
    classes: int, per_class: int | None, total: int, full: int, least: int, seed: int
) -> np.ndarray:
    """Samples per class: ``per_class`` each, or ImageNet-like: ``full`` each but a seeded tail of classes
    between ``least`` and ``full`` whose shortfall makes ``total``."""
    if per_class:
        return np.full(classes, per_class, dtype=np.int64)
    sizes = np.full(classes, full, dtype=np.int64)
    short = classes * full - total
    if short < 0 or short > classes * (full - least):
        raise ValueError(f"{total} samples do not fit {classes} classes of {least}..{full}")
    rng = np.random.default_rng(seed)
    for c in rng.permutation(classes):
        if short <= 0:
            break
        cut = min(short, int(rng.integers(1, full - least + 1)))
        sizes[c] -= cut
        short -= cut
    return sizes


def layout_labels(sizes: np.ndarray, layout: str, seed: int) -> np.ndarray:
    """Every sample's label in the order the chunks hold them."""
    labels = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    if layout == "shuffled":
        return labels[np.random.default_rng([seed, 7]).permutation(len(labels))]
    if layout == "class-major":
        return labels
    raise ValueError(layout)


def chunk_bounds(total: int, per_chunk: int) -> np.ndarray:
    return np.append(np.arange(0, total, per_chunk, dtype=np.int64), total)


# -- the measures ------------------------------------------------------------------------------------------------
def distinct_per_row(values: np.ndarray) -> np.ndarray:
    """Distinct values in each row of a 2-D array."""
    rows = np.sort(values, axis=1)
    return 1 + (rows[:, 1:] != rows[:, :-1]).sum(axis=1)


def rank_batch_ids(length: int, world: int, batch: int) -> tuple[np.ndarray, int]:
    """The rank batch of each entry of an order (step * W + rank), and how many full ones there are."""
    p = np.arange(length, dtype=np.int64)
    per_rank = length // world // batch  # full batches per rank
    return (p // world // batch) * world + p % world, per_rank * world


def measure(order: np.ndarray, nxt: np.ndarray, labels: dict, chunk_of: np.ndarray, world: int, batch: int):
    """The measures of one order (``nxt``: the next epoch's, for repeat pairs) on a world of ``world``;
    classes per batch for each layout of ``labels``, the rest (the same for every layout) once."""
    step = batch * world
    steps = len(order) // step
    used = order[: steps * step]
    # classes per rank batch: rank r's batch of step s is entries s*step + r + W*i, i < B
    classes = {
        layout: float(
            distinct_per_row(
                of[used].reshape(steps, batch, world).transpose(0, 2, 1).reshape(-1, batch)
            ).mean()
        )
        for layout, of in labels.items()
    }
    chunk_ids = chunk_of[used]
    chunks = distinct_per_row(chunk_ids.reshape(steps, step))
    # resident: each chunk open from the step of its first read to the step of its last
    step_of = np.arange(len(used), dtype=np.int64) // step
    first = np.full(int(chunk_of[-1]) + 1, steps, dtype=np.int64)
    last = np.full(len(first), -1, dtype=np.int64)
    np.minimum.at(first, chunk_ids, step_of)
    np.maximum.at(last, chunk_ids, step_of)
    seen = last >= 0
    open_ = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(open_, first[seen], 1)
    np.add.at(open_, last[seen] + 1, -1)
    resident = np.cumsum(open_)[:steps]
    # repeat pairs: every pair sharing a rank batch in this epoch, and in the next one too
    ids, count = rank_batch_ids(len(order), world, batch)
    now = np.empty(len(order), dtype=np.int64)
    then = np.empty(len(order), dtype=np.int64)
    now[order] = ids
    then[nxt] = ids
    keep = (now < count) & (then < count)
    _, both = np.unique(now[keep] * count + then[keep], return_counts=True)
    pairs = count * batch * (batch - 1) // 2
    repeats = int((both * (both - 1) // 2).sum())
    return {
        "classes_per_batch": classes,
        "chunks_per_step": float(chunks.mean()),
        "chunks_per_step_max": int(chunks.max()),
        "resident_max": int(resident.max()),
        "resident_mean": float(resident.mean()),
        "repeat_pairs": repeats / pairs,
        "batchmates_again": 2 * repeats / (count * batch),  # per sample: its batchmates met again
    }


def chunk_bound(window: int, bounds: np.ndarray, step: int) -> int:
    """The most chunks a stretch of ``step`` entries of the order can touch: ``window`` for each window it
    can touch: those at its two ends and every whole one between. Every window but the permutation's last
    (only ever at an end) holds ``window`` chunks, so at least the samples of the ``window`` smallest."""
    sizes = np.diff(bounds)
    if window >= len(sizes):
        return len(sizes)
    least = int(np.sort(sizes)[:window].sum())  # the smallest a full window can be
    return min(len(sizes), window * (max(step - 2, 0) // least + 2))


def run(args) -> dict:
    sizes = class_sizes(args.classes, args.per_class, args.samples, args.full, args.least, args.seed)
    total = int(sizes.sum())
    bounds = chunk_bounds(total, args.per_chunk)
    chunk_of = np.repeat(np.arange(len(bounds) - 1, dtype=np.int64), np.diff(bounds))
    labels = {layout: layout_labels(sizes, layout, args.seed) for layout in LAYOUTS}
    windows = [*args.windows, GLOBAL]
    rows = []
    for window in windows:
        if window == GLOBAL:
            orders = [np.asarray(epoch_order(total, args.seed, epoch)) for epoch in (0, 1)]
        else:
            orders = [np.asarray(chunk_order(bounds, window, args.seed, epoch)) for epoch in (0, 1)]
        for world in args.worlds:
            row = {"world": world, "window": window}
            row.update(measure(orders[0], orders[1], labels, chunk_of, world, args.batch_size))
            if window != GLOBAL:
                row["chunk_bound"] = chunk_bound(window, bounds, args.batch_size * world)
            rows.append(row)
    rows.sort(key=lambda r: (r["world"], windows.index(r["window"])))
    for row in rows:  # against the global shuffle on the same world
        ref = next(r for r in rows if r["window"] == GLOBAL and r["world"] == row["world"])
        row["classes_vs_global"] = {
            layout: row["classes_per_batch"][layout] / ref["classes_per_batch"][layout] for layout in LAYOUTS
        }
        row["repeat_vs_global"] = (
            row["repeat_pairs"] / ref["repeat_pairs"] if ref["repeat_pairs"] else float("inf")
        )
    return {
        "args": vars(args),
        "samples": total,
        "chunks": len(bounds) - 1,
        "class_sizes": {"min": int(sizes.min()), "max": int(sizes.max())},
        "rule": RULE,
        "rows": rows,
    }


def pick_window(result: dict) -> int:
    """The default window from a measurement: the smallest k, at most ``max_window``, whose shuffled layout
    keeps ``classes_within`` of the global shuffle's classes per batch and at most ``repeat_factor`` times
    its repeat pairs on every world; ``max_window`` when none does."""
    rule = result["rule"]
    windows = sorted({r["window"] for r in result["rows"] if r["window"] != GLOBAL})
    for window in windows:
        if window > rule["max_window"]:
            break
        rows = [r for r in result["rows"] if r["window"] == window]
        if all(
            r["classes_vs_global"]["shuffled"] >= 1 - rule["classes_within"]
            and r["repeat_vs_global"] <= rule["repeat_factor"]
            for r in rows
        ):
            return window
    return rule["max_window"]


def print_table(result: dict) -> None:
    args = result["args"]
    print(
        f"{result['samples']:,} samples of {args['classes']} classes ({result['class_sizes']['min']}.."
        f"{result['class_sizes']['max']} each), {result['chunks']:,} chunks of {args['per_chunk']}, "
        f"batch {args['batch_size']} per rank\n"
    )
    print(
        "| world | window | classes / batch, shuffled | class-major | chunks / step | resident (bound) "
        "| repeat pairs | batchmates again | vs global |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        classes = " | ".join(
            f"{r['classes_per_batch'][layout]:.1f} ({r['classes_vs_global'][layout]:.1%})"
            for layout in LAYOUTS
        )
        bound = f" ({r['chunk_bound']:,})" if "chunk_bound" in r else ""
        print(
            f"| {r['world']} | {r['window']} | {classes} | {r['chunks_per_step']:.1f} | {r['resident_max']:,}{bound} "
            f"| {r['repeat_pairs']:.2e} | {r['batchmates_again']:.2f} | {r['repeat_vs_global']:.1f}x |"
        )
    rule = result["rule"]
    print(
        f"\ndefault window: {pick_window(result)} (the smallest k <= {rule['max_window']} whose shuffled layout keeps "
        f"classes / batch within {rule['classes_within']:.0%} of the global shuffle and repeat pairs within "
        f"{rule['repeat_factor']:g}x of it, on every world)"
    )


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=1_281_167, help="ImageNet-like sizes: the total")
    parser.add_argument("--full", type=int, default=1300, help="ImageNet-like sizes: the largest class")
    parser.add_argument("--least", type=int, default=732, help="ImageNet-like sizes: the smallest class")
    parser.add_argument("--per-class", type=int, default=None, help="even classes of this size instead")
    parser.add_argument("--per-chunk", type=int, default=580, help="samples a chunk holds (64 MB / ~110 KB)")
    parser.add_argument("--batch-size", type=int, default=256, help="per rank")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    result = run(args)
    print_table(result)
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

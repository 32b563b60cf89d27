"""``bench.py``'s picture: one PNG beside its JSON, drawn from the same result.

Left: where a sample's time goes, stage by stage (ms per sample, in-process), with the model's step per
sample beside them when it was measured, so "who is the bottleneck" is one glance. Right: images/s against
the worker count with the linear line through the one-worker rate (a sweep), or the measured rate alone, and
torchvision's ``ImageFolder`` on the same data when it was measured in the same run (``bench.anchor``).

matplotlib's object API (``Figure``) draws without a display and without touching pyplot's global state.
"""

from __future__ import annotations

import os

from feedline.diagnostics.stages import STAGE_NAMES

FEEDLINE = "#1f6feb"
ANCHOR = "#8b949e"
MODEL = "#d29922"
LOG_SPAN = 100  # bars spanning more than this ratio are drawn on a log scale, so every one shows


def draw_bench(result: dict, path: str) -> str:
    """Draw ``result`` (as ``bench.py`` returns it) to ``path`` (PNG); returns the path."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    stages, throughput = figure.subplots(1, 2, width_ratios=[1.1, 1])
    _stages(stages, result)
    _throughput(throughput, result)
    figure.suptitle(f"{result['pipeline']}\nverdict: {result['verdict']['verdict']}", fontsize=10)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def stage_bars(result: dict) -> tuple[list[str], list[float], list[str]]:
    """The left panel's bars: names, ms per sample and colours; the model's step is per sample of the batch
    it stepped on (a full ``data.batch_size``), not of the loader's mean batch, which a short last batch
    lowers."""
    per_sample = result["breakdown"]["per_sample_s"]
    stages = result["breakdown"]["stages_run"]
    names = [STAGE_NAMES.get(stage, stage) for stage in stages]
    values = [per_sample[stage] * 1e3 for stage in stages]
    colours = [FEEDLINE] * len(names)
    model = result.get("model")
    if model:
        batch = model.get("batch_size") or result["loader"]["samples"] / max(1, result["loader"]["batches"])
        names.append(f"model step ({model['device']})")
        values.append(model["step_s"] * 1e3 / batch)
        colours.append(MODEL)
    return names, values, colours


def _stages(ax, result: dict) -> None:
    names, values, colours = stage_bars(result)
    positions = range(len(names))[::-1]  # the first stage on top
    ax.barh(list(positions), values, color=colours)
    ax.set_yticks(list(positions), names)
    for y, value in zip(positions, values):
        ax.annotate(f" {value:.3g}", (value, y), va="center", fontsize=8)
    positive = [value for value in values if value > 0]
    if positive and max(positive) > LOG_SPAN * min(positive):  # a model step that dwarfs the stages
        ax.set_xscale("log")
        ax.set_xlabel("ms per sample (one process; log scale)")
    else:
        ax.set_xlabel("ms per sample (one process)")
    ax.set_title("where a sample's time goes", fontsize=10)
    ax.margins(x=0.2)


def _throughput(ax, result: dict) -> None:
    anchor = result.get("anchor")
    sweep = result.get("sweep")
    if sweep:
        workers = sorted(int(w) for w in sweep)
        rates = [sweep[w] if w in sweep else sweep[str(w)] for w in workers]
        ax.plot(workers, rates, "o-", color=FEEDLINE, label="feedline")
        one = dict(zip(workers, rates)).get(1)
        if one:
            linear = [w for w in workers if w >= 1]
            ax.plot(linear, [one * w for w in linear], "--", color=ANCHOR, label="linear (from 1 worker)")
        ax.set_xticks(workers)
        ax.set_xlabel("data.num_workers")
    else:
        workers = [int(result["workers"])]
        ax.plot(workers, [result["loader"]["samples_per_s"]], "o", color=FEEDLINE, label="feedline")
        ax.set_xticks(workers)
        ax.set_xlabel("data.num_workers")
    if anchor:
        ax.plot(
            [anchor["workers"]],
            [anchor["samples_per_s"]],
            "s",
            color=ANCHOR,
            markersize=8,
            label=f"ImageFolder ({anchor['ratio']:.2f}x slower)"
            if anchor["ratio"] >= 1
            else f"ImageFolder ({1 / anchor['ratio']:.2f}x faster)",
        )
    ax.set_ylim(bottom=0)
    ax.set_ylabel("images/s")
    ax.set_title("train loader throughput", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

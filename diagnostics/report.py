"""``bench.py``'s terminal report: rich tables, the verdict and what to try."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from feedline.diagnostics.stages import STAGE_NAMES


def print_report(result: dict, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not wrap at 80 columns
            console = Console(width=120)
    loader = result["loader"]
    console.print(f"[bold]train loader[/bold]: {result['pipeline']}")
    table = Table()
    for column in ("workers", "samples/s", "batches/s", "MB/s read"):
        table.add_column(column, justify="right")
    table.add_row(
        str(result["workers"]),
        f"{loader['samples_per_s']:.1f}",
        f"{loader['batches_per_s']:.2f}",
        f"{result['mb_per_s']:.1f}",
    )
    console.print(table)

    if result.get("startup"):
        console.print("start-up, to the third batch:")
        table = Table()
        for column in ("step", "seconds", "since process start"):
            table.add_column(column, justify="right" if column != "step" else "left")
        for row in result["startup"]:
            table.add_row(row["step"], f"{row['seconds']:.3f}", f"{row['since_start']:.3f}")
        console.print(table)

    stages = result["breakdown"]
    console.print(f"per-sample stages, in-process, {stages['items']} items:")
    table = Table()
    for column in ("stage", "ms/sample", "share"):
        table.add_column(column, justify="right" if column != "stage" else "left")
    for stage in stages["stages_run"]:
        seconds = stages["per_sample_s"][stage]
        table.add_row(STAGE_NAMES.get(stage, stage), f"{seconds * 1e3:.3f}", f"{stages['share'][stage]:.0%}")
    table.add_row("sum of stages", f"{stages['stages_sum_s'] * 1e3:.3f}", "")
    table.add_row("end to end", f"{stages['end_to_end_s'] * 1e3:.3f}", "")
    console.print(table)

    if stages.get("parts"):  # source=mix: the same stages per part, and which part is slowest
        parts = stages["parts"]
        console.print("per part of the mix (ms/sample):")
        table = Table()
        for column in ("part", "items", "read", "decode", "transform", "total"):
            table.add_column(column, justify="right" if column != "part" else "left")
        for name, row in parts["by_part"].items():
            per = row["per_sample_s"]
            mark = "  <- the bottleneck" if name == parts["slowest"] else ""
            table.add_row(
                name,
                str(row["items"]),
                *(f"{per[stage] * 1e3:.3f}" for stage in ("read", "decode", "transform")),
                f"{row['total_s'] * 1e3:.3f}{mark}",
            )
        console.print(table)

    if result.get("anchor"):
        a = result["anchor"]
        console.print(
            f"torchvision ImageFolder (the anchor): {a['samples_per_s']:.1f} samples/s with {a['workers']} "
            f"worker(s); feedline: {a['ratio']:.2f}x its rate"
        )

    recommended, configured = result.get("recommended_workers"), result.get("configured_workers")
    if result.get("sweep"):
        console.print("worker sweep:")
        table = Table()
        table.add_column("num_workers", justify="right")
        table.add_column("samples/s", justify="right")
        for workers, rate in result["sweep"].items():
            mark = ""
            if int(workers) == recommended:
                mark = "  <- recommended" + (", as set" if recommended == configured else "")
            table.add_row(str(workers), f"{rate:.1f}{mark}")
        console.print(table)

    if result.get("model"):
        m = result["model"]
        console.print(
            f"model step on {m['device']}: {m['step_s'] * 1e3:.1f} ms; the loader needs {m['loader_batch_s'] * 1e3:.1f} ms "
            f"per batch, so it covers {m['covered']:.0%} of the step; the device would idle {m['idle_share']:.0%} of the time"
        )

    verdict = result["verdict"]
    console.print(f"\n[bold]verdict: {verdict['verdict']}[/bold]")
    for reason in verdict["reasons"]:
        console.print(f"  - {reason}")
    console.print("try:")
    for suggestion in verdict["suggestions"]:
        console.print(f"  - {suggestion}")
    # Advice the run already follows is not given; model-bound, the verdict names the fewest workers that keep up.
    if recommended is not None and recommended != configured and verdict["verdict"] != "model-bound":
        console.print(f"  - data.num_workers={recommended} (the fewest workers within 5% of the best rate)")

"""After a Hydra multirun: one table at the sweep root, a row per job (choices, val accuracy, samples/s).

Each job's ``train()`` writes ``summary.json`` in its own directory; this Hydra callback collects them, so
it also reports jobs that failed (no summary) and works with any launcher that shares the filesystem.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("feedline")

COLUMNS = ("job", "source", "overrides", "val_acc", "samples_per_s", "drawn", "val_acc_by_part", "output_dir")


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for job_dir in sorted(
        (p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name),
    ):
        summary_path = job_dir / "summary.json"
        overrides_path = job_dir / ".hydra" / "overrides.yaml"
        if not summary_path.exists() and not overrides_path.exists():
            continue
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        overrides = summary.get("overrides")
        if overrides is None and overrides_path.exists():
            overrides = [
                line[2:].strip() for line in overrides_path.read_text().splitlines() if line.startswith("- ")
            ]
        rows.append(
            {
                "job": job_dir.name,
                "source": summary.get("choices", {}).get("source", ""),
                "overrides": " ".join(_unescaped(o) for o in overrides or []),
                "val_acc": summary.get("val_acc"),
                "samples_per_s": summary.get("train_samples_per_s"),
                # source=mix: what each part gave an epoch
                "drawn": ", ".join(f"{k} {v}" for k, v in (summary.get("drawn_per_epoch") or {}).items()),
                # source=mix: val/acc/<part>, what a sweep over the weights is for
                "val_acc_by_part": ", ".join(
                    f"{k[len('val/acc/') :]} {v:.4f}"
                    for k, v in (summary.get("metrics") or {}).items()
                    if k.startswith("val/acc/") and isinstance(v, (int, float))
                ),
                "output_dir": str(job_dir) if summary else f"{job_dir} (no summary.json: the job failed)",
            }
        )
    if not any(Path(row["output_dir"]).joinpath("summary.json").exists() for row in rows):
        return []  # not a training sweep (bench.py, convert.py), or every job failed before training
    return rows


def _unescaped(override: str) -> str:
    """An override as the user typed it: Hydra escapes a sweep job's values (``s3\\://b``) with backslashes."""
    return re.sub(r"\\(.)", r"\1", override)


def _cell(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" if isinstance(value, float) and value <= 1.0 else str(value)


def write_tables(sweep_dir: Path, rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS[:-1]) + " |", "|" + "---|" * (len(COLUMNS) - 1)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in COLUMNS[:-1]) + " |" for row in rows]
    table = "\n".join(lines) + "\n"
    (sweep_dir / "summary.md").write_text(table)
    with open(sweep_dir / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return table


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = collect(sweep_dir)
        if rows:
            log.info("sweep summary (%s):\n%s", sweep_dir / "summary.md", write_tables(sweep_dir, rows))

"""CSVLogger that keeps the rows already in ``metrics.csv``: a resumed run appends to its own history.

Lightning's deletes ``metrics.csv`` when a launch finds the directory in use, so a run resumed with
``ckpt_path=last`` (a SLURM requeue, a restart after a kill) keeps only what it logged after the resume. This
one reads the file back instead and appends, so the file reads as one run:

- rows of the steps this launch logs again (its first logged step on: the steps after the checkpoint it
  resumed from, which the killed launch had logged too) are replaced by the new ones, and moved, not
  deleted, to ``metrics.replaced.csv`` beside it;
- the column set is the union of both launches' (a column only one of them logged stays empty elsewhere).
"""

from __future__ import annotations

import csv
import logging
import os

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

log = logging.getLogger(__name__)

REPLACED = "metrics.replaced.csv"


class CSVLogger(_LightningCSVLogger):
    """Lightning's CSVLogger (same arguments and layout) that appends to an existing ``metrics.csv``."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment


class AppendingWriter(ExperimentWriter):
    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self._earlier_checked = False

    def _check_log_dir_exists(self) -> None:
        """Lightning deletes metrics.csv here; its rows are this run's history, read back on the first save."""

    def save(self) -> None:
        if self.metrics and not self._earlier_checked:
            self._earlier_checked = True
            self._keep_earlier_rows(min(int(row["step"]) for row in self.metrics))
        super().save()

    def _keep_earlier_rows(self, first_step: int) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            keys = list(reader.fieldnames or [])
        self.metrics_keys = sorted(set(self.metrics_keys) | set(keys))  # Lightning writes them sorted
        kept = [row for row in rows if _step(row) < first_step]
        replaced = [row for row in rows if not _step(row) < first_step]
        if replaced:
            moved_to = os.path.join(self.log_dir, REPLACED)
            _append_rows(self._fs, moved_to, replaced)
            log.warning(
                "%s held %d row(s) from step %d on, logged by an earlier launch in this directory; this launch "
                "logs those steps again (it resumed from a checkpoint before them, or started afresh): the "
                "earlier rows are moved to %s",
                self.metrics_file_path,
                len(replaced),
                first_step,
                moved_to,
            )
        if len(kept) < len(rows) or keys != self.metrics_keys:
            _write_rows(self._fs, self.metrics_file_path, kept, self.metrics_keys)


def _step(row: dict) -> float:
    try:
        return float(row.get("step") or "nan")
    except ValueError:
        return float("nan")  # an unreadable step counts as replaced: moved aside, never dropped


def _append_rows(fs, path: str, rows: list[dict]) -> None:
    """Add ``rows`` to the CSV at ``path``, widening its header when they bring new columns."""
    earlier: list[dict] = []
    keys: set[str] = set()
    if fs.isfile(path):
        with fs.open(path, "r", newline="") as f:
            reader = csv.DictReader(f)
            earlier = list(reader)
            keys |= set(reader.fieldnames or [])
    for row in rows:
        keys |= set(row)
    _write_rows(fs, path, earlier + rows, sorted(keys))


def _write_rows(fs, path: str, rows: list[dict], keys: list[str]) -> None:
    """Written beside and renamed over, so a kill mid-write leaves the old file whole."""
    partial = f"{path}.partial"
    with fs.open(partial, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    fs.mv(partial, path)

"""The predict loader: batches of ``data.predict_root`` in path order, each naming its files
(``WithPaths``); a batch whose every file is unreadable is skipped, so the files after it are still predicted.

``WithPaths`` leaves an unreadable file out of its batch; when that leaves nothing (``data.batch_size=1``, or
a batch of bad files only) it returns None, which this loader drops. Lightning's predict loop counts batches
as they come, and a prediction writer (``BasePredictionWriter``) looks up each batch's sample indices by that
count in what the batch sampler recorded: there the skipped batch's entry is taken out, and a batch that lost
files keeps the indices of the files it holds, so every batch's indices stay its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch.utils.data import DataLoader


class PredictLoader(DataLoader):
    """A DataLoader (same arguments) over a ``SampleDataset`` with paths, that skips the None batches of
    ``WithPaths``."""

    def __iter__(self) -> Iterator:
        return _skip_empty(super().__iter__(), self.batch_sampler, self.dataset.records.describe)


def _skip_empty(batches, batch_sampler, describe: Callable[[int], str]) -> Iterator:
    seen = getattr(batch_sampler, "seen_batch_indices", None)  # Lightning's, under trainer.predict
    skipped = 0
    for k, batch in enumerate(batches):
        at = k - skipped  # the count Lightning gives this batch; the batches before it are taken
        recorded = seen is not None and at < len(seen)
        if batch is None:
            if recorded:
                del seen[at]  # the batches after it move up by one, as their count does
            skipped += 1
            continue
        if recorded and len(batch.paths) < len(seen[at]):
            kept = set(batch.paths)
            seen[at] = [i for i in seen[at] if describe(i) in kept]
        yield batch

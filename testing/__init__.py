"""``check_source``: the contract a source must keep, checked as feedline's own sources are in its test suite.

    check_source(MySource(root=..., seed=1))        # None, or an AssertionError naming what broke

It prepares the source, then checks, in this order (each failure is a ``ContractError`` that names the check,
the split and the sample):

    protocol     classes is a list of names, each once (a source of named fields: its target's class list);
                 prepare() runs twice; split("train") and split("val") are RecordSets (len, [i], describe);
                 a record is (payload, label) with label in range(len(classes)), or a dict of the fields
    names        describe(i) names every sample, each apart (bad samples are reported by it)
    pickles      each split pickles in under 64 KiB once read: paths and numbers, never the sample list
    workers      a DataLoader worker reads the very records the main process reads
    splits       train, val and test (where there is one) share no sample; the source built again with the
                 same arguments (``rebuild``) draws the same splits
    decode       a few samples decode as feedline decodes them (the image, or each named field)
    bad samples  a read raising BadInput or OSError is named and skipped (data.on_bad_sample=skip) or stops
                 the run naming it (raise); any other exception stops the run under either
    resume       two loaders with one seed give the same order and batches; the state taken after k batches
                 resumes into the rest of the epoch, each sample once

Give it a small instance of the source (tens to a few thousand samples): names and splits are read whole.
"""

from __future__ import annotations

from collections.abc import Callable

from feedline.datasets.fields import fields_of
from feedline.testing.common import ContractError, spread
from feedline.testing.pipeline import bad_samples, decodes, resume
from feedline.testing.records import disjoint, names, pickles, protocol, rebuilder, seeded, workers

__all__ = ["ContractError", "check_source"]


def check_source(
    source,
    *,
    rebuild: Callable[[], object] | None = None,
    samples: int = 8,
    seed: int = 0,
    multiprocessing_context: str | None = None,
) -> None:
    """Check ``source`` against the Source contract (the module's docstring lists the checks); raise a
    ``ContractError`` (an AssertionError) naming the first that fails.

    ``rebuild``: () -> the same source built again with the same arguments, to check that its seeded splits
    come out the same; default: from ``source.rebuild_config()`` (sources that inherit
    ``feedline.datasets.Source`` have one), else the splits are read twice from ``source`` itself.
    ``samples``: how many samples the worker, decode and bad-sample checks read. ``seed``: the loaders'.
    ``multiprocessing_context``: the worker's start method ("fork", "spawn"; None: the platform's)."""
    splits = protocol(source)
    fields = fields_of(source)
    for name, records in splits.items():
        names(records, name)
        pickles(records, name)
    picked = spread(len(splits["train"]), samples)
    workers(splits["train"], picked, multiprocessing_context)
    disjoint(splits)
    seeded(source, splits, rebuild if rebuild is not None else rebuilder(source))
    decodes(splits["train"], picked, fields)
    bad_samples(splits["train"], fields)
    resume(source, len(splits["train"]), seed)

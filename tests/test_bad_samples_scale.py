"""The bad-sample record costs memory in proportion to the bad samples found, not to the split: a split of a
trillion samples shares it across workers (fork and spawn) in a few pages, and its count is one read."""

from __future__ import annotations

import copy
import logging
import multiprocessing as mp
import os
import pickle

import pytest

from feedline.datamodules.bad_samples import BadSampleError, BadSamples

TRILLION = 10**12  # one byte per sample would be a terabyte of /dev/shm


def _find(bad: BadSamples, indices) -> None:
    for i in indices:
        bad.found(i, f"s/{i}.jpg", OSError("truncated"))


def _resident_bytes(bad: BadSamples) -> int:
    return os.fstat(bad._bits.fd).st_blocks * 512


def test_a_trillion_sample_split_is_shared_and_marked_in_a_few_pages(caplog):
    bad = BadSamples(TRILLION, 0.01, shared=True)
    with caplog.at_level(logging.WARNING):
        _find(bad, [TRILLION - 1, 7, TRILLION - 1])
    assert bad.shared and bad.count == 2 and bad.flagged() == [7, TRILLION - 1]
    assert _resident_bytes(bad) <= 64 * 1024  # the pages written, not the split
    assert sum("skipping bad sample" in r.getMessage() for r in caplog.records) == 2  # once each


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_of_either_start_method_count_each_bad_sample_once(context):
    bad = BadSamples(TRILLION, 0.5, shared=True)
    ctx = mp.get_context(context)
    # Both workers find the same samples, and neighbours in one byte: no bit and no count is lost.
    workers = [ctx.Process(target=_find, args=(bad, range(64))) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert bad.count == 64 and bad.flagged() == list(range(64))
    _find(bad, [64])  # and the main process sees and adds to the same record
    assert bad.count == 65


def test_the_budget_holds_across_processes_with_its_message():
    bad = BadSamples(TRILLION, 1e-12, shared=True)  # one bad sample allowed
    worker = mp.get_context("fork").Process(target=_find, args=(bad, [3]))
    worker.start()
    worker.join(timeout=60)
    with pytest.raises(
        BadSampleError,
        match=rf"2 of {TRILLION} samples are unreadable, more than data\.max_bad_fraction=1e-12 allows \(1\); "
        r"found here: s/9\.jpg",
    ):
        _find(bad, [9])


def test_a_plain_copy_keeps_what_was_found_as_its_own():
    bad = BadSamples(TRILLION, 0.5, shared=True)
    _find(bad, [5, 10**11])
    for copied in (copy.deepcopy(bad), pickle.loads(pickle.dumps(bad))):
        assert not copied.shared and copied.count == 2 and copied.flagged() == [5, 10**11]
        _find(copied, [6])
        assert copied.count == 3
    assert bad.count == 2 and len(pickle.dumps(bad)) < 1000

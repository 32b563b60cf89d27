"""LitData's writer, run apart: ``litdata.optimize`` in a child process of its own process group.

    converting process        the progress bar; reads the count of samples handled, and the child's one
                              message: None when it wrote everything, else the error with its traceback
      runner (fork, setpgid)  sets LitData's scratch folders (``work/cache``, ``work/data``), then runs
                              ``optimize``, which sets a start method and a SIGINT handler of its own here
        reaper (fork)         kills the whole group once the runner is gone
        LitData's workers     each writes the chunks of its slice of the rows, in order; an unreadable
                              input goes into ``work/skipped/<pid>.tsv`` (row, then the error)

An abort here, Ctrl-C included, kills that group before it goes on, and every process in it dies with the
process that started it (``prepare.die_with``), so no writer outlives the conversion. Each sample is decoded
and resized by the same worker code as the HDF5 writer's (``writers/prepare.py``); a sample of named fields
becomes a dict of them (``sample.py``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import traceback

import numpy as np

from feedline.datasets.records import BadInput
from feedline.transforms.decode import DecodeError
from feedline.writers import prepare
from feedline.writers.hdf5 import _workers
from feedline.writers.options import WriteOptions
from feedline.writers.progress import progress
from feedline.writers.shards.sample import prepared_sample

POLL_S = 0.2


def run_writer(
    records, options: WriteOptions, rows: np.ndarray, work: str, name: str, fields=None, boxes=None
) -> None:
    """Run ``litdata.optimize`` in a child process in its own process group, with a progress bar here;
    any exception here (Ctrl-C included) kills that group before it goes on. ``fields``: the source's named
    fields (its records read dicts), written as dicts; ``boxes``: what each boxes field's samples hold
    (``sample.box_spec``)."""
    context = multiprocessing.get_context("fork")
    done = context.Value("q", 0)
    receive, send = context.Pipe(duplex=False)
    runner = context.Process(
        target=_runner,
        args=(records, options, rows, work, done, send, os.getpid(), fields, boxes or {}),
        daemon=False,
    )
    runner.start()
    send.close()
    try:
        with progress(len(rows), f"converting to {name}", "img") as bar:
            while runner.is_alive() or receive.poll():
                runner.join(POLL_S)
                bar.update(done.value - bar.n)
                if receive.poll():
                    break
            bar.update(done.value - bar.n)
        runner.join()
        error = receive.recv() if receive.poll() else f"it exited with status {runner.exitcode}"
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(runner.pid, signal.SIGKILL)
        runner.join()
        raise
    finally:
        receive.close()
    if error is not None:
        raise RuntimeError(f"writing shards failed: {error}")


_done = None  # the shared count of samples handled (set in the runner, inherited by LitData's workers)
_skipped_dir = None
_runner_pid = None
_tied = False
_fields = None  # the source's named fields, and what its boxes fields hold: set in the runner
_boxes: dict = {}


def _runner(records, options, rows, work, done, send, parent, fields=None, boxes=None) -> None:
    global _done, _skipped_dir, _runner_pid, _fields, _boxes
    os.setpgid(0, 0)  # LitData's workers join this group: an abort kills them all at once
    prepare.die_with(parent)
    _reaper()
    logging.getLogger("litdata").setLevel(logging.WARNING)  # its INFO lines are about its own cache
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = os.path.join(work, "cache")
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = os.path.join(work, "data")
    _done, _skipped_dir, _runner_pid = done, os.path.join(work, "skipped"), os.getpid()
    _fields, _boxes = fields, dict(boxes or {})
    prepare.init_worker(records, options, os.getpid())
    try:
        from litdata import optimize

        optimize(
            fn=_samples,
            inputs=rows.tolist(),
            output_dir=os.path.join(work, "out"),
            chunk_bytes=options.chunk_byte_count(),
            num_workers=max(1, min(_workers(options), len(rows))),
            start_method="fork",
            keep_data_ordered=True,  # chunk order = input order: worker w writes the w-th slice
            verbose=False,
        )
        send.send(None)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it
        send.send(f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}")
    finally:
        send.close()
    os._exit(0)


def _reaper() -> None:
    """Fork a process that kills this process group once its parent (the runner) is gone: LitData's workers
    start processes of their own, which a parent-death signal does not reach."""
    runner = os.getpid()
    if os.fork():
        return
    try:
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
        prepare.die_with(runner, signal.SIGTERM)
        while True:
            signal.pause()
    finally:
        os._exit(0)


def _samples(row: int):
    """LitData's ``fn``: the sample of source row ``row`` as (image bytes, int label), or a dict of its named
    fields (``sample.py``), or nothing when the input is unreadable (listed in the skipped report)."""
    global _tied
    if not _tied:
        prepare.die_with(_runner_pid)
        _tied = True
    if _fields is not None:
        sample, error = _named(int(row))
        if error is None:
            yield sample
    else:
        data, label, error = prepare.prepare(int(row))
        if error is None:
            yield bytes(np.ascontiguousarray(data, dtype=np.uint8).data), int(label)
    if error is not None:
        with open(os.path.join(_skipped_dir, f"{os.getpid()}.tsv"), "a", encoding="utf-8") as f:
            f.write(f"{int(row)}\t{error.replace(chr(10), ' ')}\n")
    with _done.get_lock():
        _done.value += 1


def _named(row: int):
    """(the stored dict, None) of source row ``row``, or (None, 'sample<TAB>error')."""
    records = prepare._records
    try:
        return prepared_sample(records[row], _fields, prepare._options, _boxes), None
    except (OSError, DecodeError, BadInput) as err:
        return None, f"{records.describe(row)}\t{err}"

"""Write any source's samples as a shards dataset (the layout ``datasets/shards/chunks.py`` reads).

    <out.path>/                     or its part's folder, ``part-0000K-of-0000N`` (``output.py``)
      chunk-<worker>-<n>.bin        LitData's chunks of ``out.chunk_bytes``: (image bytes, label) per sample, or
                                    a dict of the source's named fields (``sample.py``)
      index.json, labels.npy, skipped.tsv, feedline.json     (``sidecar.py``)

The samples go in the order given: the source's, or a seeded random one (``out.shuffle``) so that each chunk
mixes the classes; ``out.part=K out.parts=N`` writes the K-th of N equal slices of that order.

Atomic: everything is written in a work directory beside the output (``.<name>.tmp-<pid>``), LitData's
chunks in its ``out/`` (``runner.py``); once LitData's ``index.json`` exists, feedline adds its sidecar and
renames ``out/`` into place. A killed conversion leaves only the work directory, which no reader takes for a
dataset and the next conversion removes. One conversion writes an output at a time (``scratch.locked``). A
URL's dataset is written so in a private scratch folder, then uploaded whole (``writers/upload.py``).
"""

from __future__ import annotations

import glob
import os
import shutil
import time

import numpy as np

from feedline.datasets.fields import fields_of
from feedline.storage.stores import is_url
from feedline.writers.options import WriteOptions
from feedline.writers.origin import check_not_input, recorded_source, rows_digest
from feedline.writers.shards.output import check_target, output_dir, remote_store
from feedline.writers.shards.runner import run_writer
from feedline.writers.shards.sample import box_spec
from feedline.writers.shards.scratch import locked, scratch_folder
from feedline.writers.shards.sidecar import finish
from feedline.writers.upload import upload


def convert_source(source, options: WriteOptions, lock: bool = True) -> dict:
    """Prepare ``source`` and write every sample of it (``split("all")``) as shards into ``out.path``."""
    options.check()
    check_not_input(source, output_dir(options), options.storage_options)
    target = check_target(options)
    with locked(target, lock):
        source.prepare()
        fields = fields_of(source)
        fields = None if fields.is_classification else fields
        records = source.split("all")
        return _write_to(records, source.classes, options, target, recorded_source(source), fields)


def convert(
    records,
    classes: list[str],
    options: WriteOptions,
    description: str = "",
    lock: bool = True,
    fields=None,
) -> dict:
    """Write ``records`` (``fields``: their named fields, each record a dict of them; None: (payload, label)
    records) as shards into ``options.path``."""
    options.check()
    target = check_target(options)
    with locked(target, lock):
        return _write_to(records, classes, options, target, description, fields)


def _write_to(records, classes, options: WriteOptions, target: str, description: str, fields=None) -> dict:
    """Write locally; a URL's dataset is written in a private scratch directory of its own under the temp dir
    (``$TMPDIR``: ``tempfile.mkdtemp``, never a folder that was there before), then uploaded whole
    (``upload.py``)."""
    if not is_url(target):
        return _write(records, classes, options, target, description, fields=fields)
    with scratch_folder(target) as scratch:
        dataset = os.path.join(scratch, "dataset")
        summary = _write(records, classes, options, dataset, description, target, fields)
        summary["bytes"] = upload(summary["path"], remote_store(options))
    summary["path"] = target
    if summary["report"]:
        summary["report"] = f"{target}/skipped.tsv"
    return summary


def rows_to_write(n: int, options: WriteOptions) -> np.ndarray:
    """The source rows this conversion writes, in order: all of them, or its part's slice of them."""
    order = np.arange(n, dtype=np.int64)
    if options.shuffle is not False:
        order = np.random.default_rng([int(options.seed), n]).permutation(n)
    if options.parts is not None:
        k, parts = int(options.part), int(options.parts)
        order = order[k * n // parts : (k + 1) * n // parts]
    return order


def _write(
    records, classes, options: WriteOptions, target: str, description: str, shown: str = "", fields=None
) -> dict:
    """Write the dataset into ``target`` (``shown``: what the progress names, where not its folder's name)."""
    started = time.perf_counter()
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    for stale in glob.glob(os.path.join(parent, f".{glob.escape(name)}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)  # a killed conversion's: we hold the lock, none is live
    work = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
    if options.parts is not None and int(options.parts) > len(records):
        raise ValueError(
            f"out.parts={options.parts} is more than the {len(records)} samples of {description or 'the source'}: "
            f"every part must hold one (a part left empty could never be written, and the dataset never "
            f"completed); set out.parts to at most {len(records)}"
        )
    rows = rows_to_write(len(records), options)
    if not len(rows):
        raise ValueError(f"{description or 'the source'} holds no samples for {target}: nothing to write")
    source_rows = rows_digest(records) if options.parts is not None else None  # before the work, once
    try:
        for sub in ("out", "cache", "data", "skipped"):
            os.makedirs(os.path.join(work, sub))
        boxes = box_spec(records, fields, rows) if fields is not None else None
        run_writer(records, options, rows, work, shown or os.path.basename(target), fields, boxes)
        out = os.path.join(work, "out")
        if not os.path.isfile(os.path.join(out, "index.json")):
            raise RuntimeError(f"the shards writer for {target} ended without writing index.json")
        written = finish(out, work, classes, options, description, records, source_rows, fields, boxes)
        check_target(options)  # again: another job (a part's, whose lock is its own) may have written since
        if os.path.isdir(target):
            os.rename(target, os.path.join(work, "replaced"))  # an earlier dataset (check_target)
        os.rename(out, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - started
    chunk_bytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(target, "chunk-*.bin")))
    return {
        "path": target,
        "images": written["samples"],
        "bytes": chunk_bytes,
        "skipped": written["skipped"],
        "seconds": round(seconds, 2),
        "images_per_s": round(len(rows) / seconds, 1) if seconds else None,
        "report": os.path.join(target, "skipped.tsv") if written["skipped"] else None,
    }

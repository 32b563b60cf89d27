"""What feedline adds to LitData's output before it is renamed into place: the files a reader trusts.

    index.json      LitData's, the per-worker ``*.index.json`` it merged removed
    labels.npy      every sample's label, read back from the chunks (which checks them against index.json); for
                    named fields, a class target's index, else 0 (``datasets/shards/fields.py``)
    skipped.tsv     path<TAB>error of each unreadable input, in source order; only when there was one
    feedline.json   the sidecar, written last: the format, the classes, the counts, every setting that
                    decides what a sample holds (the parts of one conversion must agree on them,
                    ``datasets/shards/parts.py``), the source, and each chunk's digest, which the chunk cache
                    checks every download against (``storage/chunk_cache.py``); for named fields
                    (format ``feedline-shards/2``) their schema, "fields" and "target", which the reader
                    builds the source's fields from

An output in which every input was unreadable is refused here, naming the first few, rather than written as
a dataset of no chunks.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import numpy as np

from feedline.datasets.shards.chunks import FORMAT, LABELS, SIDECAR, Chunks, part_name
from feedline.datasets.shards.fields import schema
from feedline.datasets.shards.meta import DIGEST, FIELDS_FORMAT, file_digest
from feedline.writers.options import WriteOptions

log = logging.getLogger(__name__)


def finish(
    out: str,
    work: str,
    classes,
    options: WriteOptions,
    description: str,
    records,
    source_rows: str | None,
    fields=None,
    boxes=None,
) -> dict:
    """Add feedline's sidecar to LitData's output: the labels (read back from the chunks, which also checks
    them against index.json), the classes, the inputs skipped, and every setting that decides what a sample
    holds (the parts of one conversion must agree on them: ``datasets/shards/parts.py``; a part's
    ``source_rows`` too, the digest of the source's rows its job read, ``origin.rows_digest``), and each chunk's
    digest, which the chunk cache checks every download against (``storage/chunk_cache.py``)."""
    for leftover in glob.glob(os.path.join(out, "*.index.json")):  # LitData's per-worker indices, merged
        os.remove(leftover)
    skipped = []
    for report in glob.glob(os.path.join(work, "skipped", "*.tsv")):
        with open(report, encoding="utf-8") as f:
            skipped += [line.rstrip("\n").split("\t", 1) for line in f if line.strip()]
    skipped.sort(key=lambda item: int(item[0]))
    with open(os.path.join(out, "index.json"), encoding="utf-8") as f:
        written_chunks = json.load(f).get("chunks")
    if skipped and not written_chunks:  # LitData wrote an index of no chunks (and no layout)
        first = "; ".join(line.replace("\t", ": ") for _, line in skipped[:3])
        raise ValueError(
            f"all {len(skipped)} inputs of {description or 'the source'}"
            f"{'' if options.parts is None else ' in ' + part_name(options.part, options.parts)} are "
            f"unreadable, so nothing was written ({first}{' ...' if len(skipped) > 3 else ''})"
        )
    label_leaf = (fields.target,) if fields is not None and fields[fields.target].kind == "class" else None
    chunks = Chunks.of([out], label_leaf)
    chunks.check_files()
    labels = chunks.labels()
    np.save(os.path.join(out, LABELS), labels)
    if skipped:
        with open(os.path.join(out, "skipped.tsv"), "w", encoding="utf-8") as f:
            f.write("path\terror\n")
            f.writelines(line + "\n" for _, line in skipped)
        log.warning("skipped %d unreadable input(s); listed in %s", len(skipped), "skipped.tsv of the output")
    named = {} if fields is None else {"fields": schema(fields, boxes), "target": fields.target}
    sidecar = {
        "format": FORMAT if fields is None else FIELDS_FORMAT,
        "classes": list(classes) if fields is None else fields.classes,
        **named,
        "samples": int(len(labels)),
        "skipped": len(skipped),
        "chunks": len(chunks.files),
        "max_side": options.max_side or 0,
        "quality": options.quality,
        "shuffle": options.shuffle is not False,
        "seed": int(options.seed),
        "rows": len(records),  # the source's samples the seeded order was drawn over: parts agree on it
        "part": options.part,
        "parts": options.parts,
        "source": description,
        "source_kind": type(records).__name__,  # the source, wherever it is mounted: FolderRecords, ...
        **({"source_rows": source_rows} if source_rows else {}),  # the source's rows: parts agree on them
        "mode": options.mode,
        "chunk_bytes": options.chunk_byte_count(),
        "chunk_digests": {  # of each whole file, read once more just after the labels were (in the page cache)
            "algorithm": DIGEST,
            "chunks": {os.path.basename(path): file_digest(path, DIGEST) for path in chunks.files},
        },
    }
    with open(os.path.join(out, SIDECAR), "w", encoding="utf-8") as f:
        json.dump(sidecar, f, ensure_ascii=False, indent=1)
    return sidecar

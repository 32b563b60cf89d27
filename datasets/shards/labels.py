"""A shards dataset's labels (``labels.npy``, one per sample, in the order of the chunks) and the counts they
must agree with: read once, checked before any sample is."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os

import numpy as np

from feedline.datasets.cache import json_checksum, write_text
from feedline.datasets.shards.meta import AGAIN, LABELS, SIDECAR, as_store, join


def read_labels(where, rel: str = "") -> np.ndarray:
    """``rel``'s labels.npy, one integer per sample (a local file memory-mapped, a remote one read whole), or
    a ValueError naming it: not an .npy array (garbage, an .npz archive, pickled objects), or not 1-D integers."""
    store = as_store(where)
    name = join(rel, LABELS)
    if not store.remote and os.path.exists(store.where(name)) and not os.path.isfile(store.where(name)):
        raise ValueError(
            f"{store.where(name)} is not a regular file (a FIFO, a folder): convert the dataset again"
        )
    return load_labels(store.where(name), None if not store.remote else lambda: store.read(name))


def load_labels(path: str, read=None) -> np.ndarray:
    """The labels in ``path`` (mapped), or in the bytes ``read()`` returns (``path`` names them)."""
    try:
        labels = np.load(io.BytesIO(read()) if read else path, mmap_mode=None if read else "r")
    except (ValueError, EOFError, OSError) as err:  # not an .npy file, pickled, empty, a folder
        if "pickle" in str(err) or "Python objects" in str(err):  # numpy's advice (unpickle it) runs code
            raise ValueError(
                f"{path} holds pickled objects, not an array of labels; feedline never unpickles a dataset's "
                f"files (that would run code the file names): convert the dataset again"
            ) from None
        raise ValueError(f"{path} is not readable ({err}): convert the dataset again") from None
    if not isinstance(labels, np.ndarray):  # an .npz archive: a mapping of arrays
        getattr(labels, "close", lambda: None)()
        raise ValueError(
            f"{path} is an .npz archive ({type(labels).__name__}), not one .npy array of labels: convert the "
            f"dataset again"
        )
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(
            f"{path} holds {labels.dtype} labels of shape {labels.shape}, not one integer per sample: convert the "
            f"dataset again"
        )
    return labels


def check_counts(shown: str, sidecar: dict, chunks: int, samples: int, labels: int) -> None:
    """A part's three files agree on how many chunks and samples it holds, or a ValueError naming it: files of
    two conversions in one folder, or one of them edited."""
    said = (sidecar.get("chunks", chunks), sidecar["samples"])
    if not samples:  # never written: a conversion that reads no input is refused, and so is an empty part
        raise ValueError(f"{shown} holds no samples (index.json lists none): {AGAIN}")
    if said != (chunks, samples) or labels != samples:
        raise ValueError(
            f"{shown}: {SIDECAR} says {said[1]} samples in {said[0]} chunks, index.json lists {samples} in {chunks}, "
            f"{LABELS} holds {labels} labels: its files are not of one conversion (copied together from two, or "
            f"edited); {AGAIN}"
        )
    digests = len(sidecar["chunk_digests"]["chunks"]) if "chunk_digests" in sidecar else chunks
    if digests != chunks:  # which chunks they are is checked where they are used (``chunk_digests``)
        raise ValueError(
            f"{shown}: {SIDECAR} records the digests of {digests} chunks, index.json lists {chunks}: its files are "
            f"not of one conversion (copied together from two, or edited); {AGAIN}"
        )


BLOCK = 1 << 22  # labels read at once where all of them are (its temporaries: ~50 MB)


def blocks(part: np.ndarray):
    """(start, labels) of ``part`` a block at a time. A mapped file's pages are let go after each block, so a
    pass over 8 GB of labels does not leave 8 GB of file pages in the process's memory."""
    mm = getattr(part, "_mmap", None)
    whole = isinstance(part, np.memmap) and mm is not None and part.base is mm and hasattr(mm, "madvise")
    skip = part.offset % mmap.ALLOCATIONGRANULARITY if whole else 0  # where the array begins in the map
    for a in range(0, len(part), BLOCK):
        yield a, np.asarray(part[a : a + BLOCK])
        if whole:
            end = (skip + min(a + BLOCK, len(part)) * part.itemsize) // mmap.PAGESIZE * mmap.PAGESIZE
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_DONTNEED, 0, end)


def label_facts(index_files, parts, classes: int) -> dict:
    """What a rank needs of a dataset's labels, read once (a block at a time, never concatenated): ``digest``,
    the blake2b of its index.json files' bytes (``index_files``: callables returning them) and of every label as
    int64, in order (the split cache's key: another write order is another split); ``min`` and ``max`` (None:
    no label); ``counts``, the samples of each label, where every label is in ``[0, classes)`` (else None)."""
    h = hashlib.blake2b(digest_size=8)
    for read in index_files:
        h.update(read())
    low = high = None
    counts = np.zeros(0, dtype=np.int64)
    for part in parts:
        for _, block in blocks(part):
            h.update(np.ascontiguousarray(block, dtype=np.int64).data)
            lo, hi = int(block.min()), int(block.max())
            low, high = (lo, hi) if low is None else (min(low, lo), max(high, hi))
            if counts is not None and lo >= 0 and hi < classes:
                add = np.bincount(block.astype(np.intp, copy=False), minlength=classes)
                counts = add if not len(counts) else counts + add
            else:
                counts = None
    return {
        "digest": h.hexdigest(),
        "min": low,
        "max": high,
        "counts": None if counts is None else counts.tolist() if len(counts) else [0] * classes,
    }


def file_stamps(paths) -> list[list]:
    """(path, size, mtime_ns, inode, ctime_ns) of each file: what tells a file read before from one changed
    since (ctime: a file rewritten in place with its size and mtime put back still moves it)."""
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append([str(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns])
    return stamps


def cached_facts(record_path, paths, compute, classes: int) -> dict:
    """``label_facts`` of local files, from the record at ``record_path`` while every file in ``paths`` (its
    index.json and labels.npy files) has the (size, mtime_ns, inode) recorded: a rank pays one stat per file.
    Otherwise ``compute()``, recorded (the first process to read a dataset, once per node)."""
    stamps = file_stamps(paths)
    try:
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
        if (
            record.get("files") == stamps
            and record.get("checksum") == json_checksum(record)
            and (record["counts"] is not None or not _in_range(record, classes))
        ):
            return {k: v for k, v in record.items() if k != "checksum"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: computed again
    facts = compute()
    with contextlib.suppress(OSError):  # a read-only cache: every start reads the labels, as it did
        record = {"files": stamps, **facts}
        write_text(record_path, json.dumps({**record, "checksum": json_checksum(record)}))
    return facts


def _in_range(facts: dict, classes: int) -> bool:
    return facts["min"] is None or 0 <= facts["min"] <= facts["max"] < classes


def compact(labels: np.ndarray) -> np.ndarray:
    """``labels`` in the narrowest of int16 and int32 that holds them (labels already in range): a stable argsort
    of the same values gives the same order, numpy's radix sort for int16, and a quarter of the memory."""
    high = int(labels.max(initial=0))
    dtype = np.int16 if high < 2**15 else np.int32 if high < 2**31 else np.int64
    return labels.astype(dtype)


def class_order_at(parts, counts, idx) -> np.ndarray:
    """``argsort(concatenate(parts), kind="stable")[idx]`` without the argsort, nor the concatenation, of every
    label: the labels (``parts``, a dataset's labels.npy arrays in order) are read a block at a time, each block
    sorted by class on its own (radix on int16), so memory is O(block + len(idx)), not 8 bytes per sample.
    ``counts``: the samples of each class (every label in ``[0, len(counts))``)."""
    counts = np.asarray(counts, dtype=np.int64)
    idx = np.asarray(idx, dtype=np.int64)
    sorter = np.argsort(idx, kind="stable")
    want = idx[sorter]  # class-major positions, ascending
    out = np.empty(len(idx), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    seen = np.zeros(len(counts), dtype=np.int64)  # each class's samples in the blocks before
    offset = 0
    for part in parts if len(want) else []:
        for a, block in blocks(part):
            block = compact(block)
            local = np.argsort(block, kind="stable")  # the block's positions, class by class
            edges = np.searchsorted(block[local], np.arange(len(counts) + 1))
            first, n = edges[:-1], np.diff(edges)  # where each class begins in ``local``, and its samples
            lo = np.searchsorted(want, starts + seen)
            hi = np.searchsorted(want, starts + seen + n)
            for c in np.flatnonzero(hi > lo):
                at = want[lo[c] : hi[c]] - starts[c] - seen[c] + first[c]
                out[sorter[lo[c] : hi[c]]] = local[at] + offset + a
            seen += n
        offset += len(part)
    if len(want) and not np.array_equal(seen, counts):  # counts that do not describe these labels
        raise ValueError(
            f"the labels hold {seen.tolist()[:10]}... samples per class, the split was to be drawn for "
            f"{counts.tolist()[:10]}...: a labels.npy changed while it was read, or its recorded counts are "
            f"damaged; run again (the counts are then read anew)"
        )
    return out

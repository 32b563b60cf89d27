"""A shards dataset's labels (``labels.npy``, one per sample, in the order of the chunks) and the counts they
must agree with: read once, checked before any sample is."""

from __future__ import annotations

import io
import os

import numpy as np

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

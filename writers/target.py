"""What converting again to an output may replace: the earlier conversion's own files, nothing else.

An HDF5 output (``check_replaceable_file``) replaces only an HDF5 file feedline wrote (its ``feedline_format``
attribute): a text file, a foreign HDF5 file or anything else at ``out.path`` is refused by name.

A shards output: one rule for a local directory and an S3 prefix (``own_names``), over every name under the
output (``names_at``: files relative to it, ``/``-separated; a local folder with nothing in it as ``name/``):

- a dataset (``index.json`` and ``feedline.json``): those two, ``labels.npy``, ``skipped.tsv`` and the
  chunks its ``index.json`` names, where a name is a chunk's (``chunk-<w>-<n>.bin``: a name an index gives
  to a README or a nested dataset never makes it the dataset's);
- what a killed upload leaves (no ``index.json``): chunks, ``labels.npy``, ``skipped.tsv``, ``feedline.json``;
- a LitData dataset without feedline's sidecar, anything in a folder (another dataset's parts, a nested
  dataset): never feedline's; a dataset whose index.json does not read: none of it can be told apart.

An output that holds any other name is refused before anything is written or deleted, naming a few of them.
A dataset in parts is among those: a whole conversion never replaces parts, which another job may be
writing (each part's lock is its own); its parts are converted again one by one (``out.part``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from feedline.datasets.shards.chunks import LABELS, PART, SIDECAR, as_store, load_index

CHUNK = re.compile(r"chunk-\d+-\d+\.bin")
SKIPPED = "skipped.tsv"
FIXED = frozenset(("index.json", SIDECAR, LABELS, SKIPPED))
SHOWN = 5  # names listed in a refusal


def names_at(where) -> set[str]:
    """Every name under ``where`` (an S3 store: one listing; a directory: its files, and its empty folders
    as ``name/``, relative to it); none where nothing is there yet."""
    if hasattr(where, "sizes"):
        return set(where.sizes())
    where = str(where)
    if not os.path.lexists(where):
        return set()
    if not os.path.isdir(where) or os.path.islink(where):
        return {""}  # a file where the directory would go: the caller names it
    names = set()
    for root, dirs, files in os.walk(where):
        rel = os.path.relpath(root, where)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        links = [
            d for d in dirs if os.path.islink(os.path.join(root, d))
        ]  # never followed: a name of its own
        names.update(prefix + name for name in files + links)
        if not files and not dirs and prefix:
            names.add(prefix)
    return names


def own_names(where, names: Iterable[str]) -> set[str]:
    """Which of ``names`` (all of them under ``where``, a directory or a store) are the shards dataset's own
    there: what converting again may replace (the module's docstring gives the rule). A dataset whose
    index.json does not read: ``ValueError`` (nothing of it can be told apart)."""
    names = set(names)
    if "index.json" not in names:  # nothing, or what a killed upload of feedline's leaves
        return {n for n in names if n in FIXED or CHUNK.fullmatch(n)}
    if SIDECAR not in names:  # LitData's own dataset (feedline puts index.json only after its sidecar)
        return set()
    try:
        chunks = {str(chunk.get("filename")) for chunk in load_index(where)}
    except (OSError, ValueError, RuntimeError, AttributeError) as err:
        raise ValueError(
            f"out.path={as_store(where).where()} holds a shards dataset whose index.json does not read, so which "
            f"of its files are the dataset's own is unknown and nothing there is replaced ({err}); remove the "
            f"dataset first, or choose another out.path"
        ) from None
    return {n for n in names if n in FIXED or (n in chunks and CHUNK.fullmatch(n))}


def check_replaceable_file(path: str) -> None:
    """Refuse (``ValueError``) an HDF5 output ``path`` that holds anything but an HDF5 file feedline wrote:
    converting again would replace it."""
    if not os.path.lexists(path):
        return
    what = _not_feedline_hdf5(path)
    if what:
        raise ValueError(
            f"out.path={path} holds {what}: converting would replace it, so it is refused (converting again "
            f"replaces only an HDF5 file feedline wrote); remove it first, or choose another out.path"
        )


def _not_feedline_hdf5(path: str) -> str | None:
    """What ``path`` holds, where it is not an HDF5 file feedline wrote; None where it is one."""
    import h5py

    if not os.path.isfile(path):
        return "something that is not a file" if os.path.exists(path) else "a symlink to nothing"
    try:
        if not h5py.is_hdf5(path):
            return "a file that is not HDF5"
        with h5py.File(path, "r") as f:
            if "feedline_format" in f.attrs:
                return None
    except OSError as err:
        return f"an HDF5 file that does not open ({err})"
    return "an HDF5 file feedline did not write (it has no feedline_format attribute)"


def check_replaceable(where, names: Iterable[str], shown: str) -> None:
    """Refuse (``ValueError``) an output ``shown`` (its path or URL) that holds names other than a shards
    dataset's own: converting again would delete them."""
    names = set(names) - {""} if hasattr(where, "sizes") else set(names)  # an S3 console's folder marker
    if names == {""}:
        raise ValueError(f"out.path={shown} is a file, not a directory: choose a directory's path")
    others = sorted(names - own_names(where, names))
    if not others:
        return
    remote = hasattr(where, "sizes")
    what, place = ("objects", "prefix") if remote else ("files", "directory")
    few = ", ".join(others[:SHOWN]) + (f" and {len(others) - SHOWN} more" if len(others) > SHOWN else "")
    parts = sorted({n.split("/", 1)[0] for n in others if PART.fullmatch(n.split("/", 1)[0])})
    if parts:
        then = (
            f"it holds a dataset's parts ({', '.join(parts[:3])}{' ...' if len(parts) > 3 else ''}), which a "
            f"whole conversion never replaces: convert each again with out.part=K out.parts=N, or remove "
            f"them first, or choose another out.path"
        )
    else:
        then = f"move them out, or choose an empty or new {place} for out.path"
    if "index.json" in names and SIDECAR in names:
        raise ValueError(
            f"out.path={shown} holds a shards dataset and {what} of its own ({few}): converting again would "
            f"delete them with the earlier dataset, so it is refused; {then}"
        )
    raise ValueError(
        f"out.path={shown} holds {what} that are not a whole shards dataset's own: it is never overwritten "
        f"({few}); {then}"
    )

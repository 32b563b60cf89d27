"""A shards dataset written locally, put into object storage whole: ``convert.py out.format=shards
out.path=s3://bucket/prefix``.

The reader takes a prefix for a dataset once both ``feedline.json`` and ``index.json`` are there, so the
upload keeps that true only of whole datasets: an earlier dataset at the prefix first stops being one (its
``index.json`` and ``feedline.json`` deleted), then the chunks and labels go up, then ``feedline.json``, then
``index.json`` last; the earlier dataset's other objects are deleted after. A killed upload leaves a prefix
that reads as unfinished (and is named so), never as a dataset; running the conversion again replaces it.
A prefix that holds anything but a shards dataset is never written into.
"""

from __future__ import annotations

import os

from tqdm.auto import tqdm

from feedline.datasets.chunks import SIDECAR, is_complete
from feedline.datasets.stores import S3Store

LAST = (SIDECAR, "index.json")  # in this order, after everything else


def check_remote_target(store: S3Store, parts: bool) -> None:
    """Refuse a prefix that holds other objects than a shards dataset, or (for a part) whose parent holds a
    whole dataset."""
    if parts:
        parent = S3Store(store.url.rsplit("/", 1)[0], store.options, "out.path")
        if parent.exists("index.json"):
            raise ValueError(
                f"out.path={parent.url} holds a whole shards dataset: its parts go elsewhere (another out.path), "
                f"or remove it first"
            )
    existing = store.sizes()
    if existing and not is_complete(store) and not _unfinished(existing):
        raise ValueError(
            f"out.path={store.url} holds other objects, not a shards dataset: it is never overwritten; choose an "
            f"empty or new prefix"
        )


def _unfinished(existing: dict) -> bool:
    """What a killed upload of feedline's leaves: chunks and labels, without both of the last two files."""
    return all(name.startswith("chunk-") or name in ("labels.npy", "skipped.tsv", *LAST) for name in existing)


def upload(local: str, store: S3Store) -> int:
    """Every file of the dataset directory ``local`` to ``store``'s prefix, ``feedline.json`` and
    ``index.json`` last; the objects of an earlier dataset there removed. Returns the bytes put."""
    client = store.client()
    before = store.sizes()
    for name in reversed(LAST):  # an earlier dataset stops reading as one before anything is replaced
        if name in before:
            store._call("delete_object", name, Bucket=store.bucket, Key=store.object_key(name))
    names = sorted(os.listdir(local))
    order = [n for n in names if n not in LAST] + [n for n in LAST if n in names]
    total = sum(os.path.getsize(os.path.join(local, n)) for n in order)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"uploading to {store.url}") as bar:
        for name in order:
            try:
                client.upload_file(
                    os.path.join(local, name), store.bucket, store.object_key(name), Callback=bar.update
                )
            except Exception as err:
                raise store._error(err, name) from err
    for name in sorted(set(before) - set(order)):
        store._call("delete_object", name, Bucket=store.bucket, Key=store.object_key(name))
    return total

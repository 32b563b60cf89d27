"""A shards dataset written locally, put into object storage whole: ``convert.py out.format=shards
out.path=s3://bucket/prefix``.

The reader takes a prefix for a dataset once both ``feedline.json`` and ``index.json`` are there, so the
upload keeps that true only of whole datasets: an earlier dataset at the prefix first stops being one (its
``index.json``, then ``feedline.json``, deleted), then its objects that the new dataset does not write
again are deleted, then the chunks and labels go up, then ``feedline.json``, then ``index.json`` last. A
killed upload leaves a prefix that reads as unfinished (and is named so), never as a dataset, and holds
only names that running the conversion again replaces.

Only the earlier dataset's own objects are ever deleted or replaced (``target.py``, the rule a local
directory keeps too): a prefix that holds any other object (a README, a nested dataset) is refused before
anything is deleted or written, naming them.

Two conversions to one prefix at once (from two machines: the lock, ``writers/lock.py``, is one machine's)
would leave one's index over the other's chunks. So each object is put with this upload's token in its
metadata and its ETag read back, and before ``feedline.json`` and ``index.json`` go up, one listing must
show exactly the objects this upload put, unchanged: otherwise nothing is published, and the error says so.
"""

from __future__ import annotations

import os
import socket
import uuid

from feedline.datasets.shards.chunks import SIDECAR
from feedline.storage.stores import S3Store
from feedline.writers.lock import OutputBusyError
from feedline.writers.progress import progress
from feedline.writers.target import SHOWN, check_replaceable, own_names

LAST = (SIDECAR, "index.json")  # in this order, after everything else
TOKEN = "feedline-upload"  # the metadata key that names the upload that put an object


def check_remote_target(store: S3Store, parts: bool) -> None:
    """Refuse a prefix that holds other objects than a shards dataset's own, or (for a part) whose parent
    holds a whole dataset."""
    if parts:
        parent = S3Store(store.url.rsplit("/", 1)[0], store.options, "out.path")
        if parent.exists("index.json"):
            raise ValueError(
                f"out.path={parent.url} holds a whole shards dataset: its parts go elsewhere (another out.path), "
                f"or remove it first"
            )
    check_replaceable(store, store.sizes(), store.url)


def upload(local: str, store: S3Store) -> int:
    """Every file of the dataset directory ``local`` to ``store``'s prefix, ``feedline.json`` and
    ``index.json`` last, in place of the earlier dataset's own objects there. Returns the bytes put."""
    client = store.client()
    before = set(store.sizes())
    check_replaceable(store, before, store.url)  # again, from this listing: nothing deleted unless it is own
    own = own_names(store, before)
    names = sorted(os.listdir(local))
    gone = [n for n in LAST[::-1] if n in own]  # an earlier dataset stops reading as one first
    gone += sorted(own - set(names) - set(LAST))  # then what this one does not write again
    for name in gone:
        store._call("delete_object", name, Bucket=store.bucket, Key=store.object_key(name))
    order = [n for n in names if n not in LAST] + [n for n in LAST if n in names]
    total = sum(os.path.getsize(os.path.join(local, n)) for n in order)
    host = socket.gethostname().encode("ascii", "replace").decode()  # metadata is ASCII
    token = f"{host} pid {os.getpid()} {uuid.uuid4().hex[:12]}"
    put: dict[str, str | None] = {}  # name -> the ETag this upload put it with
    publish = next((n for n in order if n in LAST), None)
    with progress(total, f"uploading to {store.url}", "B", unit_scale=True) as bar:
        for name in order:
            if name == publish:  # the dataset is published next: only what this upload wrote
                _check_alone(store, put)
            try:
                client.upload_file(
                    os.path.join(local, name),
                    store.bucket,
                    store.object_key(name),
                    ExtraArgs={"Metadata": {TOKEN: token}},
                    Callback=bar.update,
                )
            except Exception as err:
                raise store._error(err, name) from err
            head = store._call("head_object", name, Bucket=store.bucket, Key=store.object_key(name))
            if head.get("Metadata", {}).get(TOKEN) != token:
                _busy(store, [name])
            put[name] = head.get("ETag")
    return total


def _check_alone(store: S3Store, put: dict) -> None:
    """Refuse to publish where the prefix holds other objects than those this upload put, or other bytes."""
    now = store.listing()
    changed = sorted(
        (set(now) - set(put) - {""}) | {n for n in put if (now.get(n) or (0, None))[1] != put[n]}
    )
    if changed:
        _busy(store, changed)


def _busy(store: S3Store, changed: list[str]) -> None:
    few = ", ".join(changed[:SHOWN]) + (f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else "")
    raise OutputBusyError(
        f"out.path={store.url} changed while this conversion uploaded to it ({few}: not as this conversion "
        f"put them): another conversion, or someone else, is writing there too. Nothing was published (no "
        f"index.json there); run one conversion per out.path at a time, then convert again"
    )

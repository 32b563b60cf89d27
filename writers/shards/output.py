"""Where a shards conversion writes, and what it may replace there.

    out.path=/data/train-shards                 the dataset's directory (a symlink's target: the link stays)
    out.path=... out.part=K out.parts=N         its K-th part, ``out.path/part-0000K-of-0000N``
    out.path=s3://bucket/prefix                 the prefix, or its part's; written through ``S3Store``

An output is replaced whole, so it may hold only an earlier shards dataset's own files (``writers/target.py``,
``upload.check_remote_target`` for a prefix); a part is refused where ``out.path`` holds a whole dataset.
Every refusal names ``out.path`` and what to do. The check runs before anything is written and once more
just before the new dataset is renamed into place, since another part's job may have written meanwhile.
"""

from __future__ import annotations

import os

from feedline.datasets.shards.chunks import part_name
from feedline.storage.stores import S3Store, is_url
from feedline.writers.options import WriteOptions
from feedline.writers.target import check_replaceable, names_at
from feedline.writers.upload import check_remote_target


def output_dir(options: WriteOptions) -> str:
    """The directory (or URL) this conversion writes: ``out.path``, or its part's folder in it."""
    if is_url(options.path):
        url = S3Store(options.path, options.storage_options, "out.path").url  # "s3://" alone is refused
        return f"{url}/{part_name(options.part, options.parts)}" if options.parts is not None else url
    # a symlink's target: the dataset replaces what the link points at (on that filesystem), not the link
    path = os.path.realpath(os.path.expanduser(str(options.path)))
    return os.path.join(path, part_name(options.part, options.parts)) if options.parts is not None else path


def remote_store(options: WriteOptions) -> S3Store:
    return S3Store(output_dir(options), options.storage_options, "out.path")


def check_target(options: WriteOptions) -> str:
    """The output directory, once writing it cannot overwrite anything but an earlier shards dataset."""
    target = output_dir(options)
    if is_url(target):
        check_remote_target(remote_store(options), options.parts is not None)
        return target
    if options.parts is not None and os.path.isfile(os.path.join(os.path.dirname(target), "index.json")):
        raise ValueError(
            f"out.path={os.path.dirname(target)} holds a whole shards dataset: its parts go elsewhere "
            f"(another out.path), or remove it first"
        )
    check_replaceable(target, names_at(target), target)  # the directory is replaced whole: only its own files
    return target

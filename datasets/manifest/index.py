"""The index of one table: every field's column, checked and packed, built once per node and mapped everywhere.

    <cache_dir>/manifest/<table name>-<digest>/
        <field>.<array>.npy   the field's arrays (``columns.py``: paths and text as one uint8 blob + int64
                              offsets, class indices, float64 numbers, float32 vectors; images a Parquet
                              table holds itself: their bytes as one blob + offsets)
        meta.json             the table, its content digest, the rows, each field's class list, the columns
                              of embedded images,
                              written last with its own checksum: an index without it is never read

The directory's digest hashes the table's path and content digest, ``source.root``, the fields as configured
and the class lists given from another table, so a changed table (even one rewritten within a timestamp tick)
or other fields get a new index. Each array is written atomically with its checksum (``cache.save_array``); a
damaged one is found on load and the index rebuilt, with a warning. Splits drawn from the table are cached in
the same directory (``splits.py``).
"""

from __future__ import annotations

import json
import logging
import os
import time

from feedline.datasets.arrays import LazyArray
from feedline.datasets.cache import (
    cache_path,
    check_array,
    checked_meta,
    json_checksum,
    save_array,
    write_text,
)
from feedline.datasets.fields import SPATIAL, Field
from feedline.datasets.manifest import columns
from feedline.datasets.manifest.tables import read_table

log = logging.getLogger(__name__)

FORMAT = 2  # 2: NaN and infinite numbers refused; an index built before may hold them
ARRAYS = {
    "image": ("text", "offsets"),
    "mask": ("text", "offsets"),
    "text": ("text", "offsets"),
    "json": ("text", "offsets"),
    "class": ("labels",),
    "classes": ("indices", "offsets"),
    "number": ("numbers",),
    "vector": ("vectors",),
}
EMBEDDED = ("bytes", "offsets")  # an image or mask column of encoded files (Parquet), not paths
PROGRESS_ROWS = 10_000  # a table this long shows a progress bar while its paths are checked


def open_index(table: str, digest: str, root: str, specs: list[Field], cache_dir=None) -> dict:
    """The index of ``table`` for ``specs`` (fields as configured; a class list given where another table fixes
    it): read from the cache, else built and cached. A dict: ``meta`` (rows, classes per field, ...), ``arrays``
    (``<field>.<array>`` -> LazyArray) and ``directory``."""
    key = [FORMAT, table, digest, root, [_spec(f) for f in specs]]
    directory = cache_path("manifest", os.path.splitext(os.path.basename(table))[0], key, cache_dir)
    index = _load(directory, specs)
    if index is None:
        started = time.perf_counter()
        arrays, found, rows = _build(table, root, specs)
        for name, array in arrays.items():
            save_array(directory / f"{name}.npy", array)
        meta = {"format": FORMAT, "table": table, "digest": digest, "root": root, "rows": rows, **found}
        meta["checksum"] = json_checksum(meta)
        write_text(directory / "meta.json", json.dumps(meta, ensure_ascii=False))  # last
        index = _load(directory, specs)
        log.info("indexed %d rows of %s in %.2f s", rows, table, time.perf_counter() - started)
    index["directory"] = directory
    return index


def _spec(f: Field) -> list:
    return [f.name, f.kind, f.source_column, None if f.classes is None else list(f.classes), f.separator]


def _build(table_path: str, root: str, specs: list[Field]) -> tuple[dict, dict, int]:
    table = read_table(table_path, {f.source_column for f in specs})
    for f in specs:
        table.require(f.source_column, f"source.fields.{f.name}.column")
    arrays, classes, embedded = {}, {}, []
    spatial = [f for f in specs if f.kind in SPATIAL]
    bar = None
    if spatial and table.rows >= PROGRESS_ROWS:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=table.rows * len(spatial),
            desc=f"checking {table_path}",
            unit="path",
            delay=1.0,
            leave=False,
        )
    try:
        for f in specs:
            column = f.source_column

            def where(row, column=column):
                return columns.cell(table_path, row, column)

            cells = table.column(column)
            if f.kind in SPATIAL and columns.is_embedded(cells):
                out = columns.embedded(cells, where)
                embedded.append(f.name)
                if bar is not None:
                    bar.update(len(cells))
            elif f.kind in SPATIAL:
                out = columns.paths(cells, root, where, bar)
            elif f.kind in ("text", "json"):
                out = columns.texts(cells, f.kind, where)
            elif f.kind == "class":
                out, classes[f.name] = columns.labels(cells, f, where)
            elif f.kind == "classes":
                out, classes[f.name] = columns.multi_labels(cells, f, where)
            elif f.kind == "number":
                out = columns.numbers(cells, where)
            else:
                out = columns.vectors(cells, where)
            arrays.update({f"{f.name}.{name}": array for name, array in out.items()})
    finally:
        if bar is not None:
            bar.close()
    return arrays, {"classes": classes, "embedded": embedded}, table.rows


def _load(directory, specs: list[Field]) -> dict | None:
    """The cached index in ``directory``, or None when there is none or it is damaged (with a warning)."""
    try:
        meta = checked_meta(directory, FORMAT)
        if meta is None:
            return None
        arrays = {}
        for f in specs:
            for part in EMBEDDED if f.name in meta["embedded"] else ARRAYS[f.kind]:
                name = f"{f.name}.{part}"
                reason = check_array(directory / f"{name}.npy")
                if reason:
                    raise ValueError(reason)
                arrays[name] = LazyArray(directory / f"{name}.npy")
                arrays[name].array  # noqa: B018 - mapped now: workers inherit this file, or refuse a new one
    except (OSError, ValueError, KeyError, TypeError) as err:
        why = f"{type(err).__name__}: {err}" if isinstance(err, KeyError) else err
        log.warning("the manifest index %s is damaged (%s); rebuilding it", directory, why)
        return None
    return {"meta": meta, "arrays": arrays}

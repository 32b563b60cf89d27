"""Write any source's samples into one HDF5 file (the layout ``datasets/hdf5/source.py`` reads).

Every input is decoded (which validates it) in a process pool, resized when asked, and written in
chunks, in the source's sample order. The file is written under a temporary name and renamed into place
at the end: an interrupted conversion leaves no file that looks complete, and a rerun starts clean.
One conversion writes an output at a time (``writers/lock.py``): a second is refused before it touches the
first one's files, and a file at ``out.path`` is replaced only where it is an HDF5 file feedline wrote
(``target.py``). Unreadable inputs are skipped and listed in ``<out>.skipped.tsv``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor

import h5py
import numpy as np

from feedline.datasets.fields import fields_of
from feedline.datasets.folder.scan import available_cpus
from feedline.datasets.hdf5.layout import FORMAT, RAGGED, RAGGED_BYTES
from feedline.writers.hdf5_fields import FieldColumns
from feedline.writers.lock import OutputBusyError, writer_lock
from feedline.writers.options import HDF5WriteOptions
from feedline.writers.origin import check_not_input, recorded_source
from feedline.writers.prepare import init_worker, prepare_chunk
from feedline.writers.progress import progress
from feedline.writers.target import check_replaceable_file

log = logging.getLogger(__name__)


# -- writer side ----------------------------------------------------------------------------------------
def convert_source(source, options: HDF5WriteOptions, lock: bool = True) -> dict:
    """Prepare ``source`` and write every sample of it (``split("all")``, its val share included) to
    ``options.path``. ``lock``: take the output's writer lock first (False: the caller holds it)."""
    boxes = fields_of(source).of_kind("boxes")
    if boxes:  # before the output is taken: nothing half-written
        raise ValueError(
            f"out.format=hdf5 does not store a boxes field ({boxes[0].name}): convert with out.format=shards, "
            "which stores boxes, labels and instance masks per sample"
        )
    with _writing(options, lock, source) as out_path:
        source.prepare()
        fields = fields_of(source)
        fields = None if fields.is_classification else fields
        records = source.split("all")
        return _write(records, source.classes, options, out_path, recorded_source(source), fields)


def convert(
    records, classes: list[str], options: HDF5WriteOptions, description: str = "", lock: bool = True
) -> dict:
    """Write ``records`` to ``options.path``; returns the summary (images, bytes, skipped, seconds)."""
    with _writing(options, lock) as out_path:
        return _write(records, classes, options, out_path, description)


@contextlib.contextmanager
def _writing(options: HDF5WriteOptions, lock: bool, source=None):
    """The output's absolute path, its directory made, held by this process alone (``writers/lock.py``):
    a second conversion to it is refused before it touches the first one's scratch files. Refused before
    anything is written: an output that is ``source``'s own data (``origin.py``), or a file there that is not
    an HDF5 file feedline wrote (``target.py``)."""
    check_output(options)
    out_path = os.path.abspath(os.path.expanduser(str(options.path)))
    if source is not None:
        check_not_input(source, out_path, directory=False)
    check_replaceable_file(out_path)
    directory = os.path.dirname(out_path)
    with contextlib.ExitStack() as held:
        try:
            os.makedirs(directory, exist_ok=True)
            if lock:
                held.enter_context(writer_lock(out_path, "conversion", "out.path"))
        except OutputBusyError:
            raise
        except OSError as err:
            why = "is a file" if os.path.isfile(directory) else f"refuses new files ({err.strerror})"
            raise OSError(
                f"out.path={out_path} cannot be written: {directory} {why}; choose a directory you can write to"
            ) from None
        yield out_path


def check_output(options: HDF5WriteOptions) -> None:
    """Every ``out.*`` key in range on this machine, or an error naming it, before any work starts."""
    options.check()
    _workers(options)


def _workers(options: HDF5WriteOptions) -> int:
    """``out.workers`` as a process count: auto is one per CPU; more than 8 per CPU is refused (each is a
    process of its own, importing torch: thousands exhaust memory, and no storage is that slow)."""
    cpus = available_cpus()
    if options.workers in ("auto", None):
        return cpus
    workers = int(options.workers)
    if workers > 8 * cpus:
        raise ValueError(
            f"out.workers={workers} starts that many processes on {cpus} CPU(s): at most {8 * cpus} (8 per CPU) "
            f"helps, even reading slow storage; set out.workers=auto ({cpus})"
        )
    return workers


def _write(
    records, classes: list[str], options: HDF5WriteOptions, out_path: str, description: str, fields=None
) -> dict:
    """``fields``: the source's named fields (its records read dicts), each written to a dataset of its own
    (``hdf5_fields.py``); None: images and ``labels``."""
    partial = out_path + ".partial"
    report = out_path + ".skipped.tsv"
    n = len(records)
    chunk = int(options.chunk)
    workers = max(1, min(_workers(options), -(-n // chunk)))  # never more processes than tasks
    started = time.perf_counter()
    skipped: list[str] = []
    written = 0
    spool = _Spool(partial + ".spool")
    try:
        with h5py.File(partial, "w") as f:
            if fields is None:
                labels = f.create_dataset("labels", shape=(n,), maxshape=(None,), dtype=np.int64)
            columns = FieldColumns(f, fields) if fields is not None else None
            tasks = [range(start, min(n, start + chunk)) for start in range(0, n, chunk)]
            with (
                ProcessPoolExecutor(
                    workers, initializer=init_worker, initargs=(records, options, os.getpid(), fields)
                ) as pool,
                progress(n, f"converting to {os.path.basename(out_path)}", "img") as bar,
            ):
                for results in pool.map(prepare_chunk, tasks):
                    rows = [(p, lab) for p, lab, err in results if err is None]
                    skipped.extend(err for _, _, err in results if err is not None)
                    if rows:
                        spool.extend(p for p, _ in rows)
                        if columns is not None:
                            columns.append([lab for _, lab in rows])
                        else:
                            labels[written : written + len(rows)] = [lab for _, lab in rows]
                        written += len(rows)
                    bar.update(len(results))
            spool.write_to(f, RAGGED_BYTES if options.mode != "raw" else "hwc" if options.size else RAGGED)
            if columns is None:
                labels.resize((written,))
            f.attrs.update(columns.finish() if columns is not None else {})
            if classes:  # a field target without a class list (a number) has none
                f.attrs["classes"] = json.dumps(list(classes), ensure_ascii=False)
            f.attrs.update(
                {
                    "feedline_format": FORMAT,
                    "mode": options.mode,
                    "max_side": options.max_side or 0,
                    "size": options.size or 0,
                    "quality": options.quality,
                    "source": description,
                    "skipped": len(skipped),
                }
            )
        check_replaceable_file(out_path)  # again: the lock keeps other conversions out, not other writers
        os.replace(partial, out_path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    finally:
        spool.remove()
    if skipped:
        with open(report, "w", encoding="utf-8") as f:
            f.write("path\terror\n")
            f.writelines(line.replace("\n", " ") + "\n" for line in skipped)
        log.warning("skipped %d unreadable input(s); listed in %s", len(skipped), report)
    elif os.path.exists(report):
        os.remove(report)
    seconds = time.perf_counter() - started
    return {
        "path": out_path,
        "images": written,
        "bytes": os.path.getsize(out_path),
        "skipped": len(skipped),
        "seconds": round(seconds, 2),
        "images_per_s": round(n / seconds, 1) if seconds else None,
        "report": report if skipped else None,
    }


class _Spool:
    """Rows (encoded bytes, or raw HWC pixels), appended to a scratch file as they come and copied into one
    contiguous dataset at the end, so readers can memory-map it: the exact size is known only once every
    input is decoded (skipped inputs, aspect ratios, encoded sizes), and a contiguous HDF5 dataset cannot
    grow or shrink."""

    def __init__(self, path: str):
        self.path = path
        self.shapes: list[tuple[int, ...]] = []
        self._file = open(path, "wb")  # noqa: SIM115 - closed in write_to() / remove()

    def extend(self, arrays) -> None:
        for array in arrays:
            self._file.write(memoryview(np.ascontiguousarray(array)).cast("B"))
            self.shapes.append(tuple(int(d) for d in array.shape))

    def write_to(self, f: h5py.File, layout: str, block: int = 64 << 20) -> None:
        """``images`` in ``layout``: ``hwc``, fixed-size raw rows (N, S, S, 3); else one flat uint8 array of
        every row's bytes with ``offsets`` (N + 1) to find row i, and for raw pixels (``ragged-hwc``) their
        ``shapes`` (N, 3); encoded rows (``ragged-bytes``) are whole files."""
        self._file.close()
        sizes = np.asarray([int(np.prod(shape)) for shape in self.shapes], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if layout == "hwc":
            row_shape = self.shapes[0] if self.shapes else (1, 1, 3)
            images = f.create_dataset("images", shape=(len(sizes), *row_shape), dtype=np.uint8)
        else:
            row_shape = ()
            images = f.create_dataset("images", shape=(int(offsets[-1]),), dtype=np.uint8)
            f.create_dataset("offsets", data=offsets)
            if layout == RAGGED:
                shapes = np.asarray(self.shapes, dtype=np.int32).reshape(-1, 3)
                f.create_dataset("shapes", data=shapes)
        images.attrs["layout"] = layout
        row = int(np.prod(row_shape))  # bytes per dataset row: a block holds whole rows
        rows = max(1, block // row)
        with open(self.path, "rb") as spool:
            for start in range(0, len(images), rows):
                data = np.frombuffer(spool.read(rows * row), dtype=np.uint8)
                images[start : start + len(data) // row] = data.reshape(-1, *row_shape)

    def remove(self) -> None:
        self._file.close()
        if os.path.exists(self.path):
            os.remove(self.path)

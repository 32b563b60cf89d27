"""Write any source's samples as shards (the layout ``datasets/chunks.py`` reads), with LitData's writer.

Every input is decoded (which validates it) and resized when asked by the same worker code as the HDF5
writer (``prepare.py``), in ``litdata.optimize``'s worker processes, which write ``(image bytes, label)``
tuples into chunks of ``out.chunk_bytes`` in the order given: the source's, or a seeded random one
(``out.shuffle``) so that each chunk mixes the classes. ``out.part=K out.parts=N`` writes the K-th of N
equal slices of that order into ``out.path/part-0000K-of-0000N``.

Atomic: everything is written in a work directory beside the output (``.<name>.tmp-<pid>``), the chunks in
its ``out/``; once LitData's ``index.json`` exists, feedline adds its sidecar (classes, labels) and renames
``out/`` into place. A killed conversion leaves only the work directory, which no reader takes for a
dataset and the next conversion removes. LitData runs in a child process of its own, in its own process
group, with its own scratch folders: it sets the start method and a SIGINT handler of its own there, and an
abort kills the whole group. One conversion writes an output at a time (``writers/lock.py``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import stat
import tempfile
import time
import traceback

import numpy as np

from feedline.datasets.cache_trust import mine
from feedline.datasets.chunks import FORMAT, LABELS, SIDECAR, Chunks, part_name
from feedline.datasets.shard_meta import DIGEST, file_digest
from feedline.datasets.stores import S3Store, is_url
from feedline.writers import prepare
from feedline.writers.hdf5 import _workers
from feedline.writers.lock import writer_lock
from feedline.writers.options import WriteOptions
from feedline.writers.origin import check_not_input, recorded_source, rows_digest
from feedline.writers.progress import progress
from feedline.writers.target import check_replaceable, names_at
from feedline.writers.upload import check_remote_target, upload

log = logging.getLogger(__name__)
POLL_S = 0.2


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


def convert_source(source, options: WriteOptions, lock: bool = True) -> dict:
    """Prepare ``source`` and write every sample of it (``split("all")``) as shards into ``out.path``."""
    options.check()
    check_not_input(source, output_dir(options), options.storage_options)
    target = check_target(options)
    with _locked(target, lock):
        source.prepare()
        return _write_to(source.split("all"), source.classes, options, target, recorded_source(source))


def convert(
    records, classes: list[str], options: WriteOptions, description: str = "", lock: bool = True
) -> dict:
    options.check()
    target = check_target(options)
    with _locked(target, lock):
        return _write_to(records, classes, options, target, description)


def _write_to(records, classes, options: WriteOptions, target: str, description: str) -> dict:
    """Write locally; a URL's dataset is written in a private scratch directory of its own under the temp dir
    (``$TMPDIR``: ``tempfile.mkdtemp``, never a folder that was there before), then uploaded whole
    (``upload.py``)."""
    if not is_url(target):
        return _write(records, classes, options, target, description)
    # named for the URL and this process, and made afresh (mode 0o700, a name no one else can take first: a
    # folder of that name made by another user is never written into); a killed conversion's copy (its
    # process gone) is found and removed by the next one, only where it is this user's
    stem = f"{_lock_path(target)}.scratch-"
    for stale in glob.glob(f"{glob.escape(stem)}*"):
        if not _alive(stale[len(stem) :].split("-", 1)[0]) and _own_folder(stale):
            shutil.rmtree(stale, ignore_errors=True)
    scratch = tempfile.mkdtemp(prefix=f"{os.path.basename(stem)}{os.getpid()}-", dir=os.path.dirname(stem))
    try:
        summary = _write(records, classes, options, os.path.join(scratch, "dataset"), description, target)
        summary["bytes"] = upload(summary["path"], remote_store(options))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary["path"] = target
    if summary["report"]:
        summary["report"] = f"{target}/skipped.tsv"
    return summary


def _lock_path(url: str) -> str:
    """The local lock file of a conversion to ``url`` (under the temp dir); its scratch copies sit beside it."""
    return os.path.join(
        tempfile.gettempdir(), f"feedline-upload-{hashlib.blake2b(url.encode(), digest_size=8).hexdigest()}"
    )


def _own_folder(path: str) -> bool:
    """Whether ``path`` is a folder of this user's (not a symlink): a scratch copy a conversion of ours made."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and mine(st)


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def _locked(target: str, lock: bool):
    """One conversion at a time per output (on this machine, for a URL: a lock file under the temp dir)."""
    if is_url(target):
        target = _lock_path(target)
    with writer_lock(target, "conversion", "out.path") if lock else contextlib.nullcontext():
        yield


def rows_to_write(n: int, options: WriteOptions) -> np.ndarray:
    """The source rows this conversion writes, in order: all of them, or its part's slice of them."""
    order = np.arange(n, dtype=np.int64)
    if options.shuffle is not False:
        order = np.random.default_rng([int(options.seed), n]).permutation(n)
    if options.parts is not None:
        k, parts = int(options.part), int(options.parts)
        order = order[k * n // parts : (k + 1) * n // parts]
    return order


def _write(records, classes, options: WriteOptions, target: str, description: str, shown: str = "") -> dict:
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
        _run_writer(records, options, rows, work, shown or os.path.basename(target))
        out = os.path.join(work, "out")
        if not os.path.isfile(os.path.join(out, "index.json")):
            raise RuntimeError(f"the shards writer for {target} ended without writing index.json")
        written = _finish(out, work, classes, options, description, records, source_rows)
        check_target(
            options
        )  # again: another job (a part's, whose lock is its own) may have written there since
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


def _finish(
    out: str, work: str, classes, options: WriteOptions, description: str, records, source_rows: str | None
) -> dict:
    """Add feedline's sidecar to LitData's output: the labels (read back from the chunks, which also checks
    them against index.json), the classes, the inputs skipped, and every setting that decides what a sample
    holds (the parts of one conversion must agree on them: ``datasets/shard_parts.py``; a part's
    ``source_rows`` too, the digest of the source's rows its job read, ``origin.rows_digest``), and each chunk's
    digest, which the chunk cache checks every download against (``datasets/chunk_cache.py``)."""
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
    chunks = Chunks.of([out])
    chunks.check_files()
    labels = chunks.labels()
    np.save(os.path.join(out, LABELS), labels)
    if skipped:
        with open(os.path.join(out, "skipped.tsv"), "w", encoding="utf-8") as f:
            f.write("path\terror\n")
            f.writelines(line + "\n" for _, line in skipped)
        log.warning("skipped %d unreadable input(s); listed in %s", len(skipped), "skipped.tsv of the output")
    sidecar = {
        "format": FORMAT,
        "classes": list(classes),
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


def _run_writer(records, options: WriteOptions, rows: np.ndarray, work: str, name: str) -> None:
    """Run ``litdata.optimize`` in a child process in its own process group, with a progress bar here;
    any exception here (Ctrl-C included) kills that group before it goes on."""
    context = multiprocessing.get_context("fork")
    done = context.Value("q", 0)
    receive, send = context.Pipe(duplex=False)
    runner = context.Process(
        target=_runner, args=(records, options, rows, work, done, send, os.getpid()), daemon=False
    )
    runner.start()
    send.close()
    try:
        with progress(len(rows), f"converting to {name}", "img") as bar:
            while runner.is_alive() or receive.poll():
                runner.join(POLL_S)
                bar.update(done.value - bar.n)
                if receive.poll():
                    break
            bar.update(done.value - bar.n)
        runner.join()
        error = receive.recv() if receive.poll() else f"it exited with status {runner.exitcode}"
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(runner.pid, signal.SIGKILL)
        runner.join()
        raise
    finally:
        receive.close()
    if error is not None:
        raise RuntimeError(f"writing shards failed: {error}")


_done = None  # the shared count of samples handled (set in the runner, inherited by LitData's workers)
_skipped_dir = None
_runner_pid = None
_tied = False


def _runner(records, options, rows, work, done, send, parent) -> None:
    global _done, _skipped_dir, _runner_pid
    os.setpgid(0, 0)  # LitData's workers join this group: an abort kills them all at once
    prepare.die_with(parent)
    _reaper()
    logging.getLogger("litdata").setLevel(logging.WARNING)  # its INFO lines are about its own cache
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = os.path.join(work, "cache")
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = os.path.join(work, "data")
    _done, _skipped_dir, _runner_pid = done, os.path.join(work, "skipped"), os.getpid()
    prepare.init_worker(records, options, os.getpid())
    try:
        from litdata import optimize

        optimize(
            fn=_samples,
            inputs=rows.tolist(),
            output_dir=os.path.join(work, "out"),
            chunk_bytes=options.chunk_byte_count(),
            num_workers=max(1, min(_workers(options), len(rows))),
            start_method="fork",
            keep_data_ordered=True,  # chunk order = input order: worker w writes the w-th slice
            verbose=False,
        )
        send.send(None)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it
        send.send(f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}")
    finally:
        send.close()
    os._exit(0)


def _reaper() -> None:
    """Fork a process that kills this process group once its parent (the runner) is gone: LitData's workers
    start processes of their own, which a parent-death signal does not reach."""
    runner = os.getpid()
    if os.fork():
        return
    try:
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
        prepare.die_with(runner, signal.SIGTERM)
        while True:
            signal.pause()
    finally:
        os._exit(0)


def _samples(row: int):
    """LitData's ``fn``: the sample of source row ``row`` as (image bytes, int label), or nothing when the
    input is unreadable (listed in the skipped report)."""
    global _tied
    if not _tied:
        prepare.die_with(_runner_pid)
        _tied = True
    data, label, error = prepare.prepare(int(row))
    if error is None:
        yield bytes(np.ascontiguousarray(data, dtype=np.uint8).data), int(label)
    else:
        with open(os.path.join(_skipped_dir, f"{os.getpid()}.tsv"), "a", encoding="utf-8") as f:
            f.write(f"{int(row)}\t{error.replace(chr(10), ' ')}\n")
    with _done.get_lock():
        _done.value += 1

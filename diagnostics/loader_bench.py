"""Measurements behind ``bench.py``: the train loader's rate, a per-stage breakdown, a worker sweep and
one model step. Each function returns plain numbers; ``diagnostics.verdict`` reads them and ``diagnostics.report``
prints them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader

from feedline.datamodules.bad_samples import BadSampleError
from feedline.transforms.decode import DecodeError
from feedline.transforms.deferred import PendingCrop

log = logging.getLogger(__name__)

# "crop": a train stack's crop and flip that the collate finishes (``transforms.deferred``), timed apart from
# the collate proper, so a stack folded into the collate is not mistaken for collate cost.
STAGES = ("read", "decode", "transform", "crop", "collate", "ipc")
STAGE_NAMES = {"crop": "crop (done in collate)"}  # how the report, the picture and the verdict name a stage

# Every duration here is read from this clock; tests replace it with one that only sleepy stages advance.
clock = time.perf_counter


def _nbytes(payload) -> int:
    return int(getattr(payload, "nbytes", None) or len(payload))


_MAGIC = ((b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"))


def payload_format(payload) -> str:
    """What the source hands the decoder: "jpeg", "png", "other" (encoded bytes of another format), or "raw"
    (a pixel array: nothing to decode)."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        head = bytes(payload[:8])
    else:
        array = np.asarray(payload)
        if array.ndim != 1 or array.dtype != np.uint8:
            return "raw"
        head = array[:8].tobytes()
    return next((name for magic, name in _MAGIC if head.startswith(magic)), "other")


def measure_loader(
    loader: DataLoader,
    batches: int,
    seconds: float | None = None,
    warmup: int = 2,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Iterate ``loader`` for ``batches`` batches (or ``seconds``) after ``warmup`` batches; no model."""
    check_warmup(loader, warmup)
    iterator = iter(loader)
    for _ in range(warmup):
        if next(iterator, None) is None:
            raise ValueError("the train split has fewer batches than bench.warmup: lower bench.warmup")
    samples, done, start = 0, 0, clock()
    for batch in iterator:
        samples += len(batch[1])
        done += 1
        if progress is not None:
            progress(1)
        elapsed = clock() - start
        if (seconds is None and done >= batches) or (seconds is not None and elapsed >= seconds):
            break
    elapsed = clock() - start
    if done == 0:
        raise ValueError("no batches left after the warm-up: lower bench.warmup or use more data")
    if (done < batches) if seconds is None else (elapsed < seconds):
        asked = f"bench.seconds={seconds}" if seconds is not None else f"bench.batches={batches}"
        log.warning(
            "the train split ran out after %d batch(es) (%.2f s) past the warm-up: measured those, not %s",
            done,
            elapsed,
            asked,
        )
    return {
        "samples": samples,
        "batches": done,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        "batches_per_s": done / elapsed,
    }


def check_warmup(loader: DataLoader, warmup: int) -> None:
    """Before any batch is read: the warm-up leaves at least one batch of the epoch to time, or an error
    naming the batches there are and both keys that change it."""
    try:
        batches, samples = len(loader), len(loader.sampler)
    except TypeError:  # a loader without a length: found out as it runs
        return
    if warmup >= batches:
        raise ValueError(
            f"the train split has {batches} batch(es) of {loader.batch_size} ({samples} samples), and "
            f"bench.warmup={warmup} skips {warmup} before timing, which leaves none: "
            + (
                f"set bench.warmup={batches - 1} or less, or lower data.batch_size"
                if batches > 1
                else "set bench.warmup=0, or lower data.batch_size (or bench a larger split)"
            )
        )


def ship(batch) -> None:
    """What a worker does to hand a batch to the main process: put every tensor in a fresh shared-memory
    segment (torch allocates one per batch; on some VMs its page faults cost more than the copy)."""
    for field in batch:
        if isinstance(field, torch.Tensor) and not field.is_shared():
            out = torch.empty(0, dtype=field.dtype).set_(torch.UntypedStorage._new_shared(field.nbytes))
            out.copy_(field.reshape(-1))


def stage_breakdown(dataset, collate, indices: list[int], batch_size: int, workers: int = 0) -> dict:
    """Time each stage of the dataset's own pipeline (``SampleDataset.read_many``, ``decode``,
    ``augment``), in this process, on ``indices``: read (the source), decode, the per-sample transforms,
    collate and, when there are workers, ipc (moving the batch into a fresh shared-memory segment, as torch
    does for a batch not already in one; none for a collate that reuses its own shared buffers, such as
    collate=uint8); then the same items end to end. Returns seconds per sample for each stage, their
    shares, the end-to-end time, the payload size, the payload formats and the stages that ran.

    With workers, the stages run on one intra-op thread, as torch runs them in each DataLoader worker: on the
    main process's threads, a busy 2-CPU machine took 3-7 ms a sample for the crop's resize against 0.1 ms
    on one, and the crop looked like the bottleneck."""
    with _threads(1 if workers > 0 else torch.get_num_threads()):
        return _stage_breakdown(dataset, collate, indices, batch_size, workers)


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _stage_breakdown(dataset, collate, indices: list[int], batch_size: int, workers: int) -> dict:
    # A collate that reuses shared-memory buffers writes each batch where it crosses: nothing to ship.
    shipped = workers > 0 and not getattr(collate, "reuse_buffers", False)
    seconds = dict.fromkeys(STAGES, 0.0)
    payload_bytes, samples, formats = 0, [], {}
    good = []  # the items read and decoded: an unreadable one is named (or raised) as training does
    part_of = getattr(getattr(dataset, "records", None), "part_of", None)  # source=mix: costs per part too
    parts: dict[int, dict[str, float]] = {}
    _warm_up(dataset, indices, part_of)
    for chunk in _chunks(indices, batch_size):  # read as the loader does: a batch at a time where it can
        items = []
        for p, group in _by_part(chunk, part_of):  # a mix reads each part's share as that source does
            t0 = clock()
            items += _read(dataset, group)
            spent = clock() - t0
            seconds["read"] += spent
            if p is not None:
                parts.setdefault(p, dict.fromkeys(("items", "read", "decode", "transform"), 0.0))["read"] += (
                    spent
                )
        for i, (payload, label) in items:
            p = part_of(i) if part_of is not None else None
            t1 = clock()
            try:
                image = dataset.decode(payload) if p is None else dataset.decode(payload, p)
            except (OSError, DecodeError) as err:
                dataset.bad_sample(i, err)
                continue
            t2 = clock()
            good.append(i)
            image = dataset.augment(image) if p is None else dataset.augment(image, p)
            t3 = clock()
            seconds["decode"] += t2 - t1
            seconds["transform"] += t3 - t2
            if p is not None:
                parts[p]["items"] += 1
                parts[p]["decode"] += t2 - t1
                parts[p]["transform"] += t3 - t2
            payload_bytes += _nbytes(payload)
            kind = payload_format(payload)
            formats[kind] = formats.get(kind, 0) + 1
            samples.append((image, label))
    deferred = any(isinstance(image, PendingCrop) for image, _ in samples)
    for chunk in _chunks(samples, batch_size):
        t0 = clock()
        batch = collate(chunk)
        t1 = clock()
        seconds["collate"] += t1 - t0
        if deferred:  # the same resizes again, alone: their share of the collate is the crop stage
            folded = _time_crops(chunk)
            seconds["crop"] += folded
            seconds["collate"] -= min(folded, t1 - t0)
            t1 = clock()
        if shipped:
            ship(batch)
            seconds["ipc"] += clock() - t1

    n = len(good)
    if not n:
        raise BadSampleError(
            f"none of the {len(indices)} items sampled for the stage breakdown could be read: check the data"
        )
    start = clock()
    for chunk in _chunks(good, batch_size):
        batch = collate(dataset.__getitems__(chunk))
        if shipped:
            ship(batch)
    total = clock() - start

    per_sample = {stage: s / n for stage, s in seconds.items()}
    stages_sum = sum(per_sample.values())
    return {
        "items": n,
        "bad": len(indices) - n,  # unreadable items, named in the log and left out of the timings
        "per_sample_s": per_sample,
        "share": {stage: (t / stages_sum if stages_sum else 0.0) for stage, t in per_sample.items()},
        "stages_sum_s": stages_sum,
        "end_to_end_s": total / n,
        "payload_bytes": payload_bytes / n,
        "formats": formats,  # items per payload format (payload_format): the advice has to fit them
        "stages_run": [
            stage for stage in STAGES if (stage != "ipc" or shipped) and (stage != "crop" or deferred)
        ],
        "parts": _per_part(parts, getattr(dataset, "records", None)),
    }


def _warm_up(dataset, indices: list[int], part_of) -> None:
    """One item of each part (of the dataset, when not a mix) through read, decode and transform, untimed: a
    one-time cost (the first read in this process, a first call) would otherwise be charged to whichever part
    the sample happens to read first, and name that part the bottleneck (two parts of the same data came out
    0.14 against 0.014 ms a read). An item that fails is left to the timed pass, which names it."""
    for p, group in _by_part(indices, part_of):
        try:
            payload, _ = dataset.read_many(group[:1])[0]
            image = dataset.decode(payload) if p is None else dataset.decode(payload, p)
            dataset.augment(image) if p is None else dataset.augment(image, p)
        except (OSError, DecodeError):
            pass


SLOW_PART = 1.5  # a part costing this many times the cheapest part's time a sample is named the bottleneck


def _by_part(chunk: list[int], part_of) -> list[tuple[int | None, list[int]]]:
    """``chunk``'s indices grouped by their part of a mix, in order of first appearance (one group: not a
    mix)."""
    if part_of is None:
        return [(None, chunk)]
    groups: dict[int, list[int]] = {}
    for i in chunk:
        groups.setdefault(part_of(i), []).append(i)
    return list(groups.items())


def _per_part(parts: dict[int, dict[str, float]], records) -> dict | None:
    """A mix's read, decode and transform cost per sample of each part (seconds), and the slowest part: the
    one that makes an epoch wait. None for any other source."""
    if not parts:
        return None
    out = {}
    for p, spent in sorted(parts.items()):
        n = max(1, int(spent["items"]))
        per = {stage: spent[stage] / n for stage in ("read", "decode", "transform")}
        out[records.names[p]] = {
            "items": int(spent["items"]),
            "per_sample_s": per,
            "total_s": sum(per.values()),
        }
    slowest = max(out, key=lambda name: out[name]["total_s"])
    fastest = min(out, key=lambda name: out[name]["total_s"])
    if out[slowest]["total_s"] < SLOW_PART * out[fastest]["total_s"]:
        slowest = None  # within noise of each other: no part holds the others up
    return {"by_part": out, "slowest": slowest}


def _read(dataset, indices: list[int]) -> list[tuple[int, tuple]]:
    """(index, (payload, label)) for each of ``indices`` that can be read: in one ``read_many`` call, or one
    by one when it fails, each unreadable index handed to ``dataset.bad_sample``."""
    try:
        return list(zip(indices, dataset.read_many(indices)))
    except (OSError, DecodeError):
        pass
    items = []
    for i in indices:
        try:
            items.append((i, dataset.read_many([i])[0]))
        except (OSError, DecodeError) as err:
            dataset.bad_sample(i, err)
    return items


def _time_crops(samples: list) -> float:
    """Seconds to resize each pending crop of ``samples`` into a scratch slot, as the collate does."""
    seconds = 0.0
    for image, _ in samples:
        if isinstance(image, PendingCrop):
            out = torch.empty((*image.crop.size, image.shape[0]), dtype=image.dtype).permute(2, 0, 1)
            t0 = clock()
            image.write_into(out)
            seconds += clock() - t0
    return seconds


def _chunks(items: list, size: int) -> Iterable[list]:
    for k in range(0, len(items), size):
        yield items[k : k + size]


def model_step(
    model: torch.nn.Module, batch, device: torch.device, on_device: Callable | None, repeats: int = 5
) -> float:
    """Seconds for one training step (forward, backward, optimizer step) of ``model`` on ``batch``."""
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = type(batch)(*(x.to(device) if isinstance(x, torch.Tensor) else x for x in batch))
    if on_device is not None:
        batch = on_device(batch)
    image, label = batch[0], batch[1]

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(image), label)
        loss.backward()
        optimizer.step()

    step()  # warm-up: allocations, cuDNN autotuning
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = clock()
    for _ in range(repeats):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (clock() - start) / repeats

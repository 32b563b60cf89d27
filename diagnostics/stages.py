"""Where a sample's time goes: each stage of the pipeline timed apart, in this process, on a few items.

    read        the source's ``read_many``, a batch of indices at a time (a mix: each part's share apart)
    decode      ``dataset.decode``: encoded bytes to pixels (samples of named fields: the input image's)
    decode <f>  samples of named fields: another image, a mask or the boxes ``f``, each its own stage
    fields      samples of named fields: the other fields (classes, numbers, text) together
    transform   ``dataset.augment``: the per-sample transforms
    crop        a train stack's crop and flip that the collate finishes (``transforms/deferred.py``), timed
                apart from the collate proper, so a stack folded into the collate is not taken for its cost
    collate     the batch's collate, less that crop
    ipc         with workers: moving the batch into a fresh shared-memory segment (``ship``); none for a
                collate that reuses shared buffers of its own

Each stage's seconds are divided by the items that could be read and decoded; an unreadable item is handed
to ``dataset.bad_sample`` as training does, and left out. The same items then run end to end, so the stages'
sum can be checked against the whole. A mix's parts are costed apart too (read, decode, transform), and the
slowest part is named when it costs ``SLOW_PART`` times the cheapest. Every duration is read from the
``clock`` the caller passes (``loader_bench.clock``, which tests replace).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from feedline.datamodules.bad_samples import BadSampleError
from feedline.datasets.records import BadInput
from feedline.transforms.decode import DecodeError
from feedline.transforms.deferred import PendingCrop

STAGES = ("read", "decode", "transform", "crop", "collate", "ipc")
STAGE_NAMES = {"crop": "crop (done in collate)"}  # how the report, the picture and the verdict name a stage


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


def ship(batch) -> None:
    """What a worker does to hand a batch to the main process: put every tensor in a fresh shared-memory
    segment (torch allocates one per batch; on some VMs its page faults cost more than the copy)."""
    for field in batch:
        if isinstance(field, torch.Tensor) and not field.is_shared():
            out = torch.empty(0, dtype=field.dtype).set_(torch.UntypedStorage._new_shared(field.nbytes))
            out.copy_(field.reshape(-1))


def breakdown(
    dataset, collate, indices: list[int], batch_size: int, workers: int, clock: Callable[[], float]
) -> dict:
    """The stages of ``dataset``'s pipeline on ``indices``, timed by ``clock``: what comes back is in
    ``loader_bench.stage_breakdown``, which sets the threads first."""
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
        for i, record in items:
            p = part_of(i) if part_of is not None else None
            named = getattr(dataset, "fields", None) is not None
            payload, label = (record, None) if named else record
            spent: dict[str, float] = {}
            t1 = clock()
            try:
                if named:
                    image = dataset.decode(payload, p, timings=(clock, spent))
                else:
                    image = dataset.decode(payload) if p is None else dataset.decode(payload, p)
            except (OSError, DecodeError, BadInput) as err:
                dataset.bad_sample(i, err)
                continue
            t2 = clock()
            good.append(i)
            image = dataset.augment(image) if p is None else dataset.augment(image, p)
            t3 = clock()
            for stage, s in (spent or {"decode": t2 - t1}).items():  # a sample of fields: each its own stage
                seconds[stage] = seconds.get(stage, 0.0) + s
            seconds["transform"] += t3 - t2
            if p is not None:
                parts[p]["items"] += 1
                parts[p]["decode"] += t2 - t1
                parts[p]["transform"] += t3 - t2
            if named:  # what the decoders read: the images' and masks' bytes
                spatial = [v for v in payload.values() if isinstance(v, (bytes, np.ndarray))]
                payload_bytes += sum(_nbytes(v) for v in spatial)
                payload = payload[dataset.fields.input]
            else:
                payload_bytes += _nbytes(payload)
            kind = payload_format(payload)
            formats[kind] = formats.get(kind, 0) + 1
            samples.append(image if named else (image, label))
    deferred = any(isinstance(sample[0], PendingCrop) for sample in samples if isinstance(sample, tuple))
    for chunk in _chunks(samples, batch_size):
        t0 = clock()
        batch = collate(chunk)
        t1 = clock()
        seconds["collate"] += t1 - t0
        if deferred:  # the same resizes again, alone: their share of the collate is the crop stage
            folded = _time_crops(chunk, clock)
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
        ]
        + [stage for stage in seconds if stage not in STAGES],  # samples of named fields: masks, fields
        "parts": _per_part(parts, getattr(dataset, "records", None)),
    }


def _warm_up(dataset, indices: list[int], part_of) -> None:
    """One item of each part (of the dataset, when not a mix) through read, decode and transform, untimed: a
    one-time cost (the first read in this process, a first call) would otherwise be charged to whichever part
    the sample happens to read first, and name that part the bottleneck (two parts of the same data came out
    0.14 against 0.014 ms a read). An item that fails is left to the timed pass, which names it."""
    for p, group in _by_part(indices, part_of):
        try:
            record = dataset.read_many(group[:1])[0]
            payload = record if isinstance(record, dict) else record[0]
            image = dataset.decode(payload) if p is None else dataset.decode(payload, p)
            dataset.augment(image) if p is None else dataset.augment(image, p)
        except (OSError, DecodeError, BadInput):
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


def _time_crops(samples: list, clock: Callable[[], float]) -> float:
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

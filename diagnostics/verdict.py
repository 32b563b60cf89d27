"""What limits a data pipeline, from ``bench.py``'s measurements, and what to change.

The rules, in order:
- I/O-bound: reading takes the largest share of a sample's time, or adding workers does not raise the rate
  (the disk or the network is the ceiling, not the CPUs), judged only on worker counts that each have a CPU
  beside the training process's (on 2 CPUs a sweep cannot tell: a second worker shares a core);
- collate- or IPC-bound: collate or ipc (a worker moving its batch into shared memory) takes the largest
  share, or the loader delivers far less than its workers could produce (the main process is the limit);
- decode-bound / transform-bound: the largest share, when neither of the above holds (a crop the collate
  finishes is transform work).
Before all of these, when the model's step was measured: model-bound, when the loader delivers a batch in no
more time than the step takes (the loader is not what the device waits for).

What to try comes from ``SUGGEST``, filtered by the payload formats measured (no JPEG advice for PNGs) and by
what the pipeline already does (``in_force.py``: never "set collate=uint8" to a run that has it).
"""

from __future__ import annotations

from dataclasses import dataclass

from feedline.diagnostics.in_force import (
    EVERY_CPU,
    FLOAT_ON_DEVICE,
    OBJECT_STORE,
    ONE_FILE,
    REDUCED_DECODE,
    SHARDS,
    UINT8_BATCHES,
    WINDOW_DECODE,
    WINDOW_DECODER,
)
from feedline.diagnostics.stages import STAGE_NAMES
from feedline.transforms.jpeg_window import HOW_TO_BUILD


@dataclass(frozen=True)
class Advice:
    """One thing to try. ``formats``: the payload formats it helps with (``stages.payload_format``:
    jpeg, png, other, raw); None: any. Advice that fits none of the formats measured is left out, and so is
    advice with a ``moot_if`` name (``in_force``'s, or ``SWEPT`` / ``NO_WORKERS``) that holds for the run,
    and advice with an ``only_if`` name that does not."""

    text: str
    formats: frozenset[str] | None = None
    moot_if: tuple[str, ...] = ()
    only_if: tuple[str, ...] = ()

    def fits(self, measured: dict | None, done: set[str] = frozenset()) -> bool:
        if any(name in done for name in self.moot_if) or any(name not in done for name in self.only_if):
            return False
        return self.formats is None or not measured or bool(self.formats & set(measured))


JPEG, ENCODED = frozenset({"jpeg"}), frozenset({"jpeg", "png", "other"})
NOT_JPEG = frozenset({"png", "other"})
SWEPT = "swept"  # bench.workers=sweep ran: its table and recommendation replace "try a sweep"
NO_WORKERS = "no workers"  # data.num_workers=0: there are no fewer workers to try

# Per verdict, in the order they are offered; what does not fit the formats measured is left out, so a PNG
# tree's decode-bound advice leads with raw pixels, not with JPEG's reduced decode.
SUGGEST = {
    "I/O-bound": [
        Advice(
            "convert to one file read sequentially: python convert.py ... out.path=/fast/disk/train.h5, then source=hdf5",
            moot_if=(ONE_FILE, OBJECT_STORE, SHARDS),
        ),
        Advice(
            "shrink what is read: out.max_side=256 (encoded) or out.mode=raw out.max_side=256",
            moot_if=(SHARDS,),
        ),
        Advice(
            "shrink what is read, as shards again: python convert.py source=shards source.path=<these shards> "
            "out.format=shards out.path=<a new path or s3:// prefix> out.max_side=256",
            only_if=(SHARDS,),
        ),
        Advice(
            "from object storage: source.cache_dir on a local disk and source.cache_limit above the dataset's "
            "size, so passes after the first read the node's cache (bench a second time to see that rate)",
            only_if=(OBJECT_STORE,),
        ),
        Advice(
            "put the data on local disk or in page cache; raise data.prefetch_factor to hide latency",
            moot_if=(OBJECT_STORE,),
        ),
    ],
    "decode-bound": [
        Advice(
            "decode only the crop: feedline's crop-window JPEG decoder is not built; " + HOW_TO_BUILD,
            JPEG,
            moot_if=(WINDOW_DECODER,),
        ),
        Advice(
            "decode only the crop: keep data.window_decode=true and RandomResizedCrop first in transforms.train",
            JPEG,
            moot_if=(WINDOW_DECODE,),
            only_if=(WINDOW_DECODER,),
        ),
        Advice(
            "keep data.reduced_decode=true and put a Resize or RandomResizedCrop first, so JPEGs decode at 1/2-1/8",
            JPEG,
            moot_if=(REDUCED_DECODE,),
        ),
        Advice(
            "re-encode smaller once: python convert.py ... out.max_side=256, then source=hdf5",
            JPEG,
            moot_if=(SHARDS,),
        ),
        Advice(
            "skip decoding entirely: python convert.py ... out.mode=raw out.max_side=256, then source=hdf5",
            ENCODED,
            moot_if=(SHARDS,),
        ),
        Advice(
            "or re-encode as JPEG once: python convert.py ... out.max_side=256 re-encodes each image larger than "
            "that at out.quality (lossy; smaller ones keep their bytes), then source=hdf5",
            NOT_JPEG,
            moot_if=(SHARDS,),
        ),
        Advice(  # shards stay shards, where they are (a disk or a bucket): the format is the user's choice
            "re-encode smaller once, as shards again: python convert.py source=shards source.path=<these shards> "
            "out.format=shards out.path=<a new path or s3:// prefix> out.max_side=256 (JPEG at out.quality), "
            "then source.path=<that path>",
            ENCODED,
            only_if=(SHARDS,),
        ),
        Advice(
            "more workers, if CPUs are free (bench.workers=sweep shows the curve)", moot_if=(EVERY_CPU, SWEPT)
        ),
    ],
    "transform-bound": [
        Advice("move batch-level work to the device: the transforms.batch stack runs after the transfer"),
        Advice(
            "keep per-sample transforms on uint8 tensors; crop before resizing; drop transforms that do not pay"
        ),
        Advice(
            "more workers, if CPUs are free (bench.workers=sweep shows the curve)", moot_if=(EVERY_CPU, SWEPT)
        ),
    ],
    "collate/IPC-bound": [
        Advice(
            "collate=uint8: one shared-memory uint8 tensor per batch, 4x fewer bytes than float32",
            moot_if=(UINT8_BATCHES,),
        ),
        Advice(
            "convert to float and normalise on the device (transforms.batch), not in the workers",
            moot_if=(FLOAT_ON_DEVICE,),
        ),
        Advice("larger data.batch_size means fewer, bigger messages between processes"),
    ],
    "model-bound": [
        Advice(
            "the data pipeline is not what the device waits for: speed up the step itself (trainer.precision="
            "bf16-mixed or 16-mixed on a GPU, data.memory_format=channels_last for convolutions, a faster device)"
        ),
        Advice(
            "the loader has time to spare: stronger per-sample augmentation costs no step time until it fills it"
        ),
        Advice(
            "fewer workers may keep up too, freeing CPUs (bench.workers=sweep shows which)",
            moot_if=(SWEPT, NO_WORKERS),
        ),
    ],
}


def suggestions(verdict: str, formats: dict | None = None, done: set[str] = frozenset()) -> list[str]:
    """What to try for ``verdict``: the advice that fits the payload formats measured and that the pipeline
    does not already follow (``done``: ``in_force`` names)."""
    return [advice.text for advice in SUGGEST[verdict] if advice.fits(formats, done)]


FLAT_GAIN = 1.25  # a sweep whose best rate is below this multiple of the 1-worker rate is flat
IPC_EFFICIENCY = 0.5  # a loader below this share of its workers' in-process capacity is IPC-bound


def part_reasons(parts: dict | None) -> list[str]:
    """source=mix: the part that costs most a sample, named as the bottleneck, with its costliest stage."""
    if not parts or parts["slowest"] is None:
        return []
    rows = parts["by_part"]
    slow = parts["slowest"]
    per = rows[slow]["per_sample_s"]
    stage = max(per, key=per.get)
    fastest = min(rows, key=lambda name: rows[name]["total_s"])
    return [
        f"part '{slow}' of the mix is the bottleneck: {rows[slow]['total_s'] * 1e3:.2f} ms a sample ({stage} "
        f"{per[stage] * 1e3:.2f} ms), against {rows[fastest]['total_s'] * 1e3:.2f} ms for '{fastest}'"
    ]


def diagnose(
    breakdown: dict,
    rate: float,
    workers: int,
    cpus: int,
    sweep: dict[int, float] | None = None,
    model: dict | None = None,
    done: set[str] = frozenset(),
) -> dict:
    """The verdict, the reasons for it and the suggestions; see the module docstring for the rules.
    ``model``: the measured step (``step_s``, ``loader_batch_s``, ``device``); ``done``: ``in_force`` names."""
    share = breakdown["share"]
    top = max(share, key=share.get)
    reasons = [
        f"{STAGE_NAMES.get(stage, stage)} takes {share[stage]:.0%} of a sample's time"
        for stage in sorted(share, key=share.get, reverse=True)
        if share[stage] > 0  # ipc is 0 without workers, or with a collate that reuses its buffers
    ]
    reasons[:0] = part_reasons(breakdown.get("parts"))
    capacity = max(1, min(workers, cpus)) / breakdown["end_to_end_s"] if breakdown["end_to_end_s"] else 0.0
    efficiency = rate / capacity if capacity else 1.0

    flat = False
    own_cpu = {w: r for w, r in (sweep or {}).items() if 1 <= w <= cpus - 1}  # one CPU left for training
    if 1 in own_cpu and len(own_cpu) > 1:
        most = max(own_cpu)
        flat = max(own_cpu.values()) < FLAT_GAIN * own_cpu[1]
        if flat:
            reasons.insert(
                0,
                f"throughput stays flat as workers increase ({own_cpu[1]:.0f} samples/s with 1 worker, "
                f"{own_cpu[most]:.0f} with {most})",
            )

    if model and model["loader_batch_s"] <= model["step_s"]:
        verdict = "model-bound"
        reasons.insert(
            0,
            f"the model's step takes {model['step_s'] * 1e3:.1f} ms on {model['device']} and the loader delivers a "
            f"batch every {model['loader_batch_s'] * 1e3:.1f} ms: the loader keeps up; the shares below are "
            "where the loader's own time goes",
        )
    elif top == "read" or flat:
        verdict = "I/O-bound"
    elif top in ("collate", "ipc") or (workers > 0 and efficiency < IPC_EFFICIENCY):
        verdict = "collate/IPC-bound"
        if top not in ("collate", "ipc"):
            reasons.insert(
                0,
                f"the loader delivers {efficiency:.0%} of what {min(workers, cpus)} worker(s) produce "
                "in-process: the main process is the bottleneck",
            )
    else:
        verdict = "decode-bound" if top == "decode" else "transform-bound"
    advice = suggestions(
        verdict,
        breakdown.get("formats"),
        done | ({SWEPT} if sweep else set()) | ({NO_WORKERS} if workers == 0 else set()),
    )
    if verdict == "model-bound" and sweep:
        advice += _fewer_workers(sweep, workers, model["loader_batch_s"] * rate / model["step_s"])
    return {
        "verdict": verdict,
        "reasons": reasons,
        "suggestions": advice,
        "in_force": sorted(done),
        "loader_efficiency": efficiency,
    }


def _fewer_workers(sweep: dict[int, float], workers: int, needed: float) -> list[str]:
    """The fewest workers of the sweep that still deliver ``needed`` samples/s (the model step's rate), when
    that is fewer than ``workers``. At least one: with none, loading does not overlap the step at all."""
    enough = [w for w, r in sweep.items() if w >= 1 and r >= needed]
    if not enough or min(enough) >= workers:
        return []
    fewest = min(enough)
    return [
        f"data.num_workers={fewest} keeps up too ({sweep[fewest]:.0f} samples/s against the step's "
        f"{needed:.0f}), freeing CPUs"
    ]


def recommend_workers(sweep: dict[int, float], within: float = 0.95) -> int:
    """The fewest workers that reach ``within`` of the best measured rate."""
    best = max(sweep.values())
    return min(w for w, rate in sweep.items() if rate >= within * best)

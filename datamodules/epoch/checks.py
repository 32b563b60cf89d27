"""Whether a checkpointed train-loader state fits the run that resumes from it: the one place that decides.

The state (``ResumableLoader.state_dict``) is a position, the epoch, the batches Lightning counts in it and
the samples of the epoch's order consumed (``order.py``), with what the position counts in (``CHECKED``).
A resume is refused (``data.resume=strict``) or warned about (``lenient``) when:

- the state is missing, or unreadable (an edited or damaged checkpoint: ``batches=-3``), or its samples
  consumed do not follow from its batches (``segment`` records where its part of the epoch began);
- it stands elsewhere than Lightning's own progress counters, which the same checkpoint restores
  (``lightning_position``): the loader would replay or skip samples while Lightning counts on;
- what the order is made of changed: the data, the train split (which rows, drawn with which seed and
  fractions), the seed, ``data.drop_last``, and what a source's own order draws from (shards: the window and
  the chunks, ``records.order_identity()``);
- it stands inside an epoch drawn by another rule (``order_rule``, ``order.ORDER_RULE``): a checkpoint of an
  earlier feedline, whose order of the same seed is another order. ``lenient`` goes on at the next epoch.

The world size and the per-device batch size may change (``ELASTIC``): the samples consumed are a prefix of
the epoch's order whatever the world that read them, so a new world reads the rest once. Standard library only.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping

STATE_FORMAT = 3  # 3: with the samples of the epoch's order consumed; 2: without (derived from the batches)
READABLE = (2, 3)
RESUME_MODES = ("strict", "lenient")

# What a position counts in, each compared between the checkpoint ("then") and this run ("now"); the text
# names it in messages. None now means this run cannot tell (a source without seed or fractions).
CHECKED = {
    "samples": "training samples",
    "classes": "classes",
    "class_names": "class names (a digest of the class list in label order; a mix: and each part's class_map)",
    "split": "train split (digest of its sample rows)",
    "fields": "sample fields (a digest of their names, kinds, columns and class lists; a table: and its content)",
    "split_seed": "source.seed",
    "order": "train order (shards: source.window over the chunks; a mix: its parts and what each gives an epoch)",
    "val_fraction": "source.val_fraction",
    "test_fraction": "source.test_fraction",
    "batch_size": "data.batch_size (per device)",
    "world_size": "processes (world size)",
    "seed": "seed",
    "drop_last": "data.drop_last",
}
# Recorded, so that a position counted in batches reads as samples, but free to change between save and resume.
ELASTIC = ("batch_size", "world_size")
# Checked only where the checkpoint records them: checkpoints written before they were recorded still resume.
RECORDED_SINCE = ("class_names", "fields")
# The rule that draws an epoch's order (datamodules/epoch/order.py ORDER_RULE): checkpoints without it had 1.
FIRST_ORDER_RULE = 1


def counted_in(source, split_digest: str, counts: dict, world_size: int, seed: int, drop_last: bool) -> dict:
    """This run's values of ``CHECKED``: ``counts`` (samples, classes, per-device batch size), the train
    split's digest (empty: its records cannot tell) and what draws the split, from ``source``."""
    return {
        **counts,
        "split": split_digest or None,
        "split_seed": getattr(source, "seed", None),
        "val_fraction": getattr(source, "val_fraction", None),
        "test_fraction": getattr(source, "test_fraction", None),
        "world_size": world_size,
        "seed": seed,
        "drop_last": drop_last,
    }


class ResumeError(RuntimeError):
    """A checkpoint's train-loader state does not fit the run (``data.resume=strict``)."""


def check_resume_mode(value) -> str:
    if value not in RESUME_MODES:
        raise ValueError(f"data.resume={value!r} is not one of: {', '.join(RESUME_MODES)}")
    return value


def read_position(state) -> tuple[tuple[int, int, int] | None, str | None]:
    """((epoch, batches, samples consumed), None) from a loader state, or (None, why it cannot be read)."""
    if not isinstance(state, Mapping):
        return None, f"the train loader state is a {type(state).__name__}, not a mapping"
    if not state:
        return None, "the train loader state is empty (an edited or damaged checkpoint)"
    if state.get("format") not in READABLE:
        return None, (
            f"the train loader state has format {state.get('format')!r}, this feedline reads "
            f"{' or '.join(map(str, READABLE))}"
        )
    keys = ("epoch", "batches", "consumed") if state["format"] >= 3 else ("epoch", "batches")
    values = {key: state.get(key) for key in keys}
    if "consumed" not in values:  # format 2: counted in batches of this many samples on this many ranks
        values.update(batch_size=state.get("batch_size"), world_size=state.get("world_size"))
    for key, value in values.items():
        least = 1 if key in ELASTIC else 0
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            return None, (
                f"the train loader state's {key} is {value!r}, not an integer >= {least} (an edited or damaged "
                "checkpoint)"
            )
    consumed = values.get("consumed")
    if consumed is None:
        consumed = values["batches"] * values["batch_size"] * values["world_size"]
    return (int(values["epoch"]), int(values["batches"]), int(consumed)), None


def differences(then: Mapping, now: Mapping) -> list[str]:
    """What changed since the checkpoint, among ``CHECKED``, each as "<what> <then> then, <now> now"."""
    return [
        f"{what} {then.get(key)!r} then, {now.get(key)!r} now"
        for key, what in CHECKED.items()
        if key not in ELASTIC
        and now.get(key) is not None
        and (key not in RECORDED_SINCE or key in then)
        and then.get(key) != now.get(key)
    ]


def class_names_digest(classes, mapping: str = "") -> str:
    """The class list in label order (and ``mapping``: how a mix's parts map their labels to it), as 12 hex
    digits: the same count of classes renamed, reordered or mapped otherwise gives other labels to the same
    samples."""
    text = "\n".join(map(str, classes)) + "\n\n" + mapping
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def state_problems(state, now: Mapping, lightning: tuple[int, int] | None):
    """(the position to go on from, (epoch, batches, samples consumed), or None; every reason the state does
    not fit this run). ``lightning``: (epoch, batches) Lightning's fit loop goes on from, when a Trainer
    resumes."""
    position, unreadable = read_position(state)
    if unreadable:
        return None, [unreadable]
    problems = []
    changed = differences(state, now)
    if changed:
        problems.append(
            "the run changed since the checkpoint: "
            + "; ".join(changed)
            + " (resume with the data, source split, seed and data.drop_last it was written with; the world "
            "size and data.batch_size may change)"
        )
    samples = now.get("samples")
    batches = _epoch_batches(samples, state.get("world_size"), state.get("batch_size"), now.get("drop_last"))
    if batches is not None and position[1] > batches:
        problems.append(
            f"the train loader state stands after batch {position[1]}, but an epoch has {batches} (batches of "
            f"{state['batch_size']} on {state['world_size']} rank(s), as the checkpoint counted them)"
        )
    if samples is not None and "consumed" in state and position[2] > samples:  # format 2 derives it
        problems.append(
            f"the train loader state stands after {position[2]} samples of the epoch, but an epoch has {samples}"
        )
    other = other_order_rule(state, now, position)
    if other:
        problems.append(other)
    mismatch = _consumed_mismatch(state, position)
    if mismatch:
        problems.append(mismatch)
    if lightning is not None and position[:2] != tuple(lightning):
        problems.append(
            f"the train loader state stands at epoch {position[0]} after {position[1]} batches, but Lightning's "
            f"progress in the same checkpoint goes on at epoch {lightning[0]} after {lightning[1]} batches (an "
            "edited or damaged checkpoint)"
        )
    return position, problems


def other_order_rule(state, now: Mapping, position: tuple[int, int, int]) -> str | None:
    """Why a state inside an epoch cannot go on in this run's order: it was drawn by another rule (an
    earlier feedline's). At an epoch's start nothing of it was read, and the next epoch is whole either way."""
    then, rule = state.get("order_rule", FIRST_ORDER_RULE), now.get("order_rule")
    samples = now.get("samples")
    if rule is None or then == rule or position[2] == 0 or (samples is not None and position[2] >= samples):
        return None
    batches = _epoch_batches(samples, state.get("world_size"), state.get("batch_size"), now.get("drop_last"))
    if (
        batches is not None and position[1] >= batches
    ):  # the epoch's last batch read (drop_last cuts the rest)
        return None
    return (
        f"the checkpoint stands after {position[2]} samples of epoch {position[0]}, drawn by epoch order rule "
        f"{then!r} (an earlier feedline's), and this feedline draws rule {rule!r}: the same seed gives another "
        "order, whose rest would repeat samples already read and miss others (finish the epoch with a "
        "feedline whose checkpoints record no order_rule, the one that wrote it)"
    )


def _consumed_mismatch(state, position: tuple[int, int, int]) -> str | None:
    """Whether the samples consumed follow from the batches, for a state that records where its segment of
    the epoch began (``segment``: [samples consumed before it, the batch count it began at]): a count edited
    on its own would make the resume skip samples nobody trained on, or read some twice."""
    segment = state.get("segment")
    values = (
        (*segment, state.get("batch_size"), state.get("world_size"), state.get("samples"))
        if (isinstance(segment, (list, tuple)) and len(segment) == 2)
        else ()
    )
    if len(values) != 5 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return None  # a state written without it: the other checks are all there is
    start, base, batch_size, world_size, samples = values
    done = max(0, position[1] - base)
    expected = min(samples, start + done * batch_size * world_size)
    if position[2] == expected:
        return None
    return (
        f"the train loader state has consumed {position[2]} samples, but {done} batches of {batch_size} on "
        f"{world_size} rank(s) after sample {start} make {expected} (an edited or damaged checkpoint)"
    )


def _epoch_batches(samples, world_size, batch_size, drop_last) -> int | None:
    """The batches an epoch of ``samples`` has on each of ``world_size`` ranks; None where a value is unknown."""
    values = (samples, world_size, batch_size)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return None
    per_rank = samples // world_size if drop_last else -(-samples // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def missing_state(checkpoint) -> str:
    return (
        f"the checkpoint {checkpoint} holds no train loader state (loops.fit_loop.state_dict.combined_loader "
        "is empty): it was written without feedline's train loader, or edited (resume from a checkpoint that "
        "feedline's train loader wrote)"
    )


def lightning_position(fit_loop) -> tuple[int, int]:
    """(epoch, batches) that Lightning's fit loop goes on from, read from the progress counters a checkpoint
    saves and restores: the batches it counts as processed in the current epoch (a checkpoint taken inside a
    step replays that step), or the start of the next epoch once the last batch is processed (an epoch cut
    short by ``limit_train_batches`` included)."""
    batches, epochs = fit_loop.epoch_loop.batch_progress, fit_loop.epoch_progress.current
    if batches.is_last_batch and batches.current.processed == batches.current.ready:
        return epochs.started, 0
    return epochs.processed, batches.current.processed


def shift_batches(fit_loop, delta: int) -> None:
    """Move Lightning's count of the current epoch's batches by ``delta``: every counter of the epoch loop's
    batch progress (ready, started, processed, completed; this epoch's and the total) alike, so their order,
    which tells Lightning where inside a step the checkpoint was taken, is kept."""
    progress = fit_loop.epoch_loop.batch_progress
    for tracker in (progress.current, progress.total):
        for name in ("ready", "started", "processed", "completed"):
            setattr(tracker, name, getattr(tracker, name) + delta)

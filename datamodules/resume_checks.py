"""Whether a checkpointed train-loader state fits the run that resumes from it: the one place that decides.

The state (``ResumableLoader.state_dict``) is a position, the epoch and the batches this rank has consumed
in it, and what that position counts in (``CHECKED``). A resume is refused (``data.resume=strict``) or
warned about (``lenient``) when:

- the state is missing, or unreadable (an edited or damaged checkpoint: ``batches=-3``);
- it stands elsewhere than Lightning's own progress counters, which the same checkpoint restores
  (``lightning_position``): the loader would replay or skip samples while Lightning counts on;
- what it counts in changed: the data, the train split (which rows, drawn with which seed and fractions),
  the batch size, the world size, the seed.

Letting a resume change one of these (the world size, the batch size) is a change to ``CHECKED`` and to
how ``ResumableLoader`` positions itself, nothing else. Standard library only.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

STATE_FORMAT = 2  # 2: with the train split's digest, source.seed and the held-out fractions
RESUME_MODES = ("strict", "lenient")

# What a position counts in, each compared between the checkpoint ("then") and this run ("now"); the text
# names it in messages. None now means this run cannot tell (a source without seed or fractions).
CHECKED = {
    "samples": "training samples",
    "classes": "classes",
    "split": "train split (digest of its sample rows)",
    "split_seed": "source.seed",
    "val_fraction": "source.val_fraction",
    "test_fraction": "source.test_fraction",
    "batch_size": "data.batch_size (per device)",
    "world_size": "processes (world size)",
    "seed": "seed",
    "drop_last": "data.drop_last",
}


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


def read_position(state) -> tuple[tuple[int, int] | None, str | None]:
    """((epoch, batches), None) from a loader state, or (None, why it cannot be read)."""
    if not isinstance(state, Mapping):
        return None, f"the train loader state is a {type(state).__name__}, not a mapping"
    if not state:
        return None, "the train loader state is empty (an edited or damaged checkpoint)"
    if state.get("format") != STATE_FORMAT:
        return None, (
            f"the train loader state has format {state.get('format')!r}, this feedline reads {STATE_FORMAT}"
        )
    values = {key: state.get(key) for key in ("epoch", "batches")}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            return None, (
                f"the train loader state's {key} is {value!r}, not an integer >= 0 (an edited or damaged "
                "checkpoint)"
            )
    return (int(values["epoch"]), int(values["batches"])), None


def differences(then: Mapping, now: Mapping) -> list[str]:
    """What changed since the checkpoint, among ``CHECKED``, each as "<what> <then> then, <now> now"."""
    return [
        f"{what} {then.get(key)!r} then, {now.get(key)!r} now"
        for key, what in CHECKED.items()
        if now.get(key) is not None and then.get(key) != now.get(key)
    ]


def state_problems(state, now: Mapping, batches_per_epoch: int, lightning: tuple[int, int] | None):
    """(the position to go on from or None, every reason the state does not fit this run).

    ``lightning``: (epoch, batches) Lightning's fit loop goes on from, when a Trainer resumes."""
    position, unreadable = read_position(state)
    if unreadable:
        return None, [unreadable]
    problems = []
    changed = differences(state, now)
    if changed:
        problems.append(
            "the run changed since the checkpoint: "
            + "; ".join(changed)
            + " (resume with the data, source split, data.batch_size, world size and seed it was written with)"
        )
    if position[1] > batches_per_epoch:
        problems.append(
            f"the train loader state stands after batch {position[1]}, but an epoch has {batches_per_epoch}"
        )
    if lightning is not None and position != tuple(lightning):
        problems.append(
            f"the train loader state stands at epoch {position[0]} after {position[1]} batches, but Lightning's "
            f"progress in the same checkpoint goes on at epoch {lightning[0]} after {lightning[1]} batches (an "
            "edited or damaged checkpoint)"
        )
    return position, problems


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

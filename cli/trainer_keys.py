"""The ``trainer.*`` keys users type most, checked before any work starts.

Lightning's ``Trainer`` takes many arguments and validates some of them late (``trainer.max_epochs=abc``
ends in a comparison between str and int, deep in the fit loop). The trainer group stays an open mapping,
so any Lightning argument can be added with ``+trainer.<name>=``; these checks cover the common keys and
name the key, the value and what it takes.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping

PRECISIONS = (
    "64",
    "32",
    "16",
    "bf16",
    "64-true",
    "32-true",
    "16-true",
    "bf16-true",
    "16-mixed",
    "bf16-mixed",
    "transformer-engine",
    "transformer-engine-float16",
)


def _int(minimum: int | None = None, allow_none: bool = False) -> Callable[[object], str | None]:
    def check(value) -> str | None:
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
            return (
                f"an integer >= {minimum}" + (" or null" if allow_none else "")
                if minimum is not None
                else "an integer"
            )
        return None

    return check


def _batches(value) -> str | None:  # limit_*_batches, val_check_interval: a count, a fraction or null
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        return None
    return "an integer count >= 0, a fraction in [0, 1], or null"


def _devices(value) -> str | None:
    if value == "auto" or value == -1:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return None
    if isinstance(value, str) and value.replace(",", "").replace(" ", "").isdigit():
        return None  # "0,1": those GPU indices
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return None
    return "a count >= 1, -1 or 'auto' (every device), or a list of device indices"


def _precision(value) -> str | None:
    return None if value is None or str(value) in PRECISIONS else f"one of: {', '.join(PRECISIONS)}"


def _flag_or_count(value) -> str | None:  # fast_dev_run: true/false or a number of batches
    if isinstance(value, bool) or (isinstance(value, int) and value >= 0):
        return None
    return "true, false or a number of batches"


def _deterministic(value) -> str | None:
    return None if value in (True, False, None, "warn") else "true, false or 'warn'"


CHECKS: dict[str, Callable[[object], str | None]] = {
    "max_epochs": _int(-1, allow_none=True),
    "min_epochs": _int(0, allow_none=True),
    "max_steps": _int(-1),
    "min_steps": _int(0, allow_none=True),
    "num_nodes": _int(1),
    "devices": _devices,
    "precision": _precision,
    "log_every_n_steps": _int(1, allow_none=True),
    "num_sanity_val_steps": _int(-1, allow_none=True),
    "accumulate_grad_batches": _int(1),
    "check_val_every_n_epoch": _int(1, allow_none=True),
    "limit_train_batches": _batches,
    "limit_val_batches": _batches,
    "limit_test_batches": _batches,
    "limit_predict_batches": _batches,
    "val_check_interval": _batches,
    "fast_dev_run": _flag_or_count,
    "deterministic": _deterministic,
}


def trainer_arguments(trainer: Mapping) -> list[str] | None:
    """The argument names of ``trainer._target_``, or None when it takes any (``**kwargs``) or cannot be
    imported (instantiating it names that problem)."""
    from hydra.utils import get_class

    try:
        parameters = inspect.signature(get_class(str(trainer["_target_"]))).parameters.values()
    except Exception:  # noqa: BLE001 - an unimportable target is reported where it is built
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.name != "self"]


def check_trainer_keys(trainer: Mapping, accepted: Iterable[str] | None = None) -> None:
    """Raise ValueError naming every common ``trainer.*`` key whose value Lightning would reject late, and
    every key the trainer does not take (``accepted``), with the closest it does take."""
    problems = []
    if accepted is not None:
        accepted = list(accepted)
        for key in trainer:
            if key != "_target_" and key not in accepted:
                close = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.75)
                hint = (
                    f"; did you mean trainer.{close[0]}?" if close else " (see Lightning's Trainer arguments)"
                )
                problems.append(f"trainer.{key} is not an argument of {trainer.get('_target_')}{hint}")
    for key, check in CHECKS.items():
        if key in trainer:
            expected = check(trainer[key])
            if expected:
                problems.append(f"trainer.{key}={trainer[key]!r} must be {expected}")
    if problems:
        raise ValueError("; ".join(problems))

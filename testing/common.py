"""What every check shares: the error that names a broken contract, and comparing what two reads gave."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np
import torch


class ContractError(AssertionError):
    """A source broke its contract; the message names the check, and the split and sample where it can."""


@contextlib.contextmanager
def checking(what: str):
    """Any error inside is reported as a broken ``what``, the source's own error chained to it."""
    try:
        yield
    except ContractError:
        raise
    except Exception as err:
        raise ContractError(f"{what}: {type(err).__name__}: {err}") from err


def fail(what: str, said: str):
    raise ContractError(f"{what}: {said}")


def spread(n: int, k: int) -> list[int]:
    """Up to ``k`` sample indices spread over ``n``, first and last included."""
    return sorted({int(i) for i in np.linspace(0, n - 1, min(n, k))}) if n else []


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or isinstance(a, np.ndarray):
        a, b = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (a, b))
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b

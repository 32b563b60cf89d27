"""Transform stacks from config: lists of torchvision v2 transforms for train, eval and batch.

``train`` and ``eval`` run per sample in the DataLoader workers on uint8 tensors; ``batch`` runs on the
device after the transfer (uint8 -> float, normalise, batch-level augmentation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchvision.transforms import v2


def compose(transforms: Sequence[Callable] | None) -> Callable | None:
    transforms = list(transforms or [])
    for t in transforms:
        if not callable(t):
            raise TypeError(f"transform stack entry {t!r} is not callable; give each entry a _target_")
    return v2.Compose(transforms) if transforms else None


class TransformStacks:
    def __init__(self, train=None, eval=None, batch=None):  # noqa: A002 - the config key is `eval`
        self.train = compose(train)
        self.eval = compose(eval)
        self.batch = compose(batch)

    def __repr__(self) -> str:
        return f"TransformStacks(train={self.train}, eval={self.eval}, batch={self.batch})"

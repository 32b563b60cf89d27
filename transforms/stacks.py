"""Transform stacks from config: lists of torchvision v2 transforms for train, eval and batch.

``train`` and ``eval`` run per sample in the DataLoader workers on uint8 tensors; ``batch`` runs on the
device after the transfer (uint8 -> float, normalise); ``mix`` (mixup/cutmix) follows it on training batches.
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
    """The per-sample stacks (``train``, ``eval``), the device-side ``batch`` stack, and ``mix``, a batch
    transform ``(image, label) -> (image, label)`` that runs after ``batch`` on training batches only."""

    def __init__(self, train=None, eval=None, batch=None, mix=None):  # noqa: A002 - the config key is `eval`
        self.train = compose(train)
        self.eval = compose(eval)
        self.batch = compose(batch)
        if mix is not None and not callable(mix):
            raise TypeError(f"transforms.mix {mix!r} is not callable; give it a _target_")
        self.mix = mix

    def on_device(self, image, label, training: bool):
        """What happens to a batch once it is on the device: the batch stack, then, when training, mix."""
        if self.batch is not None:
            image = self.batch(image)
        if training and self.mix is not None:
            image, label = self.mix(image, label)
        return image, label

    def __repr__(self) -> str:
        return f"TransformStacks(train={self.train}, eval={self.eval}, batch={self.batch}, mix={self.mix})"

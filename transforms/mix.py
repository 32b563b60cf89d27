"""MixUp / CutMix as a batch transform: it runs on the device, after the batch stack, on training batches.

torchvision v2 ``MixUp`` or ``CutMix`` mixes each training batch with probability ``prob``, and the labels
become soft labels (N, classes) that sum to 1 (the classifier's loss takes them as they are). Validation,
test and predict batches pass through unmixed. Configured as ``mix=mixup_cutmix`` (``transforms.mix``); the
collate stays a plain one (``collate=uint8``).
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2


class MixupCutmix:
    """``(image, label) -> (image, label)`` for a float image batch. ``switch_prob`` is the chance of
    CutMix when both alphas are > 0; an alpha of 0 turns that one off. ``num_classes`` is filled in by
    the datamodule from the source when it is not given."""

    def __init__(
        self,
        mixup_alpha: float = 0.2,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        num_classes: int | None = None,
    ):
        for key, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if value < 0:
                raise ValueError(f"transforms.mix.{key}={value} must be >= 0 (0 turns it off)")
        for key, value in (("prob", prob), ("switch_prob", switch_prob)):
            if not 0 <= value <= 1:
                raise ValueError(f"transforms.mix.{key}={value} must be in [0, 1]")
        if mixup_alpha == 0 and cutmix_alpha == 0:
            raise ValueError(
                "mix=mixup_cutmix needs transforms.mix.mixup_alpha or transforms.mix.cutmix_alpha > 0"
            )
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.prob, self.switch_prob = float(prob), float(switch_prob)
        self.num_classes = num_classes
        self._mix = None

    def __getstate__(self):
        return {**self.__dict__, "_mix": None}

    def _mixer(self):
        if self._mix is None:
            if not self.num_classes:
                raise ValueError(
                    "mix=mixup_cutmix needs num_classes (the datamodule sets it from the source)"
                )
            choices, weights = [], []
            if self.mixup_alpha > 0:
                choices.append(v2.MixUp(alpha=self.mixup_alpha, num_classes=self.num_classes))
                weights.append(1 - self.switch_prob if self.cutmix_alpha > 0 else 1.0)
            if self.cutmix_alpha > 0:
                choices.append(v2.CutMix(alpha=self.cutmix_alpha, num_classes=self.num_classes))
                weights.append(self.switch_prob if self.mixup_alpha > 0 else 1.0)
            self._mix = v2.RandomChoice(choices, p=weights) if len(choices) > 1 else choices[0]
        return self._mix

    def __call__(self, image: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixer = self._mixer()
        if not image.is_floating_point():
            image = image.float().div_(255)
        if torch.rand(()) < self.prob:
            return mixer(image, label)
        return image, torch.nn.functional.one_hot(label, self.num_classes).to(image.dtype)

    def __repr__(self) -> str:
        return (
            f"MixupCutmix(mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, "
            f"prob={self.prob}, switch_prob={self.switch_prob})"
        )

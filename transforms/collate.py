"""Collate functions: samples -> ``Batch``. Each is a small picklable class, so spawn workers work.

A collate may also define ``on_device(batch) -> batch``: the datamodule runs it on training batches after
the transfer and the batch stack, where float work is cheap (mixup/cutmix lives there).
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import default_collate
from torchvision.transforms import v2

from transforms.batch import Batch
from transforms.batch_pool import BatchPool, empty

__all__ = ["Batch", "DefaultCollate", "MixupCutmixCollate", "PadCollate", "Uint8Collate"]


def _labels(samples) -> torch.Tensor:
    return torch.as_tensor([s[1] for s in samples], dtype=torch.int64)


_SIZE_HINT = (
    "Images in one batch must share a size: end the transform stack with a resize or crop, or use collate=pad"
)


class DefaultCollate:
    """torch's ``default_collate``, returned as a ``Batch``."""

    def __call__(self, samples) -> Batch:
        try:
            image, label = default_collate(samples)
        except RuntimeError as err:
            raise RuntimeError(f"{err}. {_SIZE_HINT}") from err
        return Batch(image, label)


def _is_channels_last(image: torch.Tensor) -> bool:
    return image.dim() == 3 and image.shape[0] > 1 and image.stride(0) == 1


class Uint8Collate:
    """Stack uint8 images into one preallocated tensor that the loader can pin as it is. In a worker the
    tensor (and the labels) sit in one shared-memory segment that crosses to the main process uncopied,
    and that the worker reuses once the main process has freed it (``reuse_buffers``, see
    ``transforms.batch_pool``). Samples laid out channels-last (what the decoders and the uint8 crops
    produce) give a channels-last batch: each copy is one block."""

    def __init__(self, reuse_buffers: bool = True):
        self.reuse_buffers = bool(reuse_buffers)
        self._pool = BatchPool(slots=8 if reuse_buffers else 0)

    def __call__(self, samples) -> Batch:
        first = samples[0][0]
        for image, _ in samples:
            if image.shape != first.shape:
                raise RuntimeError(
                    f"collate=uint8 got images of shapes {tuple(first.shape)} and {tuple(image.shape)}. {_SIZE_HINT}"
                )
        channels_last = _is_channels_last(first)
        if channels_last:
            c, h, w = first.shape
            shape = (len(samples), h, w, c)
        else:
            shape = (len(samples), *first.shape)
        out, label, finish = self._pool.batch(shape, first.dtype, len(samples))
        if channels_last:
            out = out.permute(0, 3, 1, 2)
        for k, (image, _) in enumerate(samples):
            out[k].copy_(image)
        label.copy_(_labels(samples))
        return finish(Batch(out, label))


class PadCollate:
    """Variable-sized samples -> one batch padded to the largest, with a mask that is True on real data.

    Images (C, H, W) are padded at the bottom and right; sequences (L, ...) are padded at the end through
    ``pad_sequence``. ``multiple_of`` rounds the padded size up (e.g. 32 for a network that downsamples 5x).
    """

    def __init__(self, pad_value: float = 0, multiple_of: int = 1):
        if multiple_of < 1:
            raise ValueError(f"collate.multiple_of={multiple_of} must be >= 1")
        self.pad_value, self.multiple_of = pad_value, int(multiple_of)

    def _round(self, n: int) -> int:
        return -(-n // self.multiple_of) * self.multiple_of

    def __call__(self, samples) -> Batch:
        items = [s[0] for s in samples]
        first = items[0]
        if first.dim() == 3:
            image, mask = self._images(items)
            return Batch(image, _labels(samples), mask)
        lengths = torch.as_tensor([len(x) for x in items])
        padded = pad_sequence(items, batch_first=True, padding_value=self.pad_value)
        longest = self._round(padded.shape[1])
        if longest > padded.shape[1]:
            extra = padded.new_full(
                (len(items), longest - padded.shape[1], *padded.shape[2:]), self.pad_value
            )
            padded = torch.cat([padded, extra], dim=1)
        mask = torch.arange(longest)[None, :] < lengths[:, None]
        return Batch(padded, _labels(samples), mask)

    def _images(self, items) -> tuple[torch.Tensor, torch.Tensor]:
        channels = {x.shape[0] for x in items}
        if len(channels) > 1:
            raise RuntimeError(
                f"collate=pad got images with {sorted(channels)} channels; they must share one"
            )
        height = self._round(max(x.shape[1] for x in items))
        width = self._round(max(x.shape[2] for x in items))
        out = empty((len(items), items[0].shape[0], height, width), items[0].dtype)
        out.fill_(self.pad_value)
        mask = torch.zeros((len(items), height, width), dtype=torch.bool)
        for k, x in enumerate(items):
            out[k, :, : x.shape[1], : x.shape[2]].copy_(x)
            mask[k, : x.shape[1], : x.shape[2]] = True
        return out, mask


class MixupCutmixCollate(Uint8Collate):
    """uint8 batches from the workers; on the device, torchvision v2 ``MixUp`` or ``CutMix`` mixes each
    training batch with probability ``prob``, and ``label`` becomes soft labels (N, classes) that sum to 1.

    ``switch_prob`` is the chance of CutMix when both alphas are > 0; an alpha of 0 turns that one off.
    ``num_classes`` is filled in by the datamodule from the source.
    """

    def __init__(
        self,
        mixup_alpha: float = 0.2,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        num_classes: int | None = None,
        reuse_buffers: bool = True,
    ):
        super().__init__(reuse_buffers)
        for key, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if value < 0:
                raise ValueError(f"collate.{key}={value} must be >= 0 (0 turns it off)")
        for key, value in (("prob", prob), ("switch_prob", switch_prob)):
            if not 0 <= value <= 1:
                raise ValueError(f"collate.{key}={value} must be in [0, 1]")
        if mixup_alpha == 0 and cutmix_alpha == 0:
            raise ValueError("collate=mixup_cutmix needs collate.mixup_alpha or collate.cutmix_alpha > 0")
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
                    "collate=mixup_cutmix needs num_classes (the datamodule sets it from the source)"
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

    def on_device(self, batch: Batch) -> Batch:
        mixer = self._mixer()
        if not batch.image.is_floating_point():
            batch = batch._replace(image=batch.image.float().div_(255))
        if torch.rand(()) < self.prob:
            image, label = mixer(batch.image, batch.label)
        else:
            image = batch.image
            label = torch.nn.functional.one_hot(batch.label, self.num_classes).to(image.dtype)
        return batch._replace(image=image, label=label)

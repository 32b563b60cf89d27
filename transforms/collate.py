"""Collate functions: samples -> ``Batch``. Each is a small picklable class, so spawn workers work.

A collate only stacks; batch-level augmentation (mixup/cutmix) is a batch transform that runs on the
device (``transforms/mix.py``).
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import default_collate

from feedline.conf.rebuild import Rebuildable
from feedline.transforms.batch import Batch
from feedline.transforms.batch_pool import BatchPool, empty
from feedline.transforms.deferred import PendingCrop
from feedline.transforms.field_collate import SampleLayout, collate_fields, infer_layout

__all__ = ["Batch", "Collate", "DefaultCollate", "PadCollate", "Uint8Collate", "WithPaths"]


class Collate(Rebuildable):
    """A collate: ``__call__(samples) -> Batch``. The datamodule takes any callable (a function too);
    feedline's collates inherit from this class so LightningCLI can offer them as ``--data.collate``
    choices (it declares no ``__call__`` itself: jsonargparse would then pass the class, not an instance).

    Samples of named fields (dicts, ``datasets/fields.py``) are stacked per kind (``field_collate.py``); the
    datamodule tells the collate their layout through ``bind`` (without it, kinds are read from the values)."""

    layout: SampleLayout | None = None

    def bind(self, layout: SampleLayout | None) -> None:
        """The fields of the samples this collate will stack (None: image and class, as tuples)."""
        self.layout = layout

    def _layout(self, samples) -> SampleLayout:
        return self.layout if self.layout is not None else infer_layout(samples[0])

    @classmethod
    def __subclasshook__(cls, other):
        if cls is Collate:
            return (
                any("__call__" in vars(base) for base in other.__mro__ if base is not object)
                or NotImplemented
            )
        return NotImplemented


def _labels(samples) -> torch.Tensor:
    return torch.as_tensor([s[1] for s in samples], dtype=torch.int64)


_SIZE_HINT = (
    "Images in one batch must share a size: end the transform stack with a resize or crop, or use collate=pad"
)


_BOXES_HINT = (
    "These samples hold boxes: use collate=detection, which lists images of different sizes for a detection "
    "model (it resizes each itself)"
)


class DefaultCollate(Collate):
    """torch's ``default_collate``, returned as a ``Batch``."""

    def __call__(self, samples) -> Batch:
        if isinstance(samples[0], dict):
            return collate_fields(samples, self._layout(samples))
        try:
            image, label = default_collate(samples)
        except RuntimeError as err:
            raise RuntimeError(f"{err}. {_SIZE_HINT}") from err
        return Batch(image, label)


def _is_channels_last(image) -> bool:
    if isinstance(image, PendingCrop):
        return image.channels_last
    return image.dim() == 3 and image.shape[0] > 1 and image.stride(0) == 1


class Uint8Collate(Collate):
    """Stack uint8 images into one preallocated tensor that the loader can pin as it is. In a worker the
    tensor (and the labels) sit in one shared-memory segment that crosses to the main process uncopied,
    and that the worker reuses once the main process has freed it (``reuse_buffers``, see
    ``transforms.batch_pool``). Samples laid out channels-last (what the decoders and the uint8 crops
    produce) give a channels-last batch: each copy is one block.

    It also takes ``PendingCrop`` samples (``writes_pending``): the datamodule then defers a train stack's
    final crop and flip (``transforms.deferred``), and each crop is resized straight into its slot."""

    writes_pending = True

    def __init__(self, reuse_buffers: bool = True):
        self.reuse_buffers = bool(reuse_buffers)
        self._pool = BatchPool(slots=8 if reuse_buffers else 0)

    def __call__(self, samples) -> Batch:
        if isinstance(samples[0], dict):
            return self._fields(samples)
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
            if isinstance(image, PendingCrop):
                image.write_into(out[k])
            else:
                out[k].copy_(image)
        label.copy_(_labels(samples))
        return finish(Batch(out, label))

    def _fields(self, samples) -> Batch:
        """Samples of named fields: the input image into a pooled segment, the other fields per kind."""
        layout = self._layout(samples)
        images = [s[layout.x] for s in samples]
        first = images[0]
        if any(image.shape != first.shape for image in images):
            boxes = any(kind == "boxes" for _, kind in layout.kinds)
            raise RuntimeError(
                f"collate=uint8 got images of shapes {tuple(first.shape)} and "
                f"{next(tuple(i.shape) for i in images if i.shape != first.shape)}. "
                + (_BOXES_HINT if boxes else _SIZE_HINT)
            )
        channels_last = _is_channels_last(first)
        c, h, w = first.shape
        shape = (len(images), h, w, c) if channels_last else (len(images), c, h, w)
        out, _, finish = self._pool.batch(shape, first.dtype, 0)
        if channels_last:
            out = out.permute(0, 3, 1, 2)

        def into(values):
            for k, image in enumerate(values):
                if isinstance(image, PendingCrop):
                    image.write_into(out[k])
                else:
                    out[k].copy_(image)
            return out

        return finish(collate_fields(samples, layout, image_into=into))


class PadCollate(Collate):
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
        if isinstance(samples[0], dict):
            return collate_fields(samples, self._layout(samples), padding=(self.pad_value, self.multiple_of))
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


class WithPaths(Collate):
    """Any collate, for samples that carry their file's path (``(image, label, path)``, predict): the
    wrapped collate stacks ``(image, label)`` as usual and the batch carries the paths, in batch order.
    A sample that is None (a file that could not be read) is left out: that batch is smaller. When none is
    left (every file of the batch unreadable) the batch is None, which feedline's predict loader skips
    (``datamodules.predict``)."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples) -> Batch | None:
        samples = [s for s in samples if s is not None]  # files that could not be read: left out, and logged
        if not samples:
            return None  # their paths are in the log already
        batch = self.collate([s[:2] for s in samples])
        if not isinstance(batch, Batch):
            raise TypeError(
                f"data.collate {self.collate!r} returned a {type(batch).__name__}; predict batches carry file "
                "paths, so the collate must return a feedline.transforms.batch.Batch"
            )
        batch.paths = tuple(s[2] for s in samples)  # set in place: a pooled batch keeps its slot
        return batch


class WithParts(Collate):
    """Any collate, for samples that carry their part of a mix (``(image, label, part)``, ``source=mix``'s
    val and test splits): the wrapped collate stacks ``(image, label)`` as usual and ``batch.part`` holds
    each sample's part, for accuracy per part."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples) -> Batch:
        if isinstance(samples[0], dict):  # named fields: each sample holds its part, which the collate stacks
            batch = self.collate(samples)
            if isinstance(batch, Batch) and batch.part is None:
                batch.part = torch.as_tensor([s["part"] for s in samples], dtype=torch.int64)
            return batch
        batch = self.collate([s[:2] for s in samples])
        if not isinstance(batch, Batch):
            raise TypeError(
                f"data.collate {self.collate!r} returned a {type(batch).__name__}; a mix's val batches carry "
                "each sample's part, so the collate must return a feedline.transforms.batch.Batch"
            )
        batch.part = torch.as_tensor([s[2] for s in samples], dtype=torch.int64)
        return batch

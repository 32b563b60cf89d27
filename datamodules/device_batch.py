"""What happens to a batch on the device, for ``ImageLoaders``: the batch stack (uint8 -> float,
normalise), then, on training batches, the batch-level mix, in one memory format for every split.

A mixin of ``ImageLoaders`` (``loaders.py``): it reads the transform stacks and the memory format from it.
"""

from __future__ import annotations

import contextlib

import torch

from feedline.transforms.collate import Batch


class DeviceBatch:
    def _bind_mix(self) -> None:
        if self.transforms.mix is None:
            return
        target = self.fields[self.fields.target]
        if target.kind not in ("class", "classes"):
            raise ValueError(
                f"transforms.mix (mixup/cutmix) mixes class targets; this source's target {target.name!r} is of "
                f"kind {target.kind}, which mixing would make wrong: drop mix=... for this data"
            )
        spatial = [f.name for f in self.fields.of_kind("image", "mask") if f.name != self.fields.input]
        if spatial:
            raise ValueError(
                f"transforms.mix (mixup/cutmix) mixes the images and the target; this source's samples also hold "
                f"{spatial[0]!r}, which it would leave describing only one of two mixed images: drop mix=... or "
                "that field"
            )
        if getattr(self.transforms.mix, "num_classes", 0) is None:
            self.transforms.mix.num_classes = self.num_classes  # mixup/cutmix: soft labels need the count

    def device_batch(
        self,
        batch: Batch,
        training: bool = False,
        device: torch.device | str | None = None,
        seed: int | None = None,
    ) -> Batch:
        """What happens to a batch on the device: the batch stack (uint8 -> float, normalise), then, for
        training batches, the batch-level augmentation (``transforms.mix``: mixup/cutmix), in one memory
        format for every split (``data.memory_format``). Lightning calls it after each transfer; a plain
        PyTorch loop calls it once per batch, with ``device``, which moves the batch there first.
        ``seed``: the mix draws from a generator seeded with it (the same mix after a resume)."""
        self._bind_mix()
        if device is not None:
            batch = batch.to(device)
        x, y = (
            batch.x_name,
            batch.y_name,
        )  # the image is normalised, the target mixed; other fields stay as they are
        if isinstance(batch[x], (list, tuple)):  # collate=detection listed images of different sizes
            images = [self._checked(self.transforms.on_device(i, None, False)[0], 3) for i in batch[x]]
            return batch.replace(**{x: images})
        image = self._format(batch[x])  # on uint8, before the batch stack: the cheapest copy if any
        seeded = seed is not None and training and self.transforms.mix is not None
        with torch.random.fork_rng(devices=[]) if seeded else contextlib.nullcontext():
            if seeded:  # the mix of this batch, whatever ran before it
                torch.default_generator.manual_seed(seed)
            image, label = self.transforms.on_device(image, batch[y], training)
        image = self._checked(
            self._format(image), 4
        )  # _format: a no-op unless a transform changed the layout
        return batch.replace(**{x: image, y: label})

    @staticmethod
    def _checked(image: torch.Tensor, dims: int) -> torch.Tensor:
        """Images (``dims``: 4 stacked, 3 one of a list) must leave the stack as floats."""
        if image.dim() == dims and not image.is_floating_point():
            raise TypeError(
                f"images leave the device stack as {image.dtype}: end transforms.batch with ToDtype(float32, "
                "scale=True) and Normalize, as the transforms groups (imagenet, cifar, digits) do"
            )
        return image

    def _format(self, image: torch.Tensor) -> torch.Tensor:
        return image.contiguous(memory_format=self.memory_format) if image.dim() == 4 else image

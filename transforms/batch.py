"""``Batch``: what every collate returns and what the model's step receives.

It unpacks as the pair Lightning users expect, ``x, y = batch`` (``batch[0]``, ``batch[1]`` too). What
some batches carry besides are attributes, never tuple positions: ``mask`` (collate=pad: True where a
sample has data), ``paths`` (predict batches: the file each image came from) and ``part`` (a mix's
val and test batches: the part each sample came from, ``source=mix``).

Lightning moves it to the device through ``to()`` (every tensor field, non-blocking to an accelerator),
infers the batch size from ``image`` and ``label`` without a warning, and torch's pin-memory thread pins it
through ``pin_memory()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(eq=False)
class Batch:
    image: torch.Tensor
    label: (
        torch.Tensor
    )  # int64 class indices (N,), -1 where unknown (predict); (N, classes) float after mixup/cutmix
    mask: torch.Tensor | None = None  # collate=pad: True where a sample has data, (N, H, W) or (N, L)
    paths: tuple[str, ...] | None = None  # predict batches: the file of each image, in batch order
    part: torch.Tensor | None = None  # source=mix val/test batches: the part of each sample (int64, (N,))

    def __iter__(self):
        yield self.image
        yield self.label

    def __len__(self) -> int:
        return 2

    def __getitem__(self, k):
        return (self.image, self.label)[k]

    def replace(self, **changes) -> Batch:
        """A new batch with ``changes`` (field=value) applied; the rest shared."""
        return dataclasses.replace(self, **changes)

    def pin_memory(self, device=None) -> Batch:
        """A copy in page-locked memory (what ``DataLoader(pin_memory=True)`` calls)."""

        def pin(t):
            return t.pin_memory() if isinstance(t, torch.Tensor) else t

        return Batch(pin(self.image), pin(self.label), pin(self.mask), self.paths, pin(self.part))

    def to(self, device, non_blocking: bool | None = None) -> Batch:
        """Every tensor field on ``device``. ``non_blocking`` defaults to True towards an accelerator, where
        a copy from pinned memory overlaps the work before it (copies back to the CPU always block)."""
        device = torch.device(device)
        if non_blocking is None:
            non_blocking = device.type not in ("cpu", "mps")

        def move(t):
            return t.to(device, non_blocking=non_blocking) if isinstance(t, torch.Tensor) else t

        return Batch(move(self.image), move(self.label), move(self.mask), self.paths, move(self.part))

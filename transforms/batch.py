"""``Batch``: what every collate returns and what the model's step receives."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Batch(NamedTuple):
    image: torch.Tensor
    label: torch.Tensor  # int64 class indices (N,), or float soft labels (N, classes) after mixup/cutmix
    mask: torch.Tensor | None = None  # collate=pad: True where a sample has data, (N, H, W) or (N, L)

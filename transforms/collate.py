"""Collate functions: samples -> ``Batch``. Each is a small picklable class, so spawn workers work."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.data import default_collate, get_worker_info


class Batch(NamedTuple):
    image: torch.Tensor
    label: torch.Tensor


def _labels(samples) -> torch.Tensor:
    return torch.as_tensor([s[1] for s in samples], dtype=torch.int64)


class DefaultCollate:
    """torch's ``default_collate``, returned as a ``Batch``."""

    def __call__(self, samples) -> Batch:
        try:
            image, label = default_collate(samples)
        except RuntimeError as err:
            raise RuntimeError(f"{err}. {_SIZE_HINT}") from err
        return Batch(image, label)


_SIZE_HINT = "Images in one batch must share a size: end the transform stack with a resize or crop"


class Uint8Collate:
    """Stack uint8 images into one preallocated tensor (in shared memory inside a worker, so it crosses
    the process boundary without a copy) that the loader can pin as it is."""

    def __call__(self, samples) -> Batch:
        first = samples[0][0]
        shape = (len(samples), *first.shape)
        for image, _ in samples:
            if image.shape != first.shape:
                raise RuntimeError(
                    f"collate=uint8 got images of shapes {tuple(first.shape)} and {tuple(image.shape)}. {_SIZE_HINT}"
                )
        if get_worker_info() is not None:
            storage = torch.UntypedStorage._new_shared(first.numel() * first.element_size() * len(samples))
            out = torch.empty(0, dtype=first.dtype).set_(storage).view(shape)
        else:
            out = torch.empty(shape, dtype=first.dtype)
        torch.stack([image for image, _ in samples], out=out)
        return Batch(out, _labels(samples))

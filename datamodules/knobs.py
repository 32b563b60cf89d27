"""Loader knobs with automatic values: resolved once the trainer tells us the world we run in."""

from __future__ import annotations

from feedline.datamodules.options import MEMORY_FORMATS
from feedline.datasets.scan import available_cpus


def resolve_num_workers(value, devices_per_node: int = 1) -> int:
    """``auto``: the CPUs each device's process gets, minus one for that process itself."""
    if value in ("auto", None):
        return max(0, available_cpus() // max(1, devices_per_node) - 1)
    try:
        workers = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"data.num_workers={value!r} must be an integer >= 0 or 'auto'") from None
    if workers < 0:
        raise ValueError(f"data.num_workers={value!r} must be an integer >= 0 or 'auto'")
    return workers


def resolve_pin_memory(value, on_gpu: bool) -> bool:
    """``auto``: pin when batches go to a GPU, where it makes ``non_blocking`` copies possible."""
    if value in ("auto", None):
        return on_gpu
    if isinstance(value, bool):
        return value
    raise ValueError(f"data.pin_memory={value!r} must be true, false or 'auto'")


def per_device_batch_size(batch_size: int, global_batch_size: int | None, world_size: int) -> int:
    """``data.global_batch_size`` wins when set: it is split evenly over the ranks."""
    if global_batch_size is None:
        if batch_size < 1:
            raise ValueError(f"data.batch_size={batch_size} must be >= 1")
        return batch_size
    if global_batch_size < 1 or global_batch_size % world_size:
        raise ValueError(
            f"data.global_batch_size={global_batch_size} does not divide over {world_size} device(s): "
            f"use a multiple of {world_size}, or set data.batch_size (per device) instead"
        )
    return global_batch_size // world_size


def check_prefetch_factor(value) -> int | None:
    """``data.prefetch_factor``: batches each worker keeps ready, >= 1 (null: torch's default)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"data.prefetch_factor={value!r} must be an integer >= 1 (or null): each worker keeps that many "
            f"batches ready"
        )
    return value


def check_steps(samples: int, batch_size: int, world_size: int, drop_last: bool) -> None:
    """Fail before a run that would train zero steps: every rank's share of the split smaller than one
    batch, with the incomplete batch dropped."""
    per_rank = -(-samples // max(1, world_size))
    if drop_last and per_rank < batch_size:
        raise ValueError(
            f"data.batch_size={batch_size} is larger than the {per_rank} training sample(s) each of "
            f"{world_size} device(s) gets ({samples} in all), and data.drop_last=true drops that incomplete "
            f"batch: training would run zero steps. Lower data.batch_size or set data.drop_last=false"
        )


def parse_memory_format(value):
    """``data.memory_format`` as a torch memory format."""
    import torch

    if value not in MEMORY_FORMATS:
        raise ValueError(f"data.memory_format={value!r} is not one of: {', '.join(MEMORY_FORMATS)}")
    return torch.channels_last if value == "channels_last" else torch.contiguous_format

"""Loader knobs with automatic values: resolved once the trainer tells us the world we run in."""

from __future__ import annotations

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

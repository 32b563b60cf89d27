"""Loader knobs with automatic values: resolved once the trainer tells us the world we run in."""

from __future__ import annotations

import numbers

from feedline.datamodules.options import MEMORY_FORMATS
from feedline.datasets.folder.scan import available_cpus


def _integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def max_workers() -> int:
    """The most worker processes a device may start: 4 per CPU this process may use (workers waiting on a
    network disk can outnumber the CPUs), and never fewer than 32."""
    return max(32, 4 * available_cpus())


def resolve_num_workers(value, devices_per_node: int = 1) -> int:
    """``auto``: the CPUs each device's process gets, minus one for that process itself."""
    if value in ("auto", None):
        return max(0, available_cpus() // max(1, devices_per_node) - 1)
    try:
        workers = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"data.num_workers={value!r} must be an integer >= 0 or 'auto'") from None
    if workers < 0 or isinstance(value, float) and value != workers:
        raise ValueError(f"data.num_workers={value!r} must be an integer >= 0 or 'auto'")
    if workers > max_workers():
        raise ValueError(
            f"data.num_workers={workers} starts that many processes per device, more than {max_workers()} "
            f"(4 per CPU of the {available_cpus()} this process may use): lower it, or set 'auto'"
        )
    return workers


def check_batch_size(batch_size, global_batch_size) -> None:
    """The batch size in effect (``data.global_batch_size`` when set, else ``data.batch_size``) is >= 1;
    whether the global one divides over the devices is known once the Trainer is."""
    key, value = (
        ("data.batch_size", batch_size)
        if global_batch_size is None
        else ("data.global_batch_size", global_batch_size)
    )
    if not _integer(value) or value < 1:
        raise ValueError(f"{key}={value!r} must be an integer >= 1")


def check_seed(value) -> int | None:
    """``data.seed``: null (the run's seed), or the 32-bit seed the train order and augmentation draw from."""
    if value is None:
        return None
    if not _integer(value) or not 0 <= value < 2**32:
        raise ValueError(
            f"data.seed={value!r} must be an integer from 0 to 2**32-1 (4294967295), or null for the run's seed: "
            "the order draws from 32 bits, so other values would repeat another seed's order"
        )
    return value


def check_max_pixels(value) -> int | None:
    """``data.max_pixels``: null (PIL's limit), 0 (none) or a positive pixel count."""
    if value is not None and (not _integer(value) or value < 0):
        raise ValueError(
            f"data.max_pixels={value!r} must be null (PIL's limit), 0 (no limit) or a pixel count >= 1: a "
            "negative limit would refuse every image"
        )
    return value


def check_multiprocessing_context(value) -> str | None:
    """``data.multiprocessing_context``: null (the platform's default) or a start method it has."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    if value is not None and value not in methods:
        raise ValueError(
            f"data.multiprocessing_context={value!r} is not one of: {', '.join(methods)} (or null: the default)"
        )
    return value


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


MAX_PREFETCH = 64  # batches each worker keeps ready, in shared memory, however many there are


def check_prefetch_factor(value) -> int | None:
    """``data.prefetch_factor``: batches each worker keeps ready, 1 to MAX_PREFETCH (null: torch's default)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PREFETCH:
        raise ValueError(
            f"data.prefetch_factor={value!r} must be an integer >= 1 and at most {MAX_PREFETCH} (or null): each worker "
            f"keeps that many batches ready in shared memory"
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

"""The anchor ``bench.anchor=true`` measures beside feedline: torchvision's ``ImageFolder`` on the same class
folders, as a user would write it (PIL loader, the same per-sample train stack after ``PILToTensor``, torch's
default collate), with the same batch size and workers, timed by the same ``measure_loader``."""

from __future__ import annotations

import logging

from torch.utils.data import DataLoader

from feedline.diagnostics.loader_bench import measure_loader

log = logging.getLogger(__name__)


def anchor_root(source) -> str:
    """The class-folder root ImageFolder reads, or an error naming the key (only folder-like sources have one)."""
    root = getattr(source, "root", None)
    if not isinstance(root, str):
        raise ValueError(
            f"bench.anchor=true times torchvision's ImageFolder on the same class folders, and {type(source).__name__} "
            "has none: use it with source=folder or source=lazy_folder, or set bench.anchor=false"
        )
    return root


def imagefolder_loader(root: str, transform, batch_size: int, workers: int) -> DataLoader:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    steps = [v2.PILToTensor()] + ([transform] if transform is not None else [])
    dataset = ImageFolder(root, transform=v2.Compose(steps))
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0
    )


def measure_anchor(loader: DataLoader, *args, **kwargs) -> dict | None:
    """``measure_loader`` on the anchor, or None with a warning when ImageFolder stops at a file it cannot
    read (it has no bad-sample policy: a user's own loop stops there too)."""
    try:
        return measure_loader(loader, *args, **kwargs)
    except OSError as err:  # PIL's UnidentifiedImageError, a truncated JPEG: raised again from its worker
        log.warning(
            "the anchor is not measured: torchvision's ImageFolder stopped at a file it cannot read (%s), where "
            "feedline skips it (data.on_bad_sample); remove or fix the file, or set bench.anchor=false",
            err,
        )
        return None

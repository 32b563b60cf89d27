"""The anchor ``bench.anchor=true`` measures beside feedline: torchvision's ``ImageFolder`` on the same class
folders, as a user would write it (PIL loader, the same per-sample train stack after ``PILToTensor``, torch's
default collate), with the same batch size and workers, timed by the same ``measure_loader``."""

from __future__ import annotations

from torch.utils.data import DataLoader


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

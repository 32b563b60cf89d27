"""The loaders ``peers.py`` measures, each ``build(data, args)`` returning an iterable of ``(images, labels)``
batches on the same work; the peers that need an environment of their own are in ``peer_overlays.py``.

Nothing heavy at module level: a measurement's child process imports what its loader needs, and no more.
"""

from __future__ import annotations

import importlib.util

import peer_overlays
from peer_work import crop_and_flip, decode_jpeg

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # conf/transforms/imagenet.yaml


# -- loaders: (format class, module that must be importable, build(data, args) -> iterable of batches) --------
def feedline_loaders(source, args, lightning: bool = False, window_decode: bool = True):
    """feedline's loaders (``ImageLoaders``: no Lightning import; ``lightning``: the ``ImageDataModule`` that
    wraps them) with its `imagenet` preset's train stack: torchvision's RandomResizedCrop and
    RandomHorizontalFlip as feedline ships them (the same parameters, draws and pixels, bit for bit)."""
    from feedline.transforms.collate import Uint8Collate
    from feedline.transforms.crop import RandomResizedCrop
    from feedline.transforms.flip import RandomHorizontalFlip
    from feedline.transforms.stacks import TransformStacks

    if lightning:
        from feedline.datamodules.image import ImageDataModule as Loaders
    else:
        from feedline.datamodules.loaders import ImageLoaders as Loaders
    train, batch = [RandomResizedCrop(224, antialias=True), RandomHorizontalFlip()], None
    if lightning:  # on the device, before a model: the preset's float conversion and normalisation
        import torch
        from torchvision.transforms import v2

        batch = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    stacks = TransformStacks(train=train, batch=batch)
    return Loaders(
        source,
        stacks,
        Uint8Collate(),
        batch_size=args.batch_size,
        num_workers=args.workers,
        window_decode=window_decode,
    )


def feedline_loader(source, args, lightning: bool = False):
    return feedline_loaders(source, args, lightning).train_dataloader()


def feedline_folder(data, args, lightning: bool = False):
    return feedline_loader(folder_source(data), args, lightning)


def folder_source(data):
    from feedline.datasets.folder.source import FolderSource

    return FolderSource(data["tree"], val_fraction=0, cache_dir=data["cache"])


def feedline_datamodule(data, args):
    return feedline_folder(data, args, lightning=True)


def feedline_whole_decode(data, args):
    """feedline's folder row with ``data.window_decode=false``: every JPEG decoded whole, then cropped."""
    return feedline_loaders(folder_source(data), args, window_decode=False).train_dataloader()


def kernel(data, args):
    """The single-thread kernel every loader stands on, without a loader: torchvision's ``decode_jpeg`` of the
    whole image, RandomResizedCrop 224 and flip, one image after another in this process on one thread, the
    files read into memory first; batches stacked as the peers' are."""
    import random

    import torch
    from peer_work import samples

    torch.set_num_threads(1)
    transform = crop_and_flip()
    items = samples(data["tree"])
    random.Random(0).shuffle(items)
    payloads = []
    for path, label in items:
        with open(path, "rb") as f:
            payloads.append((f.read(), label))

    def batches():
        for start in range(0, len(payloads) - args.batch_size + 1, args.batch_size):
            chunk = payloads[start : start + args.batch_size]
            yield _stack([(transform(decode_jpeg(data)), label) for data, label in chunk])

    return batches()


def feedline_hdf5(key):
    def build(data, args):
        from feedline.datasets.hdf5.source import HDF5Source

        return feedline_loader(HDF5Source(data[key], val_fraction=0, cache_dir=data["cache"]), args)

    return build


def imagefolder(data, args):
    from torch.utils.data import DataLoader
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    classic = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    dataset = ImageFolder(data["tree"], transform=classic)
    return DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, persistent_workers=True
    )


def webdataset_loader(data, args):
    import webdataset as wds

    transform = crop_and_flip()

    def sample(item):
        return transform(decode_jpeg(item["jpg"])), int(item["cls"])

    shards = data["webdataset"]
    dataset = wds.WebDataset(
        shards, shardshuffle=len(shards), nodesplitter=wds.split_by_node, empty_check=False
    )
    dataset = dataset.shuffle(1000).map(sample).batched(args.batch_size, collation_fn=_stack)
    return wds.WebLoader(dataset, batch_size=None, num_workers=args.workers, persistent_workers=True)


def _stack(items):
    import torch

    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def litdata_loader(data, args):
    import litdata

    transform = crop_and_flip()

    class Dataset(litdata.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return transform(decode_jpeg(item["jpg"])), item["cls"]

    dataset = Dataset(data["litdata"], shuffle=True)
    return litdata.StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)


# The single-thread kernel (decode, crop, flip; no loader): the floor every CPU loader stands on
KERNEL = "kernel: decode_jpeg + crop + flip, one thread, no loader"

# name: (format class, what must be installed: a module of this environment or "overlay:<peer>", build)
LOADERS = {
    "ImageFolder + PIL": ("JPEG tree", None, imagefolder),
    "WebDataset": ("JPEG tree", "webdataset", webdataset_loader),
    "LitData": ("JPEG tree", "litdata", litdata_loader),
    **{name: (kind, f"overlay:{peer}", build) for name, (kind, peer, build) in peer_overlays.LOADERS.items()},
    "feedline folder": ("JPEG tree", None, feedline_folder),
    "feedline folder (LightningDataModule)": ("JPEG tree", None, feedline_datamodule),
    "feedline folder, whole decode (data.window_decode=false)": ("JPEG tree", None, feedline_whole_decode),
    KERNEL: ("JPEG tree", None, kernel),
    "feedline hdf5 (JPEG at 256 px)": ("256 px", None, feedline_hdf5("max256")),
    "feedline hdf5 (raw at 256 px)": ("raw", None, feedline_hdf5("rawmax256")),
}
# start-up in a plain Lightning script (``lightning_script``): not loader rows, timed beside train.py; the
# first is the anchor for train.py and for the datamodule in a user's own Lightning project
ANCHOR = "ImageFolder + DataLoader in a Lightning Trainer"
IN_LIGHTNING = "feedline ImageDataModule in a Lightning Trainer"
SCRIPTS = {ANCHOR: False, IN_LIGHTNING: True}
OURS = {
    "JPEG tree": "feedline folder",
    "256 px": "feedline hdf5 (JPEG at 256 px)",
    "raw": "feedline hdf5 (raw at 256 px)",
}


def installed(requirement: str | None) -> bool:
    if requirement is None:
        return True
    if requirement.startswith("overlay:"):
        return peer_overlays.overlay_installed(requirement.split(":", 1)[1])
    return importlib.util.find_spec(requirement) is not None


def overlay_of(name: str) -> str | None:
    requirement = LOADERS[name][1] or ""
    return requirement.split(":", 1)[1] if requirement.startswith("overlay:") else None

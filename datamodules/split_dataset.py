"""One split as a SampleDataset: the source's records (or ``data.predict_root``'s images), the stack that split
uses, and the checks that fail before training rather than at the first batch (an empty split, a mix whose
parts' stacks end at different sizes).
"""

from __future__ import annotations

import logging

from feedline.datamodules.samples import SampleDataset
from feedline.datasets.folder.unlabeled import unlabeled_folder
from feedline.transforms.boxes import check_box_stack
from feedline.transforms.collate import PadCollate
from feedline.transforms.deferred import defer_crop
from feedline.transforms.jpeg_window import available, say_if_off
from feedline.transforms.stacks import compose
from feedline.transforms.window import CropFirst, crop_first, kept_region

log = logging.getLogger(__name__)


def split_dataset(loaders, split: str) -> SampleDataset:
    """``split`` of ``loaders``' source (``data.predict_root`` for predict) as the per-sample pipeline: its
    records, its stack (a mix part's own where it has one; the crop deferred where the collate resizes), the
    bad-sample policy. An empty train or test split is an error that says which key to change."""
    if split == "predict":
        if loaders.predict_root is None:
            raise ValueError("trainer.predict needs images: set data.predict_root=/path/to/images")
        records = unlabeled_folder(loaders.predict_root)
    else:
        records = loaders.source.split(split)
    if split == "train" and not len(records):
        raise ValueError(
            f"the train split of {loaders.source!r} is empty: lower source.val_fraction, or check the data"
        )
    share = getattr(loaders.source, f"{split}_fraction", 0) if split in ("val", "test") else 0
    if share and not len(records):  # each class's share rounds to 0, or would leave it no training sample
        message = (
            f"source.{split}_fraction={share} holds out no sample: each class's share rounds to 0, or would "
            f"take its last training sample; raise source.{split}_fraction, or add samples"
        )
        if split == "test":
            raise ValueError(f"the test split is empty: {message}")
        log.warning("the val split is empty: %s", message)
    transform = loaders.transforms.train if split == "train" else loaders.transforms.eval
    # a mix's parts with a train stack of their own (source.parts.<name>.transforms)
    own = (
        loaders.source.part_transforms()
        if split == "train" and hasattr(loaders.source, "part_transforms")
        else {}
    )
    parts = {k: compose(stack) for k, stack in own.items()}
    if split != "predict":  # pixels a transform invents (padding, rotation corners) carry no class
        for stack in (transform, *parts.values()):
            fill_masks(stack, loaders.fields)
    if split == "train" and loaders.fields is not None and loaders.fields.of_kind("boxes"):
        for key, stack in (
            ("transforms.train", transform),
            *((f"source.parts.{k}.transforms", t) for k, t in parts.items()),
        ):
            check_box_stack(stack, key)
    if getattr(loaders.collate, "writes_pending", False):  # the crop's resize happens in the batch itself
        transform = defer_crop(transform)
        parts = {k: defer_crop(t) for k, t in parts.items()}
    if loaders.fields is None or loaders.fields.is_classification:  # the crop drawn from the JPEG header
        transform, parts = crop_first(transform), {k: crop_first(t) for k, t in parts.items()}
        windows = any(isinstance(t, CropFirst) or kept_region(t) for t in (transform, *parts.values()))
        if windows and loaders.window_decode and not available():
            say_if_off()  # it decodes whole images, with the same crops, and says how to change that
    dataset = SampleDataset(
        records,
        transform,
        loaders.on_bad_sample,
        loaders.reduced_decode,
        loaders.max_pixels,
        loaders.max_bad_fraction,
        with_paths=split == "predict",
        part_transforms=parts,
        with_parts=split in ("val", "test") and hasattr(records, "part_of"),
        fields=None if split == "predict" else loaders.fields,
        window_decode=loaders.window_decode,
    )
    if parts and not isinstance(loaders.collate, PadCollate):
        check_part_sizes(dataset, own)
    return dataset


def check_part_sizes(dataset: SampleDataset, own: dict) -> None:
    """A mix whose parts have their own train stacks: one sample of each part through its stack, before
    training, so that a stack ending at another size is named by its key (the batch would fail at its first
    collate, naming no part). Parts with an empty train split are left out."""
    records = dataset.records
    shapes = {}
    for k, name in enumerate(records.names):
        first = int(records.offsets[k])
        if first < int(records.offsets[k + 1]):
            sample = dataset[(first, 0)]
            image = sample[dataset.fields.input] if isinstance(sample, dict) else sample[0]
            shapes[name] = (tuple(image.shape), k in own)
    if len({shape for shape, _ in shapes.values()}) > 1:
        said = ", ".join(
            f"source.parts.{name}{'.transforms' if own_stack else ' (transforms.train)'} at {shape}"
            for name, (shape, own_stack) in shapes.items()
        )
        raise ValueError(
            f"the parts' train stacks end at different sizes: {said}; images of one batch must share one: end "
            f"each part's stack with the same crop or resize (or use collate=pad)"
        )


def fill_masks(transform, fields) -> None:
    """Give every transform of ``transform`` that fills new pixels (a pad, a rotation's corners, a zoom-out) the
    mask's ``ignore_index`` as its fill for masks, where the stack does not say one: torchvision fills every type
    with the one value given (0 by default), and 0 is a class. A stack that names a fill for
    ``tv_tensors.Mask`` keeps it."""
    masks = fields.of_kind("mask") if fields is not None else []
    if not masks or transform is None:
        return
    from torchvision import tv_tensors

    ignore = masks[0].ignore_index  # one fill per transform: the first mask's (each mask's, when they agree)
    for t in _each(transform):
        fill = getattr(t, "_fill", None)
        if isinstance(fill, dict) and tv_tensors.Mask not in fill:
            fill[tv_tensors.Mask] = ignore


def _each(transform):
    yield transform
    for inner in getattr(transform, "transforms", None) or ():
        yield from _each(inner)

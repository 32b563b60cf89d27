"""SampleDataset: the per-sample pipeline, built once. record -> decoded uint8 image -> per-sample transforms,
with the bad-sample policy. Its stages (``read_many``, ``decode``, ``augment``) are what the datamodule's
loaders run and what ``bench.py`` times one by one."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.utils.data import Dataset

from feedline.datamodules.bad_samples import BadSampleError, BadSamples, check_max_bad_fraction
from feedline.datamodules.options import DataConfig as _DEFAULTS
from feedline.datamodules.options import OnBadSample, parse_on_bad_sample
from feedline.datamodules.sample_fields import FieldDecoder
from feedline.datasets.fields import Fields
from feedline.datasets.records import BadInput
from feedline.transforms.decode import DecodeError, decode
from feedline.transforms.jpeg_window import available, decode_drawn, decode_region
from feedline.transforms.reduce import minimum_size
from feedline.transforms.window import CropFirst, kept_region

log = logging.getLogger(__name__)

# What a sample's data can be wrong with: unreadable, undecodable, or a source's own ``BadInput``. These follow
# data.on_bad_sample; any other exception is a bug or a configuration error and stops the run.
BAD_INPUT = (OSError, DecodeError, BadInput)


class SampleDataset(Dataset):
    """Reads ``records[i]``, decodes it and applies ``transform``.

    A sample that cannot be read or decoded is reported by path, once. With ``on_bad_sample=skip`` it is
    replaced by the next readable sample, so batch shapes (and DDP ranks) stay in step, until more than
    ``max_bad_fraction`` of the split has turned out bad (``bad_samples.py``); with ``raise`` the error
    stops the run. Errors inside the transforms are configuration errors and always raise.

    ``with_paths`` (predict): samples are ``(image, label, path)``, and a skipped file is None rather than
    replaced, so the collate leaves it out of its batch: every file is predicted once or named as bad.

    A mix's records (``source=mix``) tell each sample's part (``records.part_of``): ``part_transforms``
    (part -> per-sample stack) replaces ``transform`` for that part's samples, and ``with_parts`` (val,
    test) makes samples ``(image, label, part)``, for accuracy per part.

    ``fields`` (``datasets/fields.py``): the records read dicts of named fields, and a sample is a dict of
    decoded fields (images as ``tv_tensors.Image``, masks as ``tv_tensors.Mask``) that the transform stack
    moves together; a mix's val and test samples then hold their ``part``. None: ``(payload, label)`` records,
    the classification path.
    """

    def __init__(
        self,
        records,
        transform: Callable | None = None,
        on_bad_sample=_DEFAULTS.on_bad_sample,
        reduced_decode: bool = _DEFAULTS.reduced_decode,
        max_pixels: int | None = _DEFAULTS.max_pixels,
        max_bad_fraction: float = _DEFAULTS.max_bad_fraction,
        with_paths: bool = False,
        part_transforms: dict[int, Callable] | None = None,
        with_parts: bool = False,
        fields: Fields | None = None,
        window_decode: bool = _DEFAULTS.window_decode,
    ):
        self.records = records
        self.fields = None if fields is None or fields.is_classification else fields
        self._field_decoder = FieldDecoder(self.fields) if self.fields is not None else None
        self.with_paths = bool(with_paths)
        self.transform = transform
        self.part_transforms = dict(part_transforms or {})
        self.with_parts = bool(with_parts)
        self.on_bad_sample = parse_on_bad_sample(on_bad_sample)
        self.reduced_decode = bool(reduced_decode)
        self.window_decode = bool(window_decode) and available()
        self.max_pixels = max_pixels
        self.max_bad_fraction = check_max_bad_fraction(max_bad_fraction)
        self.bad: BadSamples | None = None  # shared flags, set by the datamodule before workers start
        self._floors: dict = {}
        self._regions: dict = {}

    def share_bad_samples(self) -> None:
        """Put fresh bad-sample flags in shared memory, for the workers of the loader about to start."""
        self.bad = BadSamples(len(self), self.max_bad_fraction, shared=True)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_floors"], state["_regions"] = {}, {}  # closures over the transforms: rebuilt where it reads
        if state["bad"] is not None and not state["bad"].shared:
            state["bad"] = None  # this process's own flags: a new process keeps its own
        return state

    @property
    def floor(self):
        """The smallest size the first transform needs, for reduced-size JPEG decoding (None: full size)."""
        return self._floor_of(None)

    def _transform_of(self, part: int | None):
        return self.part_transforms.get(part, self.transform) if part is not None else self.transform

    def _floor_of(self, part: int | None):
        """The floor of the stack that part ``part``'s samples go through (None: the split's own)."""
        key = part if part in self.part_transforms else None
        if key not in self._floors:
            transform = self._transform_of(key)
            self._floors[key] = (
                minimum_size(transform) if self.reduced_decode and transform is not None else None
            ) or False
        return self._floors[key] or None

    def _region_of(self, part: int | None):
        """What part ``part``'s stack reads of an image of a given size, where it starts Resize then CenterCrop
        and ``window_decode`` is on (``window.kept_region``); None: the whole image."""
        key = part if part in self.part_transforms else None
        if key not in self._regions:
            transform = self._transform_of(key)
            self._regions[key] = (kept_region(transform) if self.window_decode else None) or False
        return self._regions[key] or None

    def _part(self, i: int) -> int | None:
        part_of = getattr(self.records, "part_of", None)
        return part_of(i) if part_of is not None and (self.part_transforms or self.with_parts) else None

    def __len__(self) -> int:
        return len(self.records)

    # -- the stages -------------------------------------------------------------------------------
    def read_many(self, indices: list[int]) -> list:
        """(payload, label) per index, as the source reads them fastest: one ``getitems`` call for sources
        that read in bulk (HDF5), else one read each."""
        getitems = getattr(self.records, "getitems", None)
        return getitems(indices) if getitems is not None else [self.records[i] for i in indices]

    def decode(self, payload, part: int | None = None, timings=None):
        """Payload -> uint8 (3, H, W), at reduced size where the first transform allows it; under a stack that
        starts with RandomResizedCrop (``window_decode``), a JPEG's crop drawn and only its window decoded (a
        ``Windowed`` image, ``transforms/jpeg_window.py``); a record of named fields -> a dict of decoded fields
        (``sample_fields.py``; ``timings``: each field's time, for bench.py)."""
        if self._field_decoder is not None:
            return self._field_decoder(payload, self._floor_of(part), self.max_pixels, timings)
        transform = self._transform_of(part)
        if isinstance(transform, CropFirst):  # the crop drawn from the header; its window alone decoded
            return decode_drawn(payload, transform, self.reduced_decode, self.max_pixels, self.window_decode)
        region = self._region_of(part)
        if region is not None:
            return decode_region(payload, region, self._floor_of(part), self.max_pixels)
        return decode(payload, self._floor_of(part), self.max_pixels)

    def augment(self, image, part: int | None = None):
        """The per-sample transform stack (a mix's part's own, where it has one): on the image, or on every
        field of a sample of named fields at once."""
        transform = self._transform_of(part)
        return transform(image) if transform is not None else image

    # -- the pipeline -----------------------------------------------------------------------------
    def _decode(self, i: int, record=None):
        """(decoded image, label) of sample ``i``, or (dict of decoded fields, None)."""
        if record is None:
            record = self.records[i]
        if self._field_decoder is not None:
            return self.decode(record, self._part(i)), None
        payload, label = record
        return self.decode(payload, self._part(i)), label

    def __getitem__(self, key):
        i, seed = _split(key)
        return self._finish(i, None, seed)

    def __getitems__(self, keys: list) -> list:
        """A whole batch, read as the source reads fastest (``read_many``). A key is an index, or an
        ``(index, seed)`` pair from the train sampler (``resume.py``): torch's generator is seeded with it
        before the sample's transforms, so its augmentation is the same in any worker and after a resume."""
        pairs = [_split(key) for key in keys]
        indices = [i for i, _ in pairs]
        try:
            records = self.read_many(indices)
        except BAD_INPUT:  # fall back to one by one: the bad sample gets named there
            return [self._finish(i, None, seed) for i, seed in pairs]
        return [self._finish(i, record, seed) for (i, seed), record in zip(pairs, records)]

    def _finish(self, i: int, record, seed: int | None = None):
        used, part = i, self._part(i)
        _seed(seed)  # the sample's draws start here: its crop's, drawn at the decode under window_decode
        try:
            image, label = self._decode(i, record)
        except BAD_INPUT as err:
            self.bad_sample(i, err)
            if self.with_paths:
                return None  # predict: the file is left out of its batch (``WithPaths``), never replaced
            image, label, used = self._substitute(i, seed)
            part = self._part(used)
        if label is None:  # named fields: one dict, the part of a mix's val/test sample in it
            sample = self.augment(image, part)
            if self.with_parts:
                sample["part"] = part
            if self.with_paths:
                sample["paths"] = self.records.describe(used)
            return sample
        if self.with_paths:
            return self.augment(image, part), label, self.records.describe(used)
        if self.with_parts:
            return self.augment(image, part), label, part
        return self.augment(image, part), label

    def bad_sample(self, i: int, err: Exception) -> None:
        """Sample ``i`` could not be read or decoded (``err``): ``raise``, a ``BadSampleError`` naming it;
        ``skip``, named once and counted against ``max_bad_fraction`` (the caller leaves it out)."""
        path = self.records.describe(i)
        if self.on_bad_sample is OnBadSample["raise"]:
            raise BadSampleError(
                f"bad sample {path}: {err} (data.on_bad_sample=raise; set data.on_bad_sample=skip to skip it)"
            ) from err
        self._flags().found(i, path, err)

    def _flags(self) -> BadSamples:
        if self.bad is None:  # used without a datamodule: flags of this process alone
            self.bad = BadSamples(len(self), self.max_bad_fraction)
        return self.bad

    def _substitute(self, i: int, seed: int | None = None):
        """(image, label, index) of the next readable sample after ``i``, its draws made afresh from ``seed``;
        each bad one met on the way counts against the budget."""
        n = len(self)
        for k in range(1, n):
            j = (i + k) % n
            _seed(seed)
            try:
                return (*self._decode(j), j)
            except BAD_INPUT as err:
                self._flags().found(j, self.records.describe(j), err)
        raise BadSampleError(f"every sample of this split is unreadable ({n}): check the data")


def _seed(seed: int | None) -> None:
    if seed is not None:
        torch.default_generator.manual_seed(seed)  # the CPU generator alone: 1 us, not 100


def _split(key) -> tuple[int, int | None]:
    return (key[0], key[1]) if isinstance(key, tuple) else (key, None)

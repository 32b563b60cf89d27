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
from feedline.transforms.decode import DecodeError, decode
from feedline.transforms.reduce import minimum_size

log = logging.getLogger(__name__)


class SampleDataset(Dataset):
    """Reads ``records[i]``, decodes it and applies ``transform``.

    A sample that cannot be read or decoded is reported by path, once. With ``on_bad_sample=skip`` it is
    replaced by the next readable sample, so batch shapes (and DDP ranks) stay in step, until more than
    ``max_bad_fraction`` of the split has turned out bad (``bad_samples.py``); with ``raise`` the error
    stops the run. Errors inside the transforms are configuration errors and always raise.

    ``with_paths`` (predict): samples are ``(image, label, path)``, and a skipped file is None rather than
    replaced, so the collate leaves it out of its batch: every file is predicted once or named as bad.
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
    ):
        self.records = records
        self.with_paths = bool(with_paths)
        self.transform = transform
        self.on_bad_sample = parse_on_bad_sample(on_bad_sample)
        self.reduced_decode = bool(reduced_decode)
        self.max_pixels = max_pixels
        self.max_bad_fraction = check_max_bad_fraction(max_bad_fraction)
        self.bad: BadSamples | None = None  # shared flags, set by the datamodule before workers start
        self._floor = None

    def share_bad_samples(self) -> None:
        """Put fresh bad-sample flags in shared memory, for the workers of the loader about to start."""
        self.bad = BadSamples(len(self), self.max_bad_fraction, shared=True)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_floor"] = None  # a closure over the transform: rebuilt in the process that reads
        if state["bad"] is not None and not state["bad"].flags.is_shared():
            state["bad"] = None  # this process's own flags: a new process keeps its own
        return state

    @property
    def floor(self):
        """The smallest size the first transform needs, for reduced-size JPEG decoding (None: full size)."""
        if self._floor is None and self.reduced_decode and self.transform is not None:
            self._floor = minimum_size(self.transform) or False
        return self._floor or None

    def __len__(self) -> int:
        return len(self.records)

    # -- the stages -------------------------------------------------------------------------------
    def read_many(self, indices: list[int]) -> list:
        """(payload, label) per index, as the source reads them fastest: one ``getitems`` call for sources
        that read in bulk (HDF5), else one read each."""
        getitems = getattr(self.records, "getitems", None)
        return getitems(indices) if getitems is not None else [self.records[i] for i in indices]

    def decode(self, payload):
        """Payload -> uint8 (3, H, W), at reduced size where the first transform allows it."""
        return decode(payload, self.floor, self.max_pixels)

    def augment(self, image):
        """The per-sample transform stack."""
        return self.transform(image) if self.transform is not None else image

    # -- the pipeline -----------------------------------------------------------------------------
    def _decode(self, i: int):
        payload, label = self.records[i]
        return self.decode(payload), label

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
        except (OSError, DecodeError):  # fall back to one by one: the bad sample gets named there
            return [self._finish(i, None, seed) for i, seed in pairs]
        return [self._finish(i, record, seed) for (i, seed), record in zip(pairs, records)]

    def _finish(self, i: int, record, seed: int | None = None):
        used = i
        try:
            if record is None:
                image, label = self._decode(i)
            else:
                image, label = self.decode(record[0]), record[1]
        except (OSError, DecodeError) as err:
            self.bad_sample(i, err)
            if self.with_paths:
                return None  # predict: the file is left out of its batch (``WithPaths``), never replaced
            image, label, used = self._substitute(i)
        if seed is not None:
            torch.default_generator.manual_seed(seed)  # the CPU generator alone: 1 us, not 100
        if self.with_paths:
            return self.augment(image), label, self.records.describe(used)
        return self.augment(image), label

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

    def _substitute(self, i: int):
        """(image, label, index) of the next readable sample after ``i``; each bad one met on the way
        counts against the budget."""
        n = len(self)
        for k in range(1, n):
            j = (i + k) % n
            try:
                return (*self._decode(j), j)
            except (OSError, DecodeError) as err:
                self._flags().found(j, self.records.describe(j), err)
        raise BadSampleError(f"every sample of this split is unreadable ({n}): check the data")


def _split(key) -> tuple[int, int | None]:
    return (key[0], key[1]) if isinstance(key, tuple) else (key, None)

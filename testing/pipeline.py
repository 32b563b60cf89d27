"""The contract through feedline's pipeline: samples decode, the bad-sample policy holds, and a loader resumes
into the rest of its epoch with the very batches of an uninterrupted one."""

from __future__ import annotations

import contextlib
import logging

from torchvision.transforms import v2

from feedline.datamodules.bad_samples import BadSampleError
from feedline.datamodules.loaders import ImageLoaders
from feedline.datamodules.samples import SampleDataset
from feedline.datasets.fields import fields_of
from feedline.datasets.records import BadInput
from feedline.testing.common import checking, fail, same
from feedline.transforms.stacks import TransformStacks


def decodes(records, picked: list[int], fields) -> None:
    """Samples ``picked`` decode as feedline decodes them (the image, or each named field by its kind)."""
    dataset = SampleDataset(records, on_bad_sample="raise", fields=fields)
    for i in picked:
        with checking(f'decoding split("train")[{i}] ({records.describe(i)})'):
            dataset[i]


def bad_samples(records, fields) -> None:
    """Sample 0 made to raise BadInput, then OSError, is named and replaced (skip) or named and stopped on
    (raise); made to raise a RuntimeError, it stops the run under skip too."""
    bad, name = 0, records.describe(0)
    expected = SampleDataset(records, fields=fields)[1]  # skip: the next readable sample stands in
    for error in (BadInput("a value that does not parse"), OSError("a file that cannot be read")):
        failing = _Failing(records, bad, error)
        with logged_warnings() as said, checking(f"data.on_bad_sample=skip with {type(error).__name__}"):
            got = SampleDataset(failing, on_bad_sample="skip", fields=fields)[bad]
            same(got, expected) or fail("on_bad_sample=skip", f"sample {bad} was not replaced by sample 1")
        if not any(name in line for line in said):
            fail("on_bad_sample=skip", f"no warning named the skipped sample {name!r}: {said}")
        try:
            SampleDataset(failing, on_bad_sample="raise", fields=fields)[bad]
        except BadSampleError as err:
            if name not in str(err):
                fail("on_bad_sample=raise", f"the error does not name the sample {name!r}: {err}")
        else:
            fail("on_bad_sample=raise", f"a {type(error).__name__} from sample {bad} did not stop the run")
    failing = _Failing(records, bad, RuntimeError("a bug in the source"))
    try:
        SampleDataset(failing, on_bad_sample="skip", fields=fields)[bad]
    except RuntimeError as err:
        if isinstance(err, BadSampleError):
            fail("on_bad_sample=skip", f"a RuntimeError (a bug, not bad data) was taken for bad input: {err}")
    else:
        fail("on_bad_sample=skip", "a RuntimeError (a bug, not bad data) was skipped: it must stop the run")


def resume(source, size: int, seed: int) -> None:
    """Two train loaders with one seed read one order and the same batches (augmentations included); one
    resumed from the other's state after ``k`` batches reads the rest of that order, and the same batches."""
    batch = max(1, min(8, size // 4))  # 4 batches at least: 2 before the cut, 2 after it compared
    k = 2
    with checking("resume: two loaders with one seed"):
        whole, again = train_loader(source, batch, seed), train_loader(source, batch, seed)
        order = [i for i, _ in whole.sampler]
        if order != [i for i, _ in again.sampler]:
            fail("resume", "two loaders with the same seed read the train split in different orders")
        if sorted(order) != list(range(size)):
            fail("resume", f"the epoch's order does not hold each of the {size} samples once")
        first, cut = batches(whole, k + 2), batches(again, k)
        for b, (x, y) in enumerate(zip(first, cut)):
            same(x, y) or fail("resume", f"batch {b} differs between two loaders with the same seed")
    with checking(f"resume: the loader state after {k} batches"):
        resumed = train_loader(source, batch, seed)
        resumed.load_state_dict(again.state_dict())
        rest = [int(i) for i in resumed.sampler.order()]
        if order[: k * batch] + rest != order:
            fail(
                "resume",
                f"after {k} batches the rest of the epoch is not the {len(order) - k * batch} unread samples",
            )
        for b, (x, y) in enumerate(zip(first[k:], batches(resumed, 2))):
            same(x, y) or fail(
                "resume", f"batch {k + b} after the resume differs from the uninterrupted run's"
            )


def train_loader(source, batch_size: int, seed: int):
    # a random crop to one size: batches stack, and each sample's augmentation must follow its own seed
    train = [v2.RandomResizedCrop(16, antialias=True)]
    if fields_of(source).of_kind("boxes"):  # boxes a crop leaves degenerate go, as transforms=detection does
        from feedline.transforms.boxes import SanitizeBoxes

        train.append(SanitizeBoxes())
    stacks = TransformStacks(train=train)
    return ImageLoaders(
        source, stacks, None, batch_size=batch_size, num_workers=0, seed=seed
    ).train_dataloader()


def batches(loader, n: int) -> list[dict]:
    out = []
    for batch in loader:
        loader.position.batches += 1  # what the datamodule counts as each batch arrives (under a Trainer)
        out.append(dict(batch.items()))
        if len(out) == n:
            break
    return out


@contextlib.contextmanager
def logged_warnings():
    """The warnings the bad-sample budget logs, as text."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("feedline.datamodules.bad_samples")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield said
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class _Failing:
    """A split whose sample ``bad`` raises ``error`` when read (every other sample reads as it does)."""

    def __init__(self, records, bad: int, error: Exception):
        self.records, self.bad, self.error = records, bad, error

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        if i == self.bad:
            raise self.error
        return self.records[i]

    def describe(self, i: int) -> str:
        return self.records.describe(i)

"""``check_source``: the contract a source must keep, checked as feedline's own sources are in its test suite.

    check_source(MySource(root=..., seed=1))        # None, or an AssertionError naming what broke

It prepares the source, then checks, in this order (each failure is a ``ContractError`` that names the check,
the split and the sample):

    protocol     classes is a list of names, each once (a source of named fields: its target's class list);
                 prepare() runs twice; split("train") and split("val") are RecordSets (len, [i], describe);
                 a record is (payload, label) with label in range(len(classes)), or a dict of the fields
    names        describe(i) names every sample, each apart (bad samples are reported by it)
    pickles      each split pickles in under 64 KiB once read: paths and numbers, never the sample list
    workers      a DataLoader worker reads the very records the main process reads
    splits       train, val and test (where there is one) share no sample; the source built again with the
                 same arguments (``rebuild``) draws the same splits
    decode       a few samples decode as feedline decodes them (the image, or each named field)
    bad samples  a read raising BadInput or OSError is named and skipped (data.on_bad_sample=skip) or stops
                 the run naming it (raise); any other exception stops the run under either
    resume       two loaders with one seed give the same order and batches; the state taken after k batches
                 resumes into the rest of the epoch, each sample once

Give it a small instance of the source (tens to a few thousand samples): names and splits are read whole.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from feedline.datamodules.bad_samples import BadSampleError
from feedline.datamodules.loaders import ImageLoaders
from feedline.datamodules.samples import SampleDataset
from feedline.datasets.fields import fields_of
from feedline.datasets.records import BadInput, check_class_names
from feedline.transforms.stacks import TransformStacks

MAX_PICKLE = 64 * 1024  # a split's pickle: what every DataLoader worker receives
SPLITS = ("train", "val", "test")


class ContractError(AssertionError):
    """A source broke its contract; the message names the check, and the split and sample where it can."""


@contextlib.contextmanager
def _checking(what: str):
    """Any error inside is reported as a broken ``what``, the source's own error chained to it."""
    try:
        yield
    except ContractError:
        raise
    except Exception as err:
        raise ContractError(f"{what}: {type(err).__name__}: {err}") from err


def _fail(what: str, said: str):
    raise ContractError(f"{what}: {said}")


def check_source(
    source,
    *,
    rebuild: Callable[[], object] | None = None,
    samples: int = 8,
    seed: int = 0,
    multiprocessing_context: str | None = None,
) -> None:
    """Check ``source`` against the Source contract (the module's docstring lists the checks); raise a
    ``ContractError`` (an AssertionError) naming the first that fails.

    ``rebuild``: () -> the same source built again with the same arguments, to check that its seeded splits
    come out the same; default: from ``source.rebuild_config()`` (sources that inherit
    ``feedline.datasets.Source`` have one), else the splits are read twice from ``source`` itself.
    ``samples``: how many samples the worker, decode and bad-sample checks read. ``seed``: the loaders'.
    ``multiprocessing_context``: the worker's start method ("fork", "spawn"; None: the platform's)."""
    splits = _protocol(source)
    fields = fields_of(source)
    for name, records in splits.items():
        _names(records, name)
        _pickles(records, name)
    picked = _spread(len(splits["train"]), samples)
    _workers(splits["train"], picked, multiprocessing_context)
    _disjoint(splits)
    _seeded(source, splits, rebuild if rebuild is not None else _rebuilder(source))
    _decodes(splits["train"], picked, fields)
    _bad_samples(splits["train"], fields)
    _resume(source, len(splits["train"]), seed)


# -- the checks ---------------------------------------------------------------------------------------------
def _protocol(source) -> dict:
    """classes, prepare() and the splits, each record's form; {split name: records} (test where there is one)."""
    for name in ("classes", "prepare", "split"):
        if not hasattr(source, name):
            _fail(
                "protocol", f"{type(source).__name__} has no {name!r} (a Source has classes, prepare, split)"
            )
    with _checking("fields"):
        fields = fields_of(source)
    with _checking("classes"):
        classes = source.classes
        if isinstance(classes, (str, bytes)) or not hasattr(classes, "__len__"):
            _fail("classes", f"is a {type(classes).__name__}, not a list of class names")
        check_class_names(classes, "classes")
        if not fields.is_classification and list(classes) != list(fields.classes):
            _fail("classes", f"{list(classes)} is not the target field's class list {list(fields.classes)}")
    for attempt in ("prepare()", "prepare() again (it runs on every node and every run)"):
        with _checking(attempt):
            source.prepare()
    splits = {}
    for name in SPLITS:
        try:
            records = source.split(name)
        except (ValueError, KeyError, NotImplementedError, FileNotFoundError) as err:
            if name == "test":
                continue  # a source without a test split says so: that is allowed
            raise ContractError(f'split("{name}"): {type(err).__name__}: {err}') from err
        for method in ("__len__", "__getitem__", "describe"):
            if not hasattr(records, method):
                _fail(
                    f'split("{name}")',
                    f"{type(records).__name__} has no {method} (a RecordSet has len, [i], describe)",
                )
        splits[name] = records
    if len(splits["train"]) < 4:
        _fail('split("train")', f"holds {len(splits['train'])} samples: check_source needs 4 or more")
    for name, records in splits.items():
        for i in _spread(len(records), 4):
            with _checking(f'split("{name}")[{i}]'):
                _record_form(records[i], fields, len(classes), f'split("{name}")[{i}]')
    return splits


def _record_form(record, fields, num_classes: int, where: str) -> None:
    if fields.is_classification:
        if not isinstance(record, tuple) or len(record) != 2:
            _fail(where, f"is a {type(record).__name__}, not (payload, label)")
        label = record[1]
        if not isinstance(label, (int, np.integer)) or not 0 <= int(label) < num_classes:
            _fail(where, f"label {label!r} is not an int in range(len(classes)) = range({num_classes})")
    elif not isinstance(record, Mapping) or set(record) != set(fields):
        keys = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        _fail(where, f"reads {keys}, not a dict of the source's fields {sorted(fields)}")


def _names(records, split: str) -> None:
    seen = {}
    for i in range(len(records)):
        with _checking(f'split("{split}").describe({i})'):
            name = records.describe(i)
        if not isinstance(name, str) or not name:
            _fail(f'split("{split}").describe({i})', f"is {name!r}: it must name the sample (a path, a row)")
        if name in seen:
            _fail(f'split("{split}").describe', f"samples {seen[name]} and {i} are both named {name!r}")
        seen[name] = i


def _pickles(records, split: str) -> None:
    with _checking(f'split("{split}") pickled'):
        if len(records):
            records[0]  # maps arrays and opens handles: none of that may travel
        size = len(pickle.dumps(records))
    if size > MAX_PICKLE:
        _fail(
            f'split("{split}") pickled',
            f"{size} bytes, over {MAX_PICKLE}: every worker receives it, so a RecordSet holds paths and numbers "
            "(memory-mapped arrays opened in the process that reads), never the sample list",
        )


def _workers(records, picked: list[int], context: str | None) -> None:
    main = [records[i] for i in picked]
    with _checking(f'a pickled copy of split("train") reads samples {picked}'):
        copy = pickle.loads(pickle.dumps(records))
        _same_rows(main, [copy[i] for i in picked], picked, "a pickled copy")
    loader = DataLoader(
        _Rows(records, picked),
        batch_size=None,
        num_workers=1,
        collate_fn=_as_is,
        multiprocessing_context=context,
    )
    with _checking(f'a DataLoader worker reading split("train") samples {picked}'):
        _same_rows(main, list(loader), picked, "a DataLoader worker")


def _disjoint(splits: dict) -> None:
    names = {n: {r.describe(i) for i in range(len(r))} for n, r in splits.items()}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        if a in names and b in names and names[a] & names[b]:
            both = sorted(names[a] & names[b])
            _fail("splits", f"{len(both)} sample(s) are in both {a} and {b}: {', '.join(both[:3])}")


def _seeded(source, splits: dict, rebuild: Callable[[], object] | None) -> None:
    with _checking("the source built again" if rebuild is not None else "split() called again"):
        again = source
        if rebuild is not None:
            again = rebuild()
            again.prepare()
        for name, records in splits.items():
            other = again.split(name)
            if [records.describe(i) for i in range(len(records))] != [
                other.describe(i) for i in range(len(other))
            ]:
                _fail(f'split("{name}")', "differs when drawn again with the same arguments: seed the split")


def _decodes(records, picked: list[int], fields) -> None:
    dataset = SampleDataset(records, on_bad_sample="raise", fields=fields)
    for i in picked:
        with _checking(f'decoding split("train")[{i}] ({records.describe(i)})'):
            dataset[i]


def _bad_samples(records, fields) -> None:
    bad, name = 0, records.describe(0)
    expected = SampleDataset(records, fields=fields)[1]  # skip: the next readable sample stands in
    for error in (BadInput("a value that does not parse"), OSError("a file that cannot be read")):
        failing = _Failing(records, bad, error)
        with _warnings() as said, _checking(f"data.on_bad_sample=skip with {type(error).__name__}"):
            got = SampleDataset(failing, on_bad_sample="skip", fields=fields)[bad]
            _same(got, expected) or _fail("on_bad_sample=skip", f"sample {bad} was not replaced by sample 1")
        if not any(name in line for line in said):
            _fail("on_bad_sample=skip", f"no warning named the skipped sample {name!r}: {said}")
        try:
            SampleDataset(failing, on_bad_sample="raise", fields=fields)[bad]
        except BadSampleError as err:
            if name not in str(err):
                _fail("on_bad_sample=raise", f"the error does not name the sample {name!r}: {err}")
        else:
            _fail("on_bad_sample=raise", f"a {type(error).__name__} from sample {bad} did not stop the run")
    failing = _Failing(records, bad, RuntimeError("a bug in the source"))
    try:
        SampleDataset(failing, on_bad_sample="skip", fields=fields)[bad]
    except RuntimeError as err:
        if isinstance(err, BadSampleError):
            _fail(
                "on_bad_sample=skip", f"a RuntimeError (a bug, not bad data) was taken for bad input: {err}"
            )
    else:
        _fail("on_bad_sample=skip", "a RuntimeError (a bug, not bad data) was skipped: it must stop the run")


def _resume(source, size: int, seed: int) -> None:
    batch = max(1, min(8, size // 4))  # 4 batches at least: 2 before the cut, 2 after it compared
    k = 2
    with _checking("resume: two loaders with one seed"):
        whole, again = _train_loader(source, batch, seed), _train_loader(source, batch, seed)
        order = [i for i, _ in whole.sampler]
        if order != [i for i, _ in again.sampler]:
            _fail("resume", "two loaders with the same seed read the train split in different orders")
        if sorted(order) != list(range(size)):
            _fail("resume", f"the epoch's order does not hold each of the {size} samples once")
        first, cut = _batches(whole, k + 2), _batches(again, k)
        for b, (x, y) in enumerate(zip(first, cut)):
            _same(x, y) or _fail("resume", f"batch {b} differs between two loaders with the same seed")
    with _checking(f"resume: the loader state after {k} batches"):
        resumed = _train_loader(source, batch, seed)
        resumed.load_state_dict(again.state_dict())
        rest = [int(i) for i in resumed.sampler.order()]
        if order[: k * batch] + rest != order:
            _fail(
                "resume",
                f"after {k} batches the rest of the epoch is not the {len(order) - k * batch} unread samples",
            )
        for b, (x, y) in enumerate(zip(first[k:], _batches(resumed, 2))):
            _same(x, y) or _fail(
                "resume", f"batch {k + b} after the resume differs from the uninterrupted run's"
            )


# -- helpers --------------------------------------------------------------------------------------------------
def _train_loader(source, batch_size: int, seed: int):
    # a random crop to one size: batches stack, and each sample's augmentation must follow its own seed
    stacks = TransformStacks(train=[v2.RandomResizedCrop(16, antialias=True)])
    return ImageLoaders(
        source, stacks, None, batch_size=batch_size, num_workers=0, seed=seed
    ).train_dataloader()


def _batches(loader, n: int) -> list[dict]:
    out = []
    for batch in loader:
        loader.position.batches += 1  # what the datamodule counts as each batch arrives (under a Trainer)
        out.append(dict(batch.items()))
        if len(out) == n:
            break
    return out


def _rebuilder(source) -> Callable[[], object] | None:
    config = source.rebuild_config() if callable(getattr(source, "rebuild_config", None)) else None
    if config is None:
        return None
    from hydra.utils import instantiate

    return lambda: instantiate(config)


def _spread(n: int, k: int) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, n - 1, min(n, k))}) if n else []


def _same_rows(main: list, other: list, picked: list[int], who: str) -> None:
    for i, a, b in zip(picked, main, other):
        _same(a, b) or _fail("workers", f"{who} reads sample {i} otherwise than the main process")


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or isinstance(a, np.ndarray):
        a, b = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (a, b))
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _as_is(sample):
    return sample


@contextlib.contextmanager
def _warnings():
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


class _Rows(Dataset):
    """Records ``picked`` of a split, as they are: what a worker reads."""

    def __init__(self, records, picked: list[int]):
        self.records, self.picked = records, picked

    def __len__(self) -> int:
        return len(self.picked)

    def __getitem__(self, k: int):
        return self.records[self.picked[k]]


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

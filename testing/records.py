"""The source's side of the contract: the protocol, the names, the pickles, the rows a worker reads, the splits."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping

import numpy as np
from torch.utils.data import DataLoader, Dataset

from feedline.datasets.fields import fields_of
from feedline.datasets.records import check_class_names
from feedline.testing.common import ContractError, checking, fail, same, spread

MAX_PICKLE = 64 * 1024  # a split's pickle: what every DataLoader worker receives
SPLITS = ("train", "val", "test")


def protocol(source) -> dict:
    """classes, prepare() and the splits, each record's form; {split name: records} (test where there is one)."""
    for name in ("classes", "prepare", "split"):
        if not hasattr(source, name):
            fail(
                "protocol", f"{type(source).__name__} has no {name!r} (a Source has classes, prepare, split)"
            )
    with checking("fields"):
        fields = fields_of(source)
    with checking("classes"):
        classes = source.classes
        if isinstance(classes, (str, bytes)) or not hasattr(classes, "__len__"):
            fail("classes", f"is a {type(classes).__name__}, not a list of class names")
        check_class_names(classes, "classes")
        if not fields.is_classification and list(classes) != list(fields.classes):
            fail("classes", f"{list(classes)} is not the target field's class list {list(fields.classes)}")
    for attempt in ("prepare()", "prepare() again (it runs on every node and every run)"):
        with checking(attempt):
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
                fail(
                    f'split("{name}")',
                    f"{type(records).__name__} has no {method} (a RecordSet has len, [i], describe)",
                )
        splits[name] = records
    if len(splits["train"]) < 4:
        fail('split("train")', f"holds {len(splits['train'])} samples: check_source needs 4 or more")
    for name, records in splits.items():
        for i in spread(len(records), 4):
            with checking(f'split("{name}")[{i}]'):
                record_form(records[i], fields, len(classes), f'split("{name}")[{i}]')
    return splits


def record_form(record, fields, num_classes: int, where: str) -> None:
    if fields.is_classification:
        if not isinstance(record, tuple) or len(record) != 2:
            fail(where, f"is a {type(record).__name__}, not (payload, label)")
        label = record[1]
        if not isinstance(label, (int, np.integer)) or not 0 <= int(label) < num_classes:
            fail(where, f"label {label!r} is not an int in range(len(classes)) = range({num_classes})")
    elif not isinstance(record, Mapping) or set(record) != set(fields):
        keys = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        fail(where, f"reads {keys}, not a dict of the source's fields {sorted(fields)}")


def names(records, split: str) -> None:
    seen = {}
    for i in range(len(records)):
        with checking(f'split("{split}").describe({i})'):
            name = records.describe(i)
        if not isinstance(name, str) or not name:
            fail(f'split("{split}").describe({i})', f"is {name!r}: it must name the sample (a path, a row)")
        if name in seen:
            fail(f'split("{split}").describe', f"samples {seen[name]} and {i} are both named {name!r}")
        seen[name] = i


def pickles(records, split: str) -> None:
    with checking(f'split("{split}") pickled'):
        if len(records):
            records[0]  # maps arrays and opens handles: none of that may travel
        size = len(pickle.dumps(records))
    if size > MAX_PICKLE:
        fail(
            f'split("{split}") pickled',
            f"{size} bytes, over {MAX_PICKLE}: every worker receives it, so a RecordSet holds paths and numbers "
            "(memory-mapped arrays opened in the process that reads), never the sample list",
        )


def workers(records, picked: list[int], context: str | None) -> None:
    main = [records[i] for i in picked]
    with checking(f'a pickled copy of split("train") reads samples {picked}'):
        copy = pickle.loads(pickle.dumps(records))
        same_rows(main, [copy[i] for i in picked], picked, "a pickled copy")
    loader = DataLoader(
        _Rows(records, picked),
        batch_size=None,
        num_workers=1,
        collate_fn=as_is,
        multiprocessing_context=context,
    )
    with checking(f'a DataLoader worker reading split("train") samples {picked}'):
        same_rows(main, list(loader), picked, "a DataLoader worker")


def disjoint(splits: dict) -> None:
    names = {n: {r.describe(i) for i in range(len(r))} for n, r in splits.items()}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        if a in names and b in names and names[a] & names[b]:
            both = sorted(names[a] & names[b])
            fail("splits", f"{len(both)} sample(s) are in both {a} and {b}: {', '.join(both[:3])}")


def seeded(source, splits: dict, rebuild: Callable[[], object] | None) -> None:
    with checking("the source built again" if rebuild is not None else "split() called again"):
        again = source
        if rebuild is not None:
            again = rebuild()
            again.prepare()
        for name, records in splits.items():
            other = again.split(name)
            if [records.describe(i) for i in range(len(records))] != [
                other.describe(i) for i in range(len(other))
            ]:
                fail(f'split("{name}")', "differs when drawn again with the same arguments: seed the split")


def rebuilder(source) -> Callable[[], object] | None:
    config = source.rebuild_config() if callable(getattr(source, "rebuild_config", None)) else None
    if config is None:
        return None
    from hydra.utils import instantiate

    return lambda: instantiate(config)


def same_rows(main: list, other: list, picked: list[int], who: str) -> None:
    for i, a, b in zip(picked, main, other):
        same(a, b) or fail("workers", f"{who} reads sample {i} otherwise than the main process")


def as_is(sample):
    return sample


class _Rows(Dataset):
    """Records ``picked`` of a split, as they are: what a worker reads."""

    def __init__(self, records, picked: list[int]):
        self.records, self.picked = records, picked

    def __len__(self) -> int:
        return len(self.picked)

    def __getitem__(self, k: int):
        return self.records[self.picked[k]]

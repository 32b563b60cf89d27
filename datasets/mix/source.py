"""``source=mix``: several sources as one, each part drawn by weight (or a fixed count) every epoch.

    parts       name -> {source, weight | samples, class_map, label, transforms}; any feedline source
    classes     merged by name: the first part's classes in its order, then each later part's new names in
                its order; a part renames or merges its classes (``class_map``) or labels all its samples
                one class (``label``)
    fields      parts with named fields hold the same fields (class lists aside); each class, classes, mask and
                boxes field's class lists merge by the same rule, and a part's indices are remapped as its
                records are read (``labels.py``)
    train       each epoch a draw (``datasets/mix/order.py``): a pure function of (seed, epoch) over the parts'
                train splits, so the sampler, the DDP partition and resume treat it as any source's order
    val, test   the union of the parts' splits, unweighted; each record knows its part (``part_of``), so
                validation reports accuracy per part and the datamodule applies a part's own ``transforms``

A part's records are read as that source reads them (its files, its cache, its S3 endpoint); the mix adds
one lookup (the part of a row) and maps the label. It pickles as its parts' records: small.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline.datasets.fields import Fields
from feedline.datasets.mix.checks import check_parts, same_fields
from feedline.datasets.mix.labels import merge_fields
from feedline.datasets.mix.order import quotas
from feedline.datasets.mix.parts import Part, _count, _named, merge_classes
from feedline.datasets.mix.records import MixRecords
from feedline.datasets.records import Source
from feedline.datasets.splits import check_split

log = logging.getLogger(__name__)


class MixSource(Source):
    """Named ``parts``, each any feedline source with a ``weight`` (or ``samples`` per epoch); ``epoch_size``
    samples an epoch (None: the weighted parts' train sizes plus the fixed counts)."""

    def __init__(self, parts: Mapping[str, Mapping[str, Any]], epoch_size: int | None = None):
        if not isinstance(parts, Mapping) or not parts:
            raise ValueError(
                "source.parts is empty: add parts, e.g. +source/parts@source.parts.base=folder "
                "source.parts.base.source.root=/data/base"
            )
        if epoch_size is not None and (not _count(epoch_size) or epoch_size < 1):
            raise ValueError(f"source.epoch_size={epoch_size!r}: a number of samples, at least 1, or null")
        self.parts = [Part(name, spec) for name, spec in parts.items()]
        check_parts(self.parts)  # no data shared between parts, nor a chunk cache under two limits
        self.epoch_size = int(epoch_size) if epoch_size is not None else None
        self._merged = None
        self._fields: tuple | None = None  # (merged Fields, each part's maps), or (None, no maps)

    @property
    def part_names(self) -> list[str]:
        return [p.name for p in self.parts]

    def _classes(self):
        if self._merged is None:
            self._merged = merge_classes(self.parts)
            names = self._merged[0]
            # the merged classes are the model's outputs: say them once, as class_map and label left them
            log.info(
                "source=mix classes (%d): %s%s",
                len(names),
                ", ".join(names[:30]),
                f", ... ({len(names) - 30} more)" if len(names) > 30 else "",
            )
        return self._merged

    @property
    def classes(self) -> list[str]:
        fields = self.fields
        return fields.classes if fields is not None else self._classes()[0]

    def _merged_fields(self) -> tuple:
        if self._fields is None:
            same = same_fields(self.parts)  # refused by name where the parts hold other fields
            self._fields = merge_fields(self.parts) if same is not None else (None, [{} for _ in self.parts])
        return self._fields

    @property
    def fields(self) -> Fields | None:
        """The parts' fields, which must be the same but for their class lists, merged (None: image and
        class, whose class lists merge as ``classes``)."""
        return self._merged_fields()[0]

    def part_transforms(self) -> dict[int, Any]:
        """Each part's own per-sample train stack (a list of transforms), where it has one ([]: none)."""
        return {k: p.transforms for k, p in enumerate(self.parts) if p.transforms is not None}

    def prepare(self) -> None:
        for part in self.parts:
            try:
                part.source.prepare()
            except Exception as err:
                raise _named(err, part.name) from err
        self._merged = self._fields = None
        fields = self._merged_fields()[0]
        if fields is None:
            self._classes()  # says the merged classes
        else:
            for f in fields.values():  # the merged class lists, said once
                if f.classes:
                    more = f", ... ({len(f.classes) - 30} more)" if len(f.classes) > 30 else ""
                    log.info(
                        "source=mix %s classes (%d): %s%s",
                        f.name,
                        len(f.classes),
                        ", ".join(f.classes[:30]),
                        more,
                    )

    def _split_of(self, part: Part, name: str):
        try:
            return part.source.split(name)
        except Exception as err:
            raise _named(err, part.name) from err

    def split(self, name: str) -> MixRecords:
        name = check_split(name)
        fields, field_maps = self._merged_fields()
        maps = self._classes()[1] if fields is None else [np.zeros(0, np.int64)] * len(self.parts)
        if name == "train":
            records = [self._split_of(p, name) for p in self.parts]
            counts = quotas(
                [len(r) for r in records],
                [p.weight for p in self.parts],
                [p.samples for p in self.parts],
                self.epoch_size,
            )
            empty = [p.name for p, r, c in zip(self.parts, records, counts) if c and not len(r)]
            if empty:
                raise ValueError(f"source.parts.{empty[0]} has no train samples to draw from")
            return MixRecords(self.part_names, records, maps, counts, field_maps)
        names, records, kept, kept_fields = [], [], [], []
        errors = []
        for part, mapping, field_map in zip(self.parts, maps, field_maps):
            try:
                records.append(self._split_of(part, name))
            except ValueError as err:
                if name != "test" or "has no test split" not in str(err):
                    raise
                errors.append(str(err))  # a part without a test split: the others' still count
                continue
            share = getattr(part.source, f"{name}_fraction", 0)
            if share and not len(records[-1]):  # as the datamodule says of a source alone
                message = (
                    f"{part.key}.source.{name}_fraction={share} holds out no sample: each class's share rounds "
                    f"to 0, or would take its last training sample; raise it, or add samples"
                )
                if name == "test":
                    raise ValueError(f"the test split of {part.key} is empty: {message}")
                log.warning("the val split of %s is empty: %s", part.key, message)
            names.append(part.name)
            kept.append(mapping)
            kept_fields.append(field_map)
        if not records:
            raise ValueError(f"no part of the mix has a {name} split: {'; '.join(errors)}")
        return MixRecords(names, records, kept, field_maps=kept_fields)

    def __repr__(self) -> str:  # each part's own: a conversion of the mix records what it was made from
        return f"MixSource({', '.join(f'{p.name}={p.source!r}' for p in self.parts)})"

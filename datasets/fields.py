"""The sample model: a sample is a mapping of named fields, each of a declared kind; one field is the target.

    kind      a source reads (``records[i][name]``)          a sample holds (after decode)      a batch holds
    image     encoded bytes, or a uint8 (C, H, W) array      tv_tensors.Image uint8 (3, H, W)    uint8 (N, 3, H, W)
    mask      encoded PNG bytes, or a uint8 (H, W) array     tv_tensors.Mask uint8 (1, H, W)     uint8 (N, H, W)
    class     int (an index into ``classes``)                int                                  int64 (N,)
    classes   int array of the indices present               float32 multi-hot (C,)               float32 (N, C)
    number    float                                          float                                float32 (N,)
    vector    float array (D,)                               float32 (D,)                         float32 (N, D)
    text      str                                            str                                  list[str]
    json      str (JSON text)                                the parsed value                     list
    boxes     {"boxes": (M, 4) in ``format``, "labels": (M,)   {"boxes": BoundingBoxes XYXY,       list of those dicts
              int, optional "iscrowd", "area", "image_id",     "labels": int64 (M,), ...}:
              "masks": (M, H, W) or M COCO segmentations}      torchvision's detection target

A classification sample is ``{image, label}`` with ``label`` (kind ``class``) the target: every source that
declares no fields reads that (``CLASSIFICATION``) and keeps its ``(payload, label)`` records and its fast path.
Order, partition, resume and the chunk cache work on rows and never look inside a sample, so every guarantee
holds for every kind. Standard library only: the config schemas import it.
"""

from __future__ import annotations

import hashlib
import keyword
import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

KINDS = ("image", "mask", "class", "classes", "number", "vector", "text", "json", "boxes")
SPATIAL = ("image", "mask")  # fields of pixels: a crop or flip moves them together
GEOMETRIC = (*SPATIAL, "boxes")  # every field a crop or flip moves
LABELLED = ("class", "classes", "mask", "boxes")  # kinds whose values index a class list
BOX_FORMATS = ("XYXY", "XYWH", "CXCYWH")  # a boxes field's ``format``: torchvision's names (COCO's is XYWH)
PER_BOX = ("labels", "iscrowd", "area", "masks")  # what a boxes value holds per box besides its coordinates
# Names a batch uses for what it carries besides the fields: a sample field may not take them.
RESERVED = (
    "valid",
    "paths",
    "part",
    "x_name",
    "y_name",
    "to",
    "pin_memory",
    "replace",
    "apply",
    "keys",
    "items",
    "values",
    "get",
    "of",
)
_SAID: set = set()  # (field key, ignore_index) warned about in this process
IGNORE_INDEX = 255  # a mask's "no class here" value: padding, and the void label of VOC-style masks


@dataclass(frozen=True)
class Field:
    """One field of a sample: its ``kind``, where a table keeps it (``column``, default the field's name), the
    class list of a ``class``/``classes``/``mask`` field (index -> name), and a mask's ``ignore_index``."""

    name: str
    kind: str
    column: str | None = None
    classes: tuple[str, ...] | None = None
    ignore_index: int = IGNORE_INDEX
    separator: str = " "  # classes: how one table cell lists several class names
    format: str = "XYXY"  # boxes: the coordinates' format as the source reads them (``BOX_FORMATS``)

    @property
    def source_column(self) -> str:
        return self.column if self.column is not None else self.name


class Fields(Mapping):
    """A sample's fields by name, in order, with the ``target`` (what ``y`` is in ``x, y = batch``) and the
    ``input`` (``x``: the first image field)."""

    def __init__(self, fields, target: str, where: str = "source.fields"):
        fields = list(fields.values() if isinstance(fields, Mapping) else fields)
        self._fields = {f.name: f for f in fields}
        if len(self._fields) != len(fields):
            raise ValueError(f"{where} names a field twice")
        for f in fields:
            check_field(f, where)
        images = [f.name for f in fields if f.kind == "image"]
        if not images:
            raise ValueError(
                f"{where} has no field of kind image: a sample needs one, as `x` of `x, y = batch`"
            )
        self.input = images[0]
        boxes = [f.name for f in fields if f.kind == "boxes"]
        if len(boxes) > 1:
            raise ValueError(
                f"{where} has {len(boxes)} fields of kind boxes ({', '.join(boxes)}): a sample holds at most one "
                "(torchvision's box transforms move one set of boxes per image); list every box in one field"
            )
        masks = [f.name for f in fields if f.kind == "mask"]
        if boxes and masks:
            raise ValueError(
                f"{where} has boxes ({boxes[0]}) beside a segmentation mask ({masks[0]}): sanitizing the boxes "
                f"would also drop rows of the mask. Give instance masks inside the boxes field (its 'masks'), "
                "or train the two tasks from two sources"
            )
        if target not in self._fields:
            raise ValueError(
                f"source.target={target!r} is not one of the fields ({', '.join(self._fields)}): name the field "
                "that is `y` in `x, y = batch`"
            )
        if target == self.input:
            raise ValueError(f"source.target={target!r} is the input image; name another field")
        self.target = target

    def __getitem__(self, name: str) -> Field:
        return self._fields[name]

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other) -> bool:
        return isinstance(other, Fields) and self.identity() == other.identity()

    def __hash__(self) -> int:
        return hash(self.identity())

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name}: {f.kind}" for f in self._fields.values())
        return f"Fields({{{inner}}}, target={self.target!r})"

    def of_kind(self, *kinds: str) -> list[Field]:
        return [f for f in self._fields.values() if f.kind in kinds]

    @property
    def is_classification(self) -> bool:
        """Image and class, nothing else: the fast ``(payload, label)`` path."""
        return self == CLASSIFICATION

    @property
    def classes(self) -> list[str]:
        """The target's class list (the model's outputs); empty for a target without one."""
        return list(self[self.target].classes or ())

    def identity(self, columns: bool = True) -> str:
        """Names, kinds, columns and class lists, as text: what a resume compares (``digest``). Without
        ``columns``: what a sample holds, wherever a table keeps it (the parts of a mix compare that)."""
        lines = [
            f"{f.name}\t{f.kind}\t{f.source_column if columns else ''}\t"
            f"{f.ignore_index if f.kind == 'mask' else f.format if f.kind == 'boxes' and columns else ''}\t"
            + "\x1f".join(f.classes or ())
            for f in self._fields.values()
        ]
        return "\n".join([*lines, f"target\t{self.target}"])

    def describe(self) -> str:
        """The fields in words, for messages: ``image: image, mask: mask (3 classes); target mask``."""
        said = ", ".join(
            f"{f.name}: {f.kind}" + (f" ({len(f.classes)} classes)" if f.classes else "")
            for f in self.values()
        )
        return f"{said}; target {self.target}"

    def digest(self) -> str:
        return hashlib.blake2b(self.identity().encode(), digest_size=6).hexdigest()


def check_field(f: Field, where: str) -> None:
    key = f"{where}.{f.name}"
    if not f.name.isidentifier() or keyword.iskeyword(f.name) or f.name.startswith("_"):
        raise ValueError(
            f"{key}: a field's name must be a Python identifier not starting with _ (batch.{f.name})"
        )
    if f.name in RESERVED:
        raise ValueError(
            f"{key}: {f.name!r} is a name a batch keeps for itself ({', '.join(RESERVED)}); rename it"
        )
    if f.kind not in KINDS:
        raise ValueError(f"{key}.kind={f.kind!r} is not one of: {', '.join(KINDS)}")
    if f.kind == "classes" and not f.classes:
        raise ValueError(f"{key}: a field of kind classes needs its class list ({key}.classes=[...])")
    if f.classes is not None and f.kind not in LABELLED:
        raise ValueError(f"{key}.classes: only fields of kind {', '.join(LABELLED)} have a class list")
    if f.classes is not None:
        names = [str(c) for c in f.classes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{key}.classes names {', '.join(map(repr, twice[:5]))} more than once")
    if f.kind == "boxes" and f.format not in BOX_FORMATS:
        raise ValueError(
            f"{key}.format={f.format!r} is not one of: {', '.join(BOX_FORMATS)} (COCO's is XYWH)"
        )
    if f.kind == "mask" and not 0 <= int(f.ignore_index) <= 255:
        raise ValueError(f"{key}.ignore_index={f.ignore_index} must be in 0..255 (masks are uint8)")
    if f.kind in LABELLED and f.classes is not None and not f.classes:
        raise ValueError(f"{key}.classes is empty: list the class names, in index order")
    if f.kind == "mask" and f.classes is not None:
        if len(f.classes) > 255:
            raise ValueError(
                f"{key}.classes lists {len(f.classes)} classes: a mask is uint8, so it holds at most 255 classes "
                "beside its ignore_index"
            )
        if int(f.ignore_index) < len(f.classes) and (key, f.ignore_index) not in _SAID:
            _SAID.add((key, f.ignore_index))  # once: fields are built in every process
            log.warning(
                "%s.ignore_index=%d is a class index (%r): its pixels never train nor count in the IoU. Right for "
                "a void class kept in the list (ADE20K's 0); else set %s.ignore_index to a value from %d to 255",
                key,
                f.ignore_index,
                f.classes[int(f.ignore_index)],
                key,
                len(f.classes),
            )


_KEYS = ("column", "kind", "classes", "ignore_index", "separator", "format")


def fields_from_config(fields: Mapping, target: str | None, where: str = "source.fields") -> Fields:
    """``source.fields`` (name -> {column, kind, classes, ...}, or name -> kind) and ``source.target``."""
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError(f"{where} must map each field's name to {{column: ..., kind: ...}}")
    out = []
    for name, spec in fields.items():
        if isinstance(spec, str):
            spec = {"kind": spec}
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}.{name} must be a mapping ({{column: ..., kind: ...}}) or a kind")
        unknown = sorted(set(spec) - set(_KEYS))
        if unknown:
            raise ValueError(f"{where}.{name}.{unknown[0]} is not a field key ({', '.join(_KEYS)})")
        if "kind" not in spec:
            raise ValueError(f"{where}.{name}.kind is required (one of: {', '.join(KINDS)})")
        classes = spec.get("classes")
        if classes is not None and (isinstance(classes, str) or not hasattr(classes, "__iter__")):
            raise ValueError(f"{where}.{name}.classes must be a list of class names")
        ignore = spec.get("ignore_index")
        out.append(
            Field(
                name=str(name),
                kind=str(spec["kind"]),
                column=None if spec.get("column") is None else str(spec["column"]),
                classes=None if classes is None else tuple(str(c) for c in classes),
                ignore_index=IGNORE_INDEX if ignore is None else int(ignore),
                separator=str(spec.get("separator") or " "),
                format=str(spec.get("format") or "XYXY").upper(),
            )
        )
    if target is None:
        labelled = [f.name for f in out if f.kind != "image"]
        if len(labelled) != 1:
            raise ValueError(
                f"source.target is required: name the field that is `y` in `x, y = batch` ({where})"
            )
        target = labelled[0]
    return Fields(out, str(target), where)


CLASSIFICATION = Fields([Field("image", "image"), Field("label", "class")], target="label")


def fields_of(source) -> Fields:
    """What a source's samples hold: its ``fields``, or image and class for a source that declares none."""
    fields = getattr(source, "fields", None)
    return fields if fields is not None else CLASSIFICATION


def check_classes(source, fields: Fields) -> None:
    """A source with fields says its classes twice, as ``classes`` and as its target's class list: they must
    agree, or the model would get another number of outputs than the target has classes."""
    said, declared = list(source.classes), fields.classes
    if declared and said != declared:
        raise ValueError(
            f"{type(source).__name__}.classes ({len(said)}: {', '.join(said[:5])}{', ...' if len(said) > 5 else ''}) "
            f"is not its target field {fields.target!r}'s class list ({len(declared)}: "
            f"{', '.join(declared[:5])}{', ...' if len(declared) > 5 else ''}): return fields.classes from classes"
        )

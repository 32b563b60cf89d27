"""The class lists of a mix whose parts hold named fields: merged per field, and each part's indices remapped
as its records are read.

    compared   the parts' fields as a sample holds them (names, kinds, the target, a mask's ignore_index; not
               the columns, not the class lists): another one is refused by name
    merged     each field of kind class, classes, mask or boxes gets the union of the parts' class lists: the
               first part's list in its order, then each later part's names it has not seen, in its order
               (parts in the order the config lists them), as classification parts merge
    remapped   at read time, where a part's indices are not the merged ones: a class through an index array, a
               multi-hot's index array and a boxes field's labels likewise, a mask's pixels through a lookup table
               (256 entries; the ignore_index kept, a value that is neither a class of the part nor its
               ignore_index is bad input, as it would be read alone); a part's boxes in another ``format``
               than the first part's are converted to it (XYWH, CXCYWH, XYXY)

A part whose indices are already the merged ones (always the first) is read as it is: no copy.
"""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np

from feedline.datasets.fields import Fields, fields_of
from feedline.datasets.mix.checks import _spelling
from feedline.datasets.records import BadInput

MERGED = ("class", "classes", "mask", "boxes")  # kinds whose values index a class list


def merge_fields(parts) -> tuple[Fields, list[dict]]:
    """(the mix's fields, each part's {field: (kind, map)}), for parts already found to hold the same fields
    (``checks.same_fields``). The merged fields keep the first part's order and settings."""
    each = [fields_of(part.source) for part in parts]
    first = each[0]
    out, maps = [], [{} for _ in parts]
    for name, field in first.items():
        if field.kind not in MERGED or field.classes is None:
            out.append(field)
            for k, fields in enumerate(each):  # boxes without class lists: only a format to convert
                fmt = getattr(fields[name], "format", None)
                if field.kind == "boxes" and fmt != field.format:
                    maps[k][name] = (field.kind, None, (fmt, field.format))
            continue
        lists = [list(fields[name].classes) for fields in each]
        _check_spellings(parts, name, lists)
        union: list[str] = []
        where: dict[str, int] = {}
        for own in lists:
            for n in own:
                if n not in where:
                    where[n] = len(union)
                    union.append(n)
        if field.kind == "mask":
            _check_mask(parts, field, lists, union)
        for k, own in enumerate(lists):
            index = np.array([where[n] for n in own], dtype=np.int64)
            fmt = getattr(each[k][name], "format", None) if field.kind == "boxes" else None
            convert = (fmt, field.format) if field.kind == "boxes" and fmt != field.format else None
            if not np.array_equal(index, np.arange(len(own))):
                maps[k][name] = (
                    field.kind,
                    _lookup(index, field) if field.kind == "mask" else index,
                    convert,
                )
            elif convert:
                maps[k][name] = (field.kind, None, convert)
        out.append(replace(field, classes=tuple(union)))
    try:
        return Fields(out, first.target, "source.parts (merged)"), maps
    except ValueError as err:
        raise ValueError(f"the parts' class lists cannot merge: {err}") from None


def _check_spellings(parts, name: str, lists: list[list[str]]) -> None:
    """``Cat`` in one part and ``cat`` in another would merge as two classes: refused, naming both."""
    seen: dict[str, tuple[str, object]] = {}
    for part, own in zip(parts, lists):
        for n in own:
            other = seen.setdefault(_spelling(n), (n, part))
            if other[0] != n:
                raise ValueError(
                    f"field {name!r}: {other[1].key} has class {other[0]!r} and {part.key} class {n!r}; they "
                    f"differ only in case, spaces or Unicode form, so merged by name they would be two classes. "
                    f"Rename one in its part's source"
                )


def _check_mask(parts, field, lists, union) -> None:
    """A mask is uint8 and its ignore_index a pixel value: the merged list must stay below both."""
    ignore = int(field.ignore_index)
    clear = all(len(own) <= ignore for own in lists)  # a void class kept in the list (ADE20K's 0) stays one
    if len(union) > 255 or (clear and len(union) > ignore):
        raise ValueError(
            f"field {field.name!r}: the parts' mask classes merge into {len(union)} classes, which reach its "
            f"ignore_index={ignore} (or uint8's 255): a merged pixel value would read as void. Give the parts' "
            f"sources an ignore_index above {len(union) - 1}, or fewer classes"
        )


def _lookup(index: np.ndarray, field) -> np.ndarray:
    """A mask's 256 pixel values -> the merged ones: int16, -1 for a value neither a class nor void."""
    table = np.full(256, -1, dtype=np.int16)
    table[int(field.ignore_index)] = int(field.ignore_index)
    table[: len(index)] = index
    return table


def remap(record: dict, maps: dict, part: str) -> dict:
    """A part's record with its indices as the mix's (``maps``: {field: (kind, map, boxes' (from, to) format
    or None)} from ``merge_fields``)."""
    if not maps:
        return record
    out = dict(record)
    for name, (kind, index, convert) in maps.items():
        value = out.get(name)
        if value is None:
            continue  # the records' own check names a missing field
        try:
            if kind == "class":
                out[name] = int(index[_label(value)])
            elif kind == "classes":
                out[name] = index[_indices(value, index, "classes")]
            elif kind == "boxes":
                value = dict(value)
                if index is not None:
                    value["labels"] = index[_indices(value["labels"], index, "box labels")]
                if convert:
                    value["boxes"] = convert_boxes(value["boxes"], *convert)
                out[name] = value
            else:
                out[name] = _remap_mask(value, index)
        except IndexError:
            raise BadInput(
                f"part {part}, field {name!r}: a class index beyond the part's {len(index)} classes"
            ) from None
        except BadInput as err:
            raise BadInput(f"part {part}, field {name!r}: {err}") from None
    return out


def convert_boxes(boxes, old: str, new: str) -> np.ndarray:
    """(M, 4) boxes from one format (XYXY, XYWH, CXCYWH) to another, float32."""
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    x, y, c, d = b.T
    if old == "XYWH":
        x0, y0, x1, y1 = x, y, x + c, y + d
    elif old == "CXCYWH":
        x0, y0, x1, y1 = x - c / 2, y - d / 2, x + c / 2, y + d / 2
    else:
        x0, y0, x1, y1 = x, y, c, d
    if new == "XYWH":
        return np.stack([x0, y0, x1 - x0, y1 - y0], axis=1)
    if new == "CXCYWH":
        return np.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], axis=1)
    return np.stack([x0, y0, x1, y1], axis=1)


def _label(value) -> int:
    label = int(value)
    if label < 0:
        raise IndexError(label)
    return label


def _indices(value, index: np.ndarray, what: str) -> np.ndarray:
    """A part's class indices as int64, each checked to be one of the part's classes: numpy would read -1 as
    the last merged class, a valid and wrong label."""
    indices = np.asarray(value, dtype=np.int64).reshape(-1)
    wrong = indices[(indices < 0) | (indices >= len(index))]
    if len(wrong):
        shown = ", ".join(map(str, wrong[:5].tolist()))
        raise BadInput(
            f"{what} [{shown}] are not all in 0..{len(index) - 1}, the part's {len(index)} classes"
        )
    return indices


def _remap_mask(value, table: np.ndarray) -> np.ndarray:
    """Encoded mask bytes (palette or grayscale) or a uint8 (H, W) array -> the remapped uint8 (H, W)."""
    pixels = np.asarray(value)
    if pixels.ndim == 1:  # encoded: the pixel values are only known decoded
        from PIL import Image

        try:
            with Image.open(io.BytesIO(pixels.tobytes())) as image:
                if image.mode not in ("L", "P"):
                    raise BadInput(
                        f"a {image.mode} mask: one channel of class indices (a grayscale or palette PNG) is needed"
                    )
                pixels = np.asarray(image)
        except OSError as err:
            raise BadInput(f"the mask does not decode ({err})") from None
    elif pixels.ndim == 3 and pixels.shape[0] == 1:
        pixels = pixels[0]
    if pixels.dtype != np.uint8 or pixels.ndim != 2:
        raise BadInput(f"a mask array must be uint8 (H, W), not {pixels.dtype} {pixels.shape}")
    mapped = table[pixels]
    if (mapped < 0).any():
        bad = int(pixels[mapped < 0][0])
        raise BadInput(f"mask pixel value {bad} is neither one of the part's classes nor its ignore_index")
    return mapped.astype(np.uint8)

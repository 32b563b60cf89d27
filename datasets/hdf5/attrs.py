"""What an HDF5 file's attributes say, checked where they are read.

``convert.py`` writes these on the file (``writers/hdf5.py``):

    feedline_format  1 (FORMAT): the layout below; a file without it is foreign
    classes          JSON list of the class names, label i -> name i
    mode             "encoded" (image files) or "raw" (pixels), as the images dataset holds them
    max_side, size   out.max_side, out.size (0: not set); quality 1..100; skipped: inputs left out
    source           the repr of the source converted (``datasets/overlap/same_data.py`` follows it to the data's origin)

A file is data from elsewhere, and its attributes are read as such: a ``classes`` attribute that is not a
list of distinct names (``"abc"`` would be three classes a, b, c; ``["cat", "cat"]`` two classes of one
name, merged by name in a mix) or a field of another type is an error naming the file and the attribute.
Foreign files may name their classes too: JSON as above, or an array of strings (h5py writes a Python
list of str so).
"""

from __future__ import annotations

import json

import numpy as np

from feedline.datasets.records import check_class_names

FORMAT = 1  # the layout ``convert.py`` writes (``datasets/hdf5/layout.py`` draws it)
MODES = ("encoded", "raw")


def _whole(least: int, most: int | None = None):
    def test(value) -> bool:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        return ok and least <= value and (most is None or value <= most)

    return test, f"a whole number >= {least}" if most is None else f"a whole number in {least}..{most}"


def _text(value) -> str | None:
    """A string attribute as text (h5py reads variable-length strings as str, fixed-length ones as bytes)."""
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return str(value) if isinstance(value, str) else None


# feedline's own attributes past ``classes``: each one's test and what it must be. Only ``classes`` must be
# there (the writer has always written it); a field that is there is always checked.
FIELDS = {
    "feedline_format": _whole(1, FORMAT),
    "mode": (lambda v: _text(v) in MODES, f"one of {', '.join(MODES)}"),
    "max_side": _whole(0),
    "size": _whole(0),
    "quality": _whole(1, 100),
    "skipped": _whole(0),
    "source": (lambda v: _text(v) is not None, "a description of the source (text)"),
}
AGAIN = "the file was edited or damaged: convert it again"


def read_classes(attrs, where: str) -> list[str] | None:
    """The class names of ``attrs["classes"]`` (JSON text of a list of names, or an array of strings), or
    None where there is none; anything else is a ValueError naming ``where`` (the file) and the attribute."""
    if "classes" not in attrs:
        return None
    raw, shown = attrs["classes"], f"{where}: its 'classes' attribute"
    fix = "write the class names as a JSON list of strings, or give them with source.classes=[...]"
    if isinstance(raw, np.ndarray) and raw.ndim == 1 and raw.dtype.kind in "OSU":
        names = [_text(n) for n in raw.tolist()]
        if any(n is None for n in names):
            raise ValueError(f"{shown} holds an entry that is not UTF-8 text: {fix}")
    else:
        text = _text(raw)
        if text is None:
            kind = (
                f"an array of {raw.dtype} {raw.shape}" if isinstance(raw, np.ndarray) else type(raw).__name__
            )
            raise ValueError(f"{shown} is {kind}, not a JSON list of class names: {fix}")
        try:
            names = json.loads(text)
        except ValueError as err:
            raise ValueError(f"{shown} is not JSON ({err}; it begins {text[:40]!r}): {fix}") from None
        if not isinstance(names, list):
            raise ValueError(f"{shown} is the JSON {type(names).__name__} {text[:40]!r}, not a list: {fix}")
    bad = next((n for n in names if not isinstance(n, str) or not n.strip()), None) if names else None
    if not names or bad is not None:
        what = "names no class" if not names else f"holds {bad!r}, not a class name (text)"
        raise ValueError(f"{shown} {what}: {fix}")
    try:
        return check_class_names(names, shown)
    except ValueError as err:  # a name twice would be two classes of one name (merged by name in a mix)
        raise ValueError(f"{err}: {fix}") from None


def feedline_attrs(attrs, where: str, encoded: bool | None = None, classes: bool = True) -> dict:
    """The attributes feedline wrote on a file (``{}`` for a foreign file, one without ``feedline_format``),
    each checked: of its type and in its range, ``classes`` there (unless ``classes`` is False: they are
    given in config), and ``mode`` what the images hold (``encoded``, where known). Else a ValueError
    naming ``where`` (the file) and the attribute."""
    if "feedline_format" not in attrs:
        return {}
    found = {}
    for name, (test, text) in FIELDS.items():
        if name in attrs:
            value = attrs[name]
            if not test(value):
                if name == "feedline_format" and _whole(FORMAT + 1)[0](value):
                    raise ValueError(
                        f"{where} is of feedline_format {int(value)}, newer than this feedline reads "
                        f"(1..{FORMAT}): upgrade feedline, or convert the file again with this one"
                    )
                shown = value.item() if isinstance(value, np.generic) else value
                raise ValueError(f"{where}: its {name!r} attribute ({shown!r}) is not {text}; {AGAIN}")
            found[name] = _text(value) if name in ("mode", "source") else int(value)
    found["classes"] = read_classes(attrs, where) if classes else None
    if classes and found["classes"] is None:
        raise ValueError(f"{where}: it was written by feedline but has no 'classes' attribute; {AGAIN}")
    if encoded is not None and "mode" in found and (found["mode"] == "encoded") != encoded:
        holds = "encoded image files" if encoded else "raw pixels"
        raise ValueError(f"{where}: its 'mode' attribute is {found['mode']!r}, but it holds {holds}; {AGAIN}")
    return found

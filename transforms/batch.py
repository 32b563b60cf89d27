"""``Batch``: what every collate returns and what the model's step receives.

A batch is a mapping of named fields with attribute access (``batch.image``, ``batch.mask``,
``batch["caption"]``), and it unpacks as the pair Lightning users expect, ``x, y = batch`` (``batch[0]``,
``batch[1]`` too): ``x`` is the input image, ``y`` the source's target field (``label`` for classification).
What some batches carry besides the sample's fields are named too, never tuple positions: ``valid``
(collate=pad: True where a sample has data), ``paths`` (predict batches: the file each image came from) and
``part`` (a mix's val and test batches: the part each sample came from, ``source=mix``).

Lightning moves it to the device through ``to()`` (every tensor field, non-blocking to an accelerator),
infers the batch size from ``x`` without a warning, and torch's pin-memory thread pins it through
``pin_memory()``.
"""

from __future__ import annotations

import warnings

import torch
from torchvision import tv_tensors

_OPTIONAL = ("valid", "paths", "part")  # absent reads as None: ``batch.part is None`` for other sources


class Batch:
    """``Batch(image, label)`` for classification; ``Batch.of(fields, x=..., y=...)`` for named fields.

    ``valid``, ``paths`` and ``part`` are keywords of the first form (the pad collate's mask of real data,
    predict's file names, a mix's parts)."""

    def __init__(self, image=None, label=None, valid=None, paths=None, part=None, *, mask=None):
        if mask is not None and valid is None:  # feedline 0.1 named the pad collate's mask ``mask``
            valid = mask
        data = {"image": image, "label": label}
        for name, value in (("valid", valid), ("paths", paths), ("part", part)):
            if value is not None:
                data[name] = value
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_x", "image")
        object.__setattr__(self, "_y", "label")

    @classmethod
    def of(cls, fields: dict, x: str, y: str) -> Batch:
        """A batch of named ``fields`` (name -> stacked value), ``x`` and ``y`` the names that unpack."""
        batch = cls.__new__(cls)
        object.__setattr__(batch, "_data", dict(fields))
        object.__setattr__(batch, "_x", x)
        object.__setattr__(batch, "_y", y)
        return batch

    # -- the pair ------------------------------------------------------------------------------------
    @property
    def x_name(self) -> str:
        return self._x

    @property
    def y_name(self) -> str:
        return self._y

    def __iter__(self):
        yield self._data[self._x]
        yield self._data[self._y]

    def __len__(self) -> int:
        return 2

    def __getitem__(self, k):
        if isinstance(k, str):
            return self._data[k]
        return (self._data[self._x], self._data[self._y])[k]

    # -- the mapping ---------------------------------------------------------------------------------
    def keys(self):
        return self._data.keys()

    def values(self):
        return self._data.values()

    def items(self):
        return self._data.items()

    def get(self, name: str, default=None):
        return self._data.get(name, default)

    def __contains__(self, name) -> bool:
        return name in self._data

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        data = self.__dict__.get("_data", {})
        if name in data:
            return data[name]
        if name in _OPTIONAL:
            return None
        if name == "mask":  # a classification batch: feedline 0.1's name of the pad collate's ``valid``
            if data.get("valid") is not None:
                from feedline.moved import MovedWarning

                warnings.warn(
                    "batch.mask of a padded batch is now batch.valid (batch.mask is a segmentation mask's "
                    "field); batch.mask stops naming it in feedline 0.3",
                    MovedWarning,
                    stacklevel=2,
                )
                return data["valid"]
            return None
        raise AttributeError(f"this batch has no field {name!r}; it has {', '.join(data)}")

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._data[name] = value

    def __repr__(self) -> str:
        def show(v):
            if isinstance(v, torch.Tensor):
                return f"{v.dtype} {tuple(v.shape)}"
            return f"{type(v).__name__} of {len(v)}" if isinstance(v, (list, tuple)) else type(v).__name__

        inner = ", ".join(f"{k}: {show(v)}" for k, v in self._data.items())
        return f"Batch({inner}; x={self._x!r}, y={self._y!r})"

    def __reduce__(self):
        return _rebuild, (self._data, self._x, self._y)

    # -- copies --------------------------------------------------------------------------------------
    def replace(self, **changes) -> Batch:
        """A new batch with ``changes`` (field=value) applied; the rest shared."""
        return Batch.of({**self._data, **changes}, self._x, self._y)

    def apply(self, fn) -> Batch:
        """A new batch with ``fn`` applied to every tensor (and every tensor in a list or tuple, and in the
        dicts of a list: the detection targets)."""

        def each(v):
            if isinstance(v, tv_tensors.TVTensor):  # boxes keep their format and canvas size
                out = fn(v)
                return out if isinstance(out, type(v)) else tv_tensors.wrap(out, like=v)
            if isinstance(v, torch.Tensor):
                return fn(v)
            if isinstance(v, dict):  # a detection target: its boxes, labels, ... tensors
                return {k: each(t) for k, t in v.items()}
            if isinstance(v, (list, tuple)) and v and all(isinstance(t, (torch.Tensor, dict)) for t in v):
                return type(v)(each(t) for t in v)
            return v

        return Batch.of({k: each(v) for k, v in self._data.items()}, self._x, self._y)

    def pin_memory(self, device=None) -> Batch:
        """A copy in page-locked memory (what ``DataLoader(pin_memory=True)`` calls)."""
        return self.apply(lambda t: t.pin_memory())

    def to(self, device, non_blocking: bool | None = None) -> Batch:
        """Every tensor field on ``device``. ``non_blocking`` defaults to True towards an accelerator, where
        a copy from pinned memory overlaps the work before it (copies back to the CPU always block)."""
        device = torch.device(device)
        if non_blocking is None:
            non_blocking = device.type not in ("cpu", "mps")
        return self.apply(lambda t: t.to(device, non_blocking=non_blocking))


def _rebuild(data: dict, x: str, y: str) -> Batch:
    return Batch.of(data, x, y)

"""Shared-memory batch buffers that a DataLoader worker reuses once the main process has let go of them.

A worker hands each batch to the main process through shared memory, and torch gives every batch a fresh
segment: the kernel zeroes and maps every 4 KiB page of it on first write. For 64 images of 224x224 that is
about 10 ms per batch on a small VM, a sizeable share of what the worker spends on the batch itself. A
``BatchPool`` keeps a few segments per worker and reuses one only once the main process has freed it.

The release signal: the batch crosses as a ``PooledBatch``. Unpickling it in the main process registers a
finalizer on the image's storage; torch keeps one Python object per storage for as long as any tensor, view
or numpy array uses it, so the finalizer runs only when the last of them is gone. It then clears the slot's
byte in a small shared flag array that the worker checks before reusing the slot. A batch that the user
keeps holds its slot; when every slot is held, the worker allocates a fresh segment, as torch would.

Labels share the image's segment (at its end), so a pooled batch crosses as one segment rather than two; the
main process copies them out on arrival, so labels kept for later hold no segment.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch.utils.data import get_worker_info

from feedline.transforms.batch import Batch

_ALIGN = 64


def _storage_identity_holds() -> bool:
    """The release signal needs torch to keep one Python object per storage (torch >= 2.0 does)."""
    t = torch.empty(1)
    return t.untyped_storage() is t.untyped_storage()


def _view(storage: torch.UntypedStorage, offset: int, shape: tuple[int, ...], dtype: torch.dtype):
    """A contiguous ``shape`` tensor over ``storage`` from byte ``offset``."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype).set_(storage, offset // itemsize, torch.Size(shape))


def _shared(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_shared(max(nbytes, 1))


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor, in a fresh shared-memory segment inside a worker, so it crosses to the main
    process without torch copying it there."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    return _view(_shared(_nbytes(shape, dtype)), 0, shape, dtype)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    numel = 1
    for n in shape:
        numel *= n
    return numel * torch.empty(0, dtype=dtype).element_size()


class PooledBatch(Batch):
    """A ``Batch`` made in a worker whose segment returns to that worker's pool once the main process
    frees it. It behaves as a ``Batch``; unpickled in the main process it becomes a plain ``Batch``."""

    def __reduce__(self):
        if "_flags" not in self.__dict__:  # made by replace(): its slot stays taken, the data is safe
            return super().__reduce__()
        return _received, (self._data, self._x, self._y, self._flags, self._slot, self._in_segment)


def _received(data: dict, x: str, y: str, flags: torch.Tensor, slot: int, in_segment: str | None) -> Batch:
    batch = Batch.of(data, x, y)
    # The labels rode in the image's segment; a copy of their few bytes lets a caller keep labels
    # (metrics often do) without keeping the whole segment, and its slot, alive.
    if in_segment is not None:
        setattr(batch, in_segment, batch[in_segment].clone())
    weakref.finalize(batch[x].untyped_storage(), _release, flags, slot)
    return batch


def _release(flags: torch.Tensor, slot: int) -> None:
    # Through numpy: flags unpickled under torch.inference_mode (Lightning's predict and validation loops
    # fetch batches inside it) are inference tensors, which refuse in-place writes outside it.
    flags.numpy()[slot] = 0


class BatchPool:
    """Up to ``slots`` reusable segments per worker. Outside a worker it allocates ordinary memory.

    It never travels: a worker starts with an empty pool whether it was forked or spawned.
    """

    def __init__(self, slots: int = 8):
        self.slots = int(slots)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._buffers: list[torch.UntypedStorage] = []
        self._flags: torch.Tensor | None = None

    def __getstate__(self):
        return {"slots": self.slots}

    def __setstate__(self, state):
        self.slots = state["slots"]
        self._reset()

    @property
    def active(self) -> bool:
        return self.slots > 0 and get_worker_info() is not None and _IDENTITY

    def batch(self, image_shape: tuple[int, ...], dtype: torch.dtype, labels: int):
        """(image tensor, int64 label tensor, finish) where ``finish(Batch) -> Batch`` ties the batch to
        its slot. The image is contiguous in ``image_shape``."""
        image_bytes = -(-_nbytes(image_shape, dtype) // _ALIGN) * _ALIGN
        storage, slot = self._take(image_bytes + 8 * labels) if self.active else (None, None)
        if storage is not None:
            image = _view(storage, 0, image_shape, dtype)
            label = _view(storage, image_bytes, (labels,), torch.int64)
        else:
            image, label = empty(image_shape, dtype), torch.empty(labels, dtype=torch.int64)

        def finish(batch: Batch) -> Batch:
            if slot is None:
                return batch
            pooled = PooledBatch.of(dict(batch.items()), batch.x_name, batch.y_name)
            pooled._flags, pooled._slot = self._flags, slot
            pooled._in_segment = batch.y_name if labels else None
            return pooled

        return image, label, finish

    def _take(self, nbytes: int) -> tuple[torch.UntypedStorage | None, int | None]:
        if self._pid != os.getpid():  # buffers inherited from another process are not this worker's
            self._reset()
        if self._flags is None:
            self._flags = torch.zeros(self.slots, dtype=torch.uint8).share_memory_()
        flags = self._flags.numpy()
        for k, buffer in enumerate(self._buffers):
            if flags[k] == 0:
                if buffer.nbytes() < nbytes or buffer.nbytes() > 2 * nbytes:
                    buffer = self._buffers[k] = _shared(nbytes)
                flags[k] = 1
                return buffer, k
        if len(self._buffers) < self.slots:
            self._buffers.append(_shared(nbytes))
            flags[len(self._buffers) - 1] = 1
            return self._buffers[-1], len(self._buffers) - 1
        return None, None  # every slot is held: a fresh segment, as torch would


_IDENTITY = _storage_identity_holds()

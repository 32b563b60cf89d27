"""A train stack's last pixel work, deferred to the collate: the crop is resized straight into the batch.

A stack that ends ``RandomResizedCrop`` (optionally followed by ``RandomHorizontalFlip``) normally makes a
224x224 image per sample, flips it into another, and the collate copies that into the batch: three passes over
the output and a Python call chain per transform. When the collate writes batches itself (``Uint8Collate``),
``defer_crop`` replaces such a stack with ``DeferredCrop``: per sample it makes the same random draws, in the
same order, as the stack would (so a sample's seed gives the same crop and flip as before, in any worker and
after a resume) and returns a ``PendingCrop``, the decoded image with its window. The collate then resizes
each window directly into its slot of the shared-memory batch, flipping the window as it packs it for the
resize kernel (a horizontal flip commutes with the antialiased bilinear resize; any other interpolation is
resized first and flipped after, as the stack does). The pixels equal the stack's, bit for bit
(``tests/test_deferred.py``); only the copies and calls are gone (``benchmarks/peers.py``).

A sample of named fields (a dict holding one ``tv_tensors.Image`` and any number of ``tv_tensors.Mask`` of its
size) takes the same road: one draw of the window and the flip, a ``PendingCrop`` for the image and a
``PendingMask`` for each mask, which the collate resizes (nearest-neighbour, as torchvision resizes masks) and
flips into its slot. The draws and the pixels are the v2 stack's (``tests/test_deferred.py``), without its
walk over the sample's fields.

Every other stack, input or collate keeps the ordinary path: ``defer_crop`` returns the stack unchanged.
"""

from __future__ import annotations

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2.functional._geometry import _do_native_uint8_resize_on_cpu

from feedline.moved import old_names
from feedline.transforms.crop import channels_last
from feedline.transforms.flip import RandomHorizontalFlip
from feedline.transforms.window import CROPS, CropFirst, Windowed

_AA = torch.ops.aten._upsample_bilinear2d_aa.out
_BILINEAR = v2.InterpolationMode.BILINEAR
# torchvision's flip and feedline's fast subclass of it (the same draw and pixels); subclasses of either, and of
# the crops (window.CROPS), with draws or pixel work of their own, keep the ordinary path.
_FLIPS = (v2.RandomHorizontalFlip, RandomHorizontalFlip)
_PENDS = (tv_tensors.Image, tv_tensors.Mask)  # what a sample of fields may hold for its crop to pend


class PendingCrop:
    """A decoded uint8 (C, H, W) image, the window to crop from it and whether to flip it, resized to ``size``
    only when the collate writes it into its batch (``write_into``). It has the ``shape`` and ``dtype`` of the
    image it stands for, and lays it out channels-last, as the uint8 crops do."""

    __slots__ = ("image", "box", "flip", "crop")
    channels_last = True

    def __init__(self, image: torch.Tensor, box: tuple[int, int, int, int], flip: bool, crop):
        self.image, self.box, self.flip, self.crop = image, box, flip, crop

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.image.shape[0], *self.crop.size))

    @property
    def dtype(self) -> torch.dtype:
        return self.image.dtype

    def window(self, flipped: bool = True) -> torch.Tensor:
        """The crop window, flipped when drawn so (and ``flipped``), packed channels-last (one copy of at most
        the image)."""
        top, left, height, width = self.box
        window = self.image[:, top : top + height, left : left + width]
        return channels_last(window.flip(-1) if self.flip and flipped else window)

    def write_into(self, out: torch.Tensor) -> None:
        """Resize the window into ``out``, a (C, *size) uint8 view of the batch. The antialiased bilinear kernel
        is mirror-symmetric, so the window is flipped as it is packed; any other interpolation (nearest picks
        ``floor(i * scale)``, which is not) is resized first and flipped after, as the stack does."""
        crop = self.crop
        if _fused_kernel(crop) and tuple(self.box[2:]) != tuple(crop.size):
            _AA(self.window()[None], list(crop.size), False, None, None, out=out[None])
            return
        resized = F.resize(  # torchvision's own resize; a window of the output size comes back as it is
            self.window(flipped=False),
            list(crop.size),
            interpolation=crop.interpolation,
            antialias=crop.antialias,
        )
        out.copy_(resized.flip(-1) if self.flip else resized)

    def materialize(self) -> torch.Tensor:
        """The image the stack would have returned, as a tensor (for code that wants one)."""
        out = torch.empty((*self.crop.size, self.image.shape[0]), dtype=self.dtype).permute(2, 0, 1)
        self.write_into(out)
        return out


class PendingMask:
    """A mask (1, H, W), the window to crop from it and whether to flip it, resized nearest-neighbour to
    ``size`` when the collate writes it into its batch (``write_into``), exactly as the v2 stack would: crop,
    resize, then flip (a nearest resize does not commute with a flip)."""

    __slots__ = ("mask", "box", "flip", "crop")
    channels_last = False

    def __init__(self, mask: torch.Tensor, box: tuple[int, int, int, int], flip: bool, crop):
        self.mask, self.box, self.flip, self.crop = mask, box, flip, crop

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.mask.shape[0], *self.crop.size))

    @property
    def dtype(self) -> torch.dtype:
        return self.mask.dtype

    def materialize(self) -> torch.Tensor:
        top, left, height, width = self.box
        window = self.mask[:, top : top + height, left : left + width]
        resized = F.resize_mask(window, list(self.crop.size))
        return resized.flip(-1) if self.flip else resized

    def write_into(self, out: torch.Tensor) -> None:
        """Resize into ``out``, a (1, *size) or (*size) view of the batch."""
        out.copy_(self.materialize().reshape(out.shape))


def pending(value) -> bool:
    return isinstance(value, (PendingCrop, PendingMask))


def _fused_kernel(crop: v2.RandomResizedCrop) -> bool:
    """torchvision resizes this crop with torch's uint8 antialiased bilinear kernel, which can write in place."""
    try:
        mode = v2.InterpolationMode(
            crop.interpolation
        )  # torchvision keeps the mode as given: enum or its name
    except ValueError:
        return False
    return mode == _BILINEAR and bool(crop.antialias) and _do_native_uint8_resize_on_cpu(_BILINEAR)


class DeferredCrop(CropFirst):
    """The stack ``[RandomResizedCrop]`` or ``[RandomResizedCrop, RandomHorizontalFlip]``, for the collate to
    finish: one plain uint8 image in, a ``PendingCrop`` out; a ``Windowed`` image (its crop drawn before the
    decode, ``window.py``) pends with that box. Any other input goes through the stack as usual; everything
    that inspects a ``Compose`` (reduced-size decoding reads its first transform) sees the same."""

    def __init__(self, transforms):
        transforms = list(transforms)
        super().__init__(transforms, transforms[1].p if len(transforms) > 1 else None)

    def __call__(self, *inputs):  # called per sample: no module hooks to run, so skip nn.Module's dispatch
        image = inputs[0] if len(inputs) == 1 else None
        if type(image) is dict:
            return self._fields(image)
        if type(image) is Windowed:
            return self.finish(image)
        if type(image) is not torch.Tensor or image.dim() != 3 or image.dtype != torch.uint8:
            return self.forward(*inputs)
        box = self.draws.box(image.shape[1], image.shape[2])  # the crop's draws, then the flip's
        return PendingCrop(image, box, self.draws.flip(), self.crop)

    def finish(self, windowed: Windowed) -> PendingCrop:
        """The window's box was drawn before the decode: the flip's draw, and the crop pends."""
        return PendingCrop(windowed.image, windowed.box, self.draws.flip(), self.crop)

    def _fields(self, sample: dict):
        """A sample of named fields: one uint8 image and masks of its size pend; anything else (another
        image, a detection target's boxes, a mask of another size) takes the stack, so boxes always move
        through torchvision's own transforms."""
        images = [k for k, v in sample.items() if isinstance(v, tv_tensors.Image)]
        masks = [k for k, v in sample.items() if isinstance(v, tv_tensors.Mask)]
        others = [
            v for v in sample.values() if isinstance(v, tv_tensors.TVTensor) and not isinstance(v, _PENDS)
        ]
        nested = any(  # a detection target: its boxes move through the stack
            isinstance(v, dict) and isinstance(v.get("boxes"), tv_tensors.BoundingBoxes)
            for v in sample.values()
        )
        if len(images) != 1 or others or nested:
            return self.forward(sample)
        image = sample[images[0]].as_subclass(torch.Tensor)
        size = tuple(image.shape[-2:])
        if image.dim() != 3 or image.dtype != torch.uint8 or any(sample[k].shape[-2:] != size for k in masks):
            return self.forward(sample)
        box = self.draws.box(*size)
        flip = self.draws.flip()
        out = dict(sample)
        out[images[0]] = PendingCrop(image, box, flip, self.crop)
        for k in masks:
            out[k] = PendingMask(sample[k].as_subclass(torch.Tensor), box, flip, self.crop)
        return out


def defer_crop(stack):
    """``DeferredCrop(stack)`` when the stack is a crop (and flip) whose pixel work can move into the collate,
    else ``stack`` unchanged."""
    if type(stack) is not v2.Compose or not 1 <= len(stack.transforms) <= 2:
        return stack
    crop, *rest = stack.transforms
    if type(crop) not in CROPS or (rest and type(rest[0]) not in _FLIPS):
        return stack
    return DeferredCrop(stack.transforms)


__getattr__ = old_names(__name__)  # names that moved to another module keep working for one release

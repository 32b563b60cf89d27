"""What a pipeline already does, so that ``bench.py`` never advises it (``verdict.Advice.moot_if``).

Each name is read from the built loaders, not from the config's spelling, so a user's own stack that does the
same counts too.
"""

from __future__ import annotations

from torchvision.transforms import v2

from feedline.datasets.fields import GEOMETRIC
from feedline.storage.stores import is_url
from feedline.transforms.jpeg_window import available
from feedline.transforms.reduce import minimum_size
from feedline.transforms.window import CropFirst
from feedline.transforms.window import crop_first as crop_first_of

REDUCED_DECODE = "reduced decode"  # data.reduced_decode with a Resize or RandomResizedCrop first
WINDOW_DECODE = "window decode"  # data.window_decode, the C extension built, RandomResizedCrop first
WINDOW_DECODER = "window decoder"  # the C extension is built (transforms/_jpeg_window.c)
UINT8_BATCHES = "uint8 batches"  # the collate ships uint8 batches in reused shared memory
FLOAT_ON_DEVICE = "float on device"  # no float conversion or normalisation in the per-sample stack
ONE_FILE = "one file"  # the source already reads one file (hdf5), not a tree of files
OBJECT_STORE = "object storage"  # shards from a URL, through the chunk cache: a local HDF5 is no cure
SHARDS = "shards"  # the source reads shards (local or a URL): a conversion keeps that format
EVERY_CPU = "every cpu"  # the loader already has a worker per CPU


def in_force(datamodule, workers: int, cpus: int) -> set[str]:
    """The names above that hold for ``datamodule``'s train loader with ``workers`` workers."""
    train = datamodule.transforms.train
    found = set()
    fields = getattr(datamodule, "fields", None)
    alone = fields is None or len(fields.of_kind(*GEOMETRIC)) == 1  # beside a mask or boxes: full-size decode
    if datamodule.reduced_decode and alone and train is not None and minimum_size(train) is not None:
        found.add(REDUCED_DECODE)
    if available():
        found.add(WINDOW_DECODER)
    if _decodes_windows(datamodule, train, fields):
        found.add(WINDOW_DECODE)
    if getattr(datamodule.collate, "reuse_buffers", False):
        found.add(UINT8_BATCHES)
    if not any(isinstance(t, (v2.ToDtype, v2.Normalize)) for t in _steps(train)):
        found.add(FLOAT_ON_DEVICE)
    sources = _sources(datamodule.source)
    if all(type(source).__name__ == "HDF5Source" for source in sources):
        found.add(ONE_FILE)
    for source in sources:  # a mix: what one part does holds for the run's reads of it
        if type(source).__name__ == "ShardsSource":
            found.add(SHARDS)
            if is_url(getattr(source, "path", "")):
                found.add(OBJECT_STORE)
    if workers >= cpus:
        found.add(EVERY_CPU)
    return found


def _decodes_windows(datamodule, train, fields) -> bool:
    """JPEGs decode only the train crop's window (``transforms/jpeg_window.py``); where the accelerator is not
    built there is advice to build it."""
    classification = fields is None or fields.is_classification
    crop_first = isinstance(crop_first_of(train), CropFirst)
    return bool(getattr(datamodule, "window_decode", False)) and available() and classification and crop_first


def _sources(source) -> list:
    """The sources the loaders read: a mix's parts (``source=mix``), else the source itself."""
    parts = getattr(source, "parts", None)
    return [p.source for p in parts] if isinstance(parts, list) and parts else [source]


def _steps(stack) -> list:
    if stack is None:
        return []
    inner = getattr(stack, "transforms", None)
    return [step for t in inner for step in _steps(t)] if isinstance(inner, (list, tuple)) else [stack]

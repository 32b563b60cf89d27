"""Each public class's one import path, and the old paths that keep working for one release.

A user's YAML and code name feedline's classes (``_target_: feedline.datasets.FolderSource``). Those names are
the packages' own, served here from wherever the class is defined, so a module can move inside its package
without breaking a config:

    feedline.datasets      the sources and their contract       feedline.datasets.FolderSource
    feedline.datamodules   the LightningDataModule and loaders   feedline.datamodules.ImageDataModule
    feedline.transforms    transform stacks, collates, mixing    feedline.transforms.TransformStacks
    feedline.models        the networks the default runs train   feedline.models.ImageClassifier
    feedline.callbacks     Lightning callbacks and the logger    feedline.callbacks.ModelCheckpoint

A module path that moved still imports for one release (``moved.py``). Standard library only, and nothing is
imported until a name is used: importing ``feedline.datasets`` stays cheap and imports no source family. Type
checkers and editors read each package's ``if TYPE_CHECKING:`` imports of the same names.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from feedline.moved import MOVED, REPLACED, SPLIT, find_old_name, warn_moved

# package -> {public name: the module that defines it}
PUBLIC = {
    "feedline.datasets": {
        "Source": "feedline.datasets.records",
        "RecordSet": "feedline.datasets.records",
        "BadInput": "feedline.datasets.records",
        "Field": "feedline.datasets.fields",
        "Fields": "feedline.datasets.fields",
        "FolderSource": "feedline.datasets.folder.source",
        "LazyFolderSource": "feedline.datasets.folder.lazy",
        "DigitsSource": "feedline.datasets.folder.digits",
        "HDF5Source": "feedline.datasets.hdf5.source",
        "SegFolderSource": "feedline.datasets.folder.seg",
        "ShardsSource": "feedline.datasets.shards.source",
        "WdsSource": "feedline.datasets.wds.source",
        "MixSource": "feedline.datasets.mix.source",
        "ManifestSource": "feedline.datasets.manifest.source",
        "ShapesSource": "feedline.datasets.shapes.source",
        "CocoSource": "feedline.datasets.coco.source",
        "ShapesCocoSource": "feedline.datasets.shapes.coco",
    },
    "feedline.datamodules": {
        "ImageDataModule": "feedline.datamodules.image",
        "ImageLoaders": "feedline.datamodules.loaders",
        "DataConfig": "feedline.datamodules.options",
    },
    "feedline.transforms": {
        "TransformStacks": "feedline.transforms.stacks",
        "DefaultCollate": "feedline.transforms.collate",
        "Uint8Collate": "feedline.transforms.collate",
        "PadCollate": "feedline.transforms.collate",
        "DetectionCollate": "feedline.transforms.detection_collate",
        "SanitizeBoxes": "feedline.transforms.boxes",
        "MixupCutmix": "feedline.transforms.mix",
        "RandomResizedCrop": "feedline.transforms.crop",
        "RandomHorizontalFlip": "feedline.transforms.flip",
        "Batch": "feedline.transforms.batch",
    },
    "feedline.models": {
        "ImageClassifier": "feedline.models.classifier",
        "SmallCNN": "feedline.models.nets",
        "SmallUNet": "feedline.models.nets",
        "Segmenter": "feedline.models.segmenter",
        "MultiLabelClassifier": "feedline.models.multilabel",
        "ImageRegressor": "feedline.models.regressor",
        "Detector": "feedline.models.detector",
    },
    "feedline.callbacks": {
        "ModelCheckpoint": "feedline.callbacks.checkpoint",
        "CSVLogger": "feedline.callbacks.csv_logger",
        "ModelSummary": "feedline.callbacks.model_summary",
        "ThroughputMonitor": "feedline.callbacks.throughput",
        "SweepSummary": "feedline.callbacks.sweep_summary",
    },
}


def public_path(cls) -> str:
    """The path a config should name ``cls`` by: its public one where it has one, else where it is defined."""
    for package, names in PUBLIC.items():
        if names.get(cls.__name__) == cls.__module__:
            return f"{package}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def current_targets(config):
    """``config`` (plain containers) with every ``_target_`` that names an old path (``moved.py``) named by its
    path now: a datamodule rebuilt from an old checkpoint records, and so saves again, paths that will last."""
    if isinstance(config, list):
        return [current_targets(v) for v in config]
    if not isinstance(config, dict):
        return config
    out = {k: current_targets(v) for k, v in config.items()}
    target = out.get("_target_")
    if isinstance(target, str) and target.rpartition(".")[0] in {*MOVED, *REPLACED, *SPLIT}:
        import warnings

        from hydra._internal.utils import _locate

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # building the part has said it already
            found = _locate(target)
        if isinstance(found, type):
            out["_target_"] = public_path(found)
        elif callable(found) and getattr(found, "__module__", None):
            out["_target_"] = f"{found.__module__}.{found.__qualname__}"
    return out


def exports(package: str):
    """``__getattr__`` and ``__dir__`` for ``package``'s ``__init__``: its public names, imported on first use,
    and (where the package replaced a module of its name) that module's names, with a MovedWarning."""
    names = PUBLIC.get(package, {})

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        found = None if name.startswith("__") or _submodule(package, name) else find_old_name(package, name)
        if found is not None:
            obj, where = found
            warn_moved(f"{package}.{name}", public_path(obj) if isinstance(obj, type) else where)
            return obj
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__


def _submodule(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module of the package (``from package import name`` imports it)."""
    return any(m.name == name for m in pkgutil.iter_modules(sys.modules[package].__path__))

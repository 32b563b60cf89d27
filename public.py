"""Each public class's one import path, and the old paths that keep working for one release.

A user's YAML and code name feedline's classes (``_target_: feedline.datasets.FolderSource``). Those names are
the packages' own, served here from wherever the class is defined, so a module can move inside its package
without breaking a config:

    feedline.datasets      the sources and their contract       feedline.datasets.FolderSource
    feedline.datamodules   the LightningDataModule and loaders   feedline.datamodules.ImageDataModule
    feedline.transforms    transform stacks, collates, mixing    feedline.transforms.TransformStacks
    feedline.models        the networks the default runs train   feedline.models.ImageClassifier
    feedline.callbacks     Lightning callbacks and the logger    feedline.callbacks.ModelCheckpoint

A module path that moved (``feedline.datasets.hdf5_layout``, ``feedline.datasets.folder.FolderSource``)
still imports, with a ``MovedWarning`` (a ``DeprecationWarning``, shown by default) that names the new path.
Standard library only, and nothing is imported until a name is used: importing ``feedline.datasets`` stays
cheap and imports no source family.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import pkgutil
import re
import sys
import warnings

# package -> {public name: the module that defines it}
PUBLIC = {
    "feedline.datasets": {
        "Source": "feedline.datasets.records",
        "RecordSet": "feedline.datasets.records",
        "FolderSource": "feedline.datasets.folder.source",
        "LazyFolderSource": "feedline.datasets.folder.lazy",
        "DigitsSource": "feedline.datasets.folder.digits",
        "HDF5Source": "feedline.datasets.hdf5.source",
        "ShardsSource": "feedline.datasets.shards.source",
        "WdsSource": "feedline.datasets.wds.source",
        "MixSource": "feedline.datasets.mix.source",
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
        "MixupCutmix": "feedline.transforms.mix",
        "RandomResizedCrop": "feedline.transforms.crop",
        "RandomHorizontalFlip": "feedline.transforms.flip",
        "Batch": "feedline.transforms.batch",
    },
    "feedline.models": {
        "ImageClassifier": "feedline.models.classifier",
        "SmallCNN": "feedline.models.nets",
    },
    "feedline.callbacks": {
        "ModelCheckpoint": "feedline.callbacks.checkpoint",
        "CSVLogger": "feedline.callbacks.csv_logger",
        "ModelSummary": "feedline.callbacks.model_summary",
        "ThroughputMonitor": "feedline.callbacks.throughput",
        "SweepSummary": "feedline.callbacks.sweep_summary",
    },
}

# Modules that moved (release 0.2): old path -> new path. Each old path imports as the new module, with a warning.
MOVED = {
    "feedline.datasets.index": "feedline.datasets.folder.index",
    "feedline.datasets.packed": "feedline.datasets.folder.packed",
    "feedline.datasets.scan": "feedline.datasets.folder.scan",
    "feedline.datasets.scan_plan": "feedline.datasets.folder.scan_plan",
    "feedline.datasets.listing": "feedline.datasets.folder.listing",
    "feedline.datasets.lazy_folder": "feedline.datasets.folder.lazy",
    "feedline.datasets.lazy_checks": "feedline.datasets.folder.lazy_checks",
    "feedline.datasets.digits": "feedline.datasets.folder.digits",
    "feedline.datasets.unlabeled": "feedline.datasets.folder.unlabeled",
    "feedline.datasets.hdf5_layout": "feedline.datasets.hdf5.layout",
    "feedline.datasets.hdf5_files": "feedline.datasets.hdf5.files",
    "feedline.datasets.hdf5_attrs": "feedline.datasets.hdf5.attrs",
    "feedline.datasets.chunks": "feedline.datasets.shards.chunks",
    "feedline.datasets.chunk_order": "feedline.datasets.shards.order",
    "feedline.datasets.shard_meta": "feedline.datasets.shards.meta",
    "feedline.datasets.shard_parts": "feedline.datasets.shards.parts",
    "feedline.datasets.cached_chunks": "feedline.datasets.shards.cached",
    "feedline.datasets.wds_index": "feedline.datasets.wds.index",
    "feedline.datasets.wds_tars": "feedline.datasets.wds.tars",
    "feedline.datasets.mix_order": "feedline.datasets.mix.order",
    "feedline.datasets.mix_checks": "feedline.datasets.mix.checks",
    "feedline.datasets.same_data": "feedline.datasets.overlap.same_data",
    "feedline.datasets.stores": "feedline.storage.stores",
    "feedline.datasets.store_secrets": "feedline.storage.secrets",
    "feedline.datasets.chunk_cache": "feedline.storage.chunk_cache",
    "feedline.datasets.cache_room": "feedline.storage.cache_room",
    "feedline.datasets.cache_trust": "feedline.storage.cache_trust",
    "feedline.datasets.sizes": "feedline.storage.sizes",
    "feedline.datamodules.order": "feedline.datamodules.epoch.order",
    "feedline.datamodules.resume": "feedline.datamodules.epoch.resume",
    "feedline.datamodules.resume_checks": "feedline.datamodules.epoch.checks",
    "feedline.datamodules.train_loader": "feedline.datamodules.epoch.train_loader",
    "feedline.datamodules.parts": "feedline.datamodules.checkpoint.parts",
    "feedline.datamodules.trusted_config": "feedline.datamodules.checkpoint.trusted",
}
# Modules that became a package of the same name: the old module's names are now defined here.
REPLACED = {
    "feedline.datasets.folder": "feedline.datasets.folder.source",
    "feedline.datasets.hdf5": "feedline.datasets.hdf5.source",
    "feedline.datasets.shards": "feedline.datasets.shards.source",
    "feedline.datasets.wds": "feedline.datasets.wds.source",
    "feedline.datasets.mix": "feedline.datasets.mix.source",
}


class MovedWarning(DeprecationWarning):
    """An old import path was used; it works for one more release. The message names the new path."""


def _shown_unless_filtered() -> None:
    """Show each MovedWarning once per place, where the user has set nothing for it: Python hides every
    DeprecationWarning not raised in ``__main__``, and a moved ``_target_`` is imported by Hydra, not by the
    user's code. A filter of the user's (``-W``, ``PYTHONWARNINGS``, pytest's ``filterwarnings``) that already
    decides for it is left to decide: ``-W error::DeprecationWarning`` still raises it, ``-W ignore`` hides it."""
    for option in sys.warnoptions:  # -W and PYTHONWARNINGS: action:message:category:module:lineno
        fields = option.split(":")
        category = fields[2].strip().rpartition(".")[2] if len(fields) > 2 else ""
        module = fields[3].strip() if len(fields) > 3 else ""  # a filter for one package decides for it alone
        if category in ("", "Warning", "DeprecationWarning", "MovedWarning") and module in ("", "feedline"):
            return
    for action, message, category, module, _ in warnings.filters:
        if not issubclass(MovedWarning, category) or not _matches(module, "feedline.public"):
            continue
        if (action, message, category, module) == ("ignore", None, DeprecationWarning, None):
            warnings.filterwarnings("default", category=MovedWarning)  # Python's own default: nothing set
        return


def _matches(pattern, text: str) -> bool:
    """A filter's module field: None (any), a compiled pattern, or (Python's own entries) a plain string."""
    return pattern is None or bool(
        re.match(pattern, text) if isinstance(pattern, str) else pattern.match(text)
    )


_shown_unless_filtered()


def public_path(cls) -> str:
    """The path a config should name ``cls`` by: its public one where it has one, else where it is defined."""
    for package, names in PUBLIC.items():
        if names.get(cls.__name__) == cls.__module__:
            return f"{package}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def exports(package: str):
    """``__getattr__`` and ``__dir__`` for ``package``'s ``__init__``: its public names, imported on first use,
    and the names its old module of the same name defined (``REPLACED``), with a warning."""
    names = PUBLIC.get(package, {})

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        if package in REPLACED and not name.startswith("__") and not _submodule(package, name):
            module = importlib.import_module(REPLACED[package])
            if hasattr(module, name):
                owner = PUBLIC["feedline.datasets"].get(name) == REPLACED[package]
                new = f"feedline.datasets.{name}" if owner else f"{REPLACED[package]}.{name}"
                warnings.warn(f"{package}.{name} moved: import {new}", MovedWarning, stacklevel=2)
                return getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(names)

    return __getattr__, __dir__


def _submodule(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module of the package (``from package import name`` imports it)."""
    return any(m.name == name for m in pkgutil.iter_modules(sys.modules[package].__path__))


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path (``MOVED``) as the module now at its new path, with a warning."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}: import that instead", MovedWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())

"""Old import paths, kept working for one release: feedline 0.2 moved its modules into a room per source family
(``datasets/<family>/``, ``storage/``, ``datamodules/epoch/``, ``datamodules/checkpoint/``); feedline 0.3
removes these paths.

    a moved module       ``import feedline.datasets.stores`` imports an alias of ``feedline.storage.stores``
    (MOVED)              that reads every name from it (and from ``SPLIT``, below)
    a module that is     ``from feedline.datasets.folder import FolderSource``: the package's ``__getattr__``
    now a package        (``public.exports``) serves the old module's names from the modules in ``SPLIT``
    a name that left     ``feedline.datasets.records.LazyArray`` (now ``datasets/arrays.py``): the old module's
    its module           ``__getattr__`` (``old_names``) serves it from the modules in ``SPLIT``

Each use warns once per place with a ``MovedWarning`` (a ``DeprecationWarning``) that names the new path, so an
object pickled by feedline 0.1, a checkpoint's recorded config and a user's import all keep working. The
warning is shown by default, unless the user's own filter decides (``-W error::DeprecationWarning`` raises it).
Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import multiprocessing
import re
import sys
import types
import warnings

REMOVED_IN = "feedline 0.3"

# Modules that moved: old path -> new path.
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
# Modules that became a package of the same name: where the old module's names are now.
REPLACED = {
    "feedline.datasets.folder": "feedline.datasets.folder.source",
    "feedline.datasets.hdf5": "feedline.datasets.hdf5.source",
    "feedline.datasets.shards": "feedline.datasets.shards.source",
    "feedline.datasets.wds": "feedline.datasets.wds.source",
    "feedline.datasets.mix": "feedline.datasets.mix.source",
}
# Old module -> the modules its names went to, looked in after its new module, in order.
SPLIT = {
    "feedline.datasets.records": ("feedline.datasets.arrays", "feedline.datasets.paths"),
    "feedline.datasets.listing": ("feedline.datasets.paths",),
    "feedline.datasets.shard_meta": ("feedline.datasets.shards.labels",),
    "feedline.datasets.same_data": ("feedline.datasets.overlap.places",),
    "feedline.datasets.stores": ("feedline.storage.s3_client",),
    "feedline.datasets.chunk_cache": ("feedline.storage.chunk_write", "feedline.storage.cache_stats"),
    "feedline.datasets.hdf5": ("feedline.datasets.hdf5.records",),
    "feedline.datasets.mix": ("feedline.datasets.mix.parts", "feedline.datasets.mix.records"),
    "feedline.datamodules.resume": ("feedline.datamodules.epoch.sampler",),
    "feedline.datamodules.loaders": ("feedline.datamodules.split_dataset",),
    "feedline.writers.shards": tuple(
        f"feedline.writers.shards.{m}" for m in ("write", "output", "scratch", "runner", "sidecar")
    ),
    "feedline.cli.secrets": ("feedline.cli.secret_overrides",),
    "feedline.diagnostics.loader_bench": ("feedline.diagnostics.stages",),
    "feedline.transforms.deferred": ("feedline.transforms.crop",),
}


class MovedWarning(DeprecationWarning):
    """An old import path was used; it works until ``REMOVED_IN``. The message names the new path."""


def warn_moved(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}: import that ({old} goes in {REMOVED_IN})", MovedWarning, stacklevel=3
    )


def find_old_name(old_module: str, name: str):
    """``(object, where it is now)`` for a name ``old_module`` had in feedline 0.1, or None."""
    for where in (REPLACED.get(old_module), *SPLIT.get(old_module, ())):
        if where is None:
            continue
        module = importlib.import_module(where)
        if name in vars(module):
            found = vars(module)[name]
            defined = getattr(found, "__module__", None)
            if isinstance(found, type | types.FunctionType) and defined and defined.startswith("feedline."):
                return found, f"{defined}.{found.__qualname__}"
            return found, f"{where}.{name}"
    return None


def old_names(module: str):
    """``__getattr__`` for a module that still exists, serving the names that left it (``SPLIT``)."""

    def __getattr__(name: str):
        found = find_old_name(module, name) if not name.startswith("__") else None
        if found is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_moved(f"{module}.{name}", found[1])
        return found[0]

    return __getattr__


class _Alias(types.ModuleType):
    """An old module path: every name read from the module at its new path, or from where it went (SPLIT)."""

    def __getattr__(self, name: str):
        new = importlib.import_module(MOVED[self.__name__])
        if hasattr(new, name) or name.startswith("__"):
            return getattr(new, name)
        return old_names(self.__name__)(name)

    def __dir__(self):
        return dir(importlib.import_module(MOVED[self.__name__]))


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path (``MOVED``) as an alias of the module at its new path, with a warning."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}: import that instead ({spec.name} goes in {REMOVED_IN})",
            MovedWarning,
            stacklevel=2,
        )
        importlib.import_module(new)
        return _Alias(spec.name, f"feedline 0.1's {spec.name}: now {new}")

    def exec_module(self, module):
        pass  # nothing of its own: every name is read from the new module


def _shown_unless_filtered() -> None:
    """Show each MovedWarning once per place, where the user has set nothing for it: Python hides every
    DeprecationWarning not raised in ``__main__``, and a moved ``_target_`` is imported by Hydra, not by the
    user's code. A filter of the user's (``-W``, ``PYTHONWARNINGS``, pytest's ``filterwarnings``) that already
    decides for it is left to decide: ``-W error::DeprecationWarning`` still raises it, ``-W ignore`` hides it.
    A DataLoader worker says nothing: the main process has said it."""
    if multiprocessing.parent_process() is not None:
        return
    for option in sys.warnoptions:  # -W and PYTHONWARNINGS: action:message:category:module:lineno
        fields = option.split(":")
        category = fields[2].strip().rpartition(".")[2] if len(fields) > 2 else ""
        module = fields[3].strip() if len(fields) > 3 else ""  # a filter for one package decides for it alone
        if category in ("", "Warning", "DeprecationWarning", "MovedWarning") and module in ("", "feedline"):
            return
    for action, message, category, module, _ in warnings.filters:
        # a filter for one module (the warning is raised from the caller's) or for other messages (torch and
        # Lightning add such) decides nothing for feedline's
        if not issubclass(MovedWarning, category) or module is not None or not _matches(message, "feedline."):
            continue
        if (action, message, category, module) == ("ignore", None, DeprecationWarning, None):
            warnings.filterwarnings("default", category=MovedWarning)  # Python's own default: nothing set
        return


def _matches(pattern, text: str) -> bool:
    """A filter's message field: None (any), a compiled pattern, or (Python's own entries) a plain string."""
    return pattern is None or bool(
        re.match(pattern, text) if isinstance(pattern, str) else pattern.match(text)
    )


_shown_unless_filtered()
if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())

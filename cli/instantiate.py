"""One way to build objects from config: log the ``_target_``, name the config key when it fails, and leave the
run's config as it was (references unresolved: a secret's ``${oc.env:NAME}`` included)."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import sys

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from feedline.datamodules.epoch.checks import ResumeError
from feedline.datasets.shards.meta import ChunkError
from feedline.storage.stores import StoreError

log = logging.getLogger(__name__)

# Errors that already name their config key (``source.root '/x' does not exist ...``) pass through
# unchanged; anything else is wrapped with the key and the _target_ that failed.
_NAMES_A_KEY = re.compile(
    r"\b(source|data|transforms|collate|mix|model|trainer|callbacks|logger|paths|out|bench)\.\w+"
    r"|\bckpt_(path|safe_types)\b"
)


def require(cfg: DictConfig, *keys: str) -> None:
    """Fail before any work when a required value (``???``) under ``keys`` is still unset, naming each one
    by its full key (``source.root``), not by the argument name deep inside instantiation."""
    missing = sorted(  # full keys: OmegaConf names each by its path from the root
        name
        for key in keys
        if key in cfg and OmegaConf.is_config(cfg[key])
        for name in OmegaConf.missing_keys(cfg[key])
    )
    if missing:
        raise ValueError(
            f"{', '.join(missing)} must be set: add {' '.join(f'{m}=...' for m in missing)} to the command line"
        )
    if "source" in keys and "data" in cfg and "transforms" not in cfg:
        chosen = _choice("source") or "<source>"
        raise ValueError(
            f"no transform stack is chosen for source={chosen} (there is no conf/transforms/for_source/{chosen}.yaml): "
            "pick one with transforms=imagenet (or cifar, digits, shapes, none), or write "
            f"conf/transforms/for_source/{chosen}.yaml in your config dir"
        )


def _choice(group: str) -> str | None:
    """The option a run picked for config group ``group`` (``source=mine``: "mine"), where Hydra ran it."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return HydraConfig.get().runtime.choices.get(group)


def instantiate(cfg: DictConfig, key: str, **kwargs):
    target = cfg.get("_target_", "?") if isinstance(cfg, DictConfig) else "?"
    target = kwargs.get("_target_", target)  # what is built: bench.py builds ImageLoaders from cfg.data
    log.info("Instantiating %s <%s>", key, target)
    try:
        return hydra.utils.instantiate(_detached(cfg), **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        while isinstance(cause, InstantiationException) and cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, ChunkError) or (
            isinstance(cause, (OSError, ValueError, StoreError)) and _NAMES_A_KEY.search(str(cause))
        ):
            raise cause from None
        raise InstantiationException(
            f"could not build config key '{key}' (_target_: {target}): {err}"
        ) from err


def _detached(cfg):
    """``cfg`` inside a copy of its whole config. Hydra's instantiate resolves, in place, the node that an
    interpolation points at (``data.source: ${source}`` resolves ``cfg.source``, secrets included), and the run's
    config outlives the run: a Hydra job returns it (submitit pickles it to ``.submitit/*_result.pkl``)."""
    if not isinstance(cfg, DictConfig):
        return cfg
    root = cfg._get_root()
    if root is cfg:
        return copy.deepcopy(cfg)
    return OmegaConf.select(copy.deepcopy(root), cfg._get_full_key(None))


def instantiate_all(cfg: DictConfig | None, key: str) -> list:
    """Build every entry of a dict of configs (callbacks, loggers); entries set to null are skipped."""
    if not cfg:
        return []
    return [instantiate(node, f"{key}.{name}") for name, node in cfg.items() if node is not None]


@contextlib.contextmanager
def short_errors():
    """An error that names its config key (``source.root '/x' does not exist``) is the whole story: print it
    alone, without the traceback above it, and exit 1. ``HYDRA_FULL_ERROR=1`` shows the traceback again."""
    try:
        yield
    except (OSError, ValueError, TypeError, ResumeError, StoreError, ChunkError) as err:
        # a ChunkError names its chunk (a damaged dataset, not a bug); from a DataLoader worker its message
        # carries the worker's traceback, whose last line is the error itself
        said = str(err).strip().splitlines()[-1] if isinstance(err, ChunkError) else str(err)
        # an error that names its input file (``names_its_input``: a COCO file's problems) says it all too
        named = (
            isinstance(err, ChunkError) or getattr(err, "names_its_input", False) or _NAMES_A_KEY.search(said)
        )
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not named:
            raise
        print(
            f"Error: {said}\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
            file=sys.stderr,
        )
        raise SystemExit(1) from None

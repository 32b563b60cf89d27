"""The datamodule's parts (source, transforms, collate): built from their config, which the checkpoint keeps.

``data`` is instantiated with ``_recursive_: false``, so ``ImageDataModule`` receives each part as its
config node, builds it here, and saves the resolved config as a hyper-parameter: a checkpoint holds the
whole data config (``datamodule_hyper_parameters``) in plain containers that ``torch.load(weights_only=True)``
reads, and ``ImageDataModule.load_from_checkpoint(path)`` builds the same datamodule again, once the recorded
parts are found to name only code that may run (``datamodules/checkpoint/trusted.py``: a config is code). A part given
as an object (Python, LightningCLI) is kept as it is and recorded by its description only. A secret storage
option is recorded by the environment variable that holds it, never by its value (``stores.without_secrets``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from feedline.public import current_targets, public_path
from feedline.storage.secrets import without_secrets

DESCRIBED = "described:"  # the prefix of what the checkpoint records for a part that was given as an object


def is_config(value) -> bool:
    return isinstance(value, Mapping)  # a dict or a DictConfig (a Mapping too)


def build(value, key: str) -> tuple[Any, Any]:
    """(the part, what the checkpoint records of it) for ``data.<key>``: a config node is instantiated
    and recorded as resolved plain containers; an object is used as it is and recorded by the config that
    rebuilds it (``conf/rebuild.py``), else by its repr."""
    if value is None:
        return None, None
    if isinstance(value, str):
        raise TypeError(f"data.{key}={value!r} is neither a config with a _target_ nor an object")
    if is_config(value):
        # Only parts given as config need OmegaConf and Hydra: objects (a plain PyTorch loop) load neither.
        from hydra.utils import instantiate
        from omegaconf import OmegaConf
        from omegaconf.errors import MissingMandatoryValue

        try:
            plain = OmegaConf.to_container(OmegaConf.create(value), resolve=True, throw_on_missing=True)
        except MissingMandatoryValue as err:
            name = f"{key}.{err.full_key}" if err.full_key else key
            raise ValueError(
                f"{name} is required and unset: set {name}=... (on the command line or in the config)"
            ) from None
        if "_target_" not in plain:
            if (
                "class_path" in plain
            ):  # LightningCLI fell back to a plain dict: the class refused these arguments
                raise ValueError(
                    f"data.{key}: {plain['class_path']} does not take {sorted(plain.get('init_args') or {})}; "
                    f"check the spelling of --data.{key}.<argument>"
                )
            raise ValueError(
                f"data.{key} has no _target_: pick one of feedline's groups ({key}=...) or name a class"
            )
        check_arguments(plain, key)
        return instantiate(plain), without_secrets(current_targets(plain))
    rebuild = getattr(value, "rebuild_config", None)
    config = rebuild() if callable(rebuild) else None
    if config is not None:
        return value, without_secrets(config)
    return value, f"{DESCRIBED} {public_path(type(value))}: {value!r}"


def check_arguments(plain: Mapping, key: str) -> None:
    """Refuse, before anything is built, a part whose ``_target_`` does not take some of its keys: the
    usual way there is ``source._target_=my.Source`` on the command line, which keeps the keys of the source
    config it replaces (``root``, ``val_fraction``, ...). A class that takes ``**kwargs`` takes anything."""
    from feedline.cli.trainer_keys import trainer_arguments  # any _target_'s argument names, or None

    taken = trainer_arguments(plain)
    unknown = [str(k) for k in plain if not str(k).startswith("_") and k not in (taken or ())]
    if taken is None or not unknown:
        return
    target = plain["_target_"]
    said = f"{key}._target_={target} does not take {', '.join(unknown)} (it takes {', '.join(taken) or 'nothing'})"
    if key != "source":
        raise ValueError(f"{said}: check the keys of data.{key}")
    raise ValueError(
        f"{said}. `source._target_=` on the command line keeps the keys of the source config it replaces: a "
        f"source of your own gets a config of its own, conf/source/mine.yaml in your config dir (`_target_: "
        f"{target}` and its own keys), picked with `--config-dir conf source=mine` (docs/own-source.md)"
    )


def unrebuildable(parts: dict) -> list[str]:
    """The keys whose saved value is a description (a checkpoint written from objects that no config rebuilds)."""
    return [key for key, value in parts.items() if isinstance(value, str) and value.startswith(DESCRIBED)]

"""What a checkpoint's recorded data config may name, when ``ImageDataModule.load_from_checkpoint`` uses it.

``torch.load(weights_only=True)`` reads a checkpoint's ``datamodule_hyper_parameters`` without running
anything, but the data config they hold is code: the rebuild calls each ``_target_`` with the recorded
arguments (``shutil.copyfile`` copies a file, ``builtins.open(path, "w")`` empties one), and resolving an
interpolation reads the environment or calls a resolver of this process. So before any part is built, each
recorded part (``source``, ``transforms``, ``collate``; not one passed again) is checked at every depth of its
lists and dicts, ``_args_`` and ``_partial_`` targets included:

- a ``_target_`` is a class of the data layer, defined in ``feedline.datasets`` or ``feedline.transforms``
  (sources, stacks, collates, transforms), a class or function of ``torchvision.transforms``,
  ``hydra.utils.get_object`` of a torch dtype or a torchvision enum (``ToDtype``'s ``dtype``), or a name the
  caller trusts (``trusted_targets``: ``module.Name``, or ``package.`` for everything defined in a package);
- no value is an interpolation (a checkpoint records resolved values), but for a credential the store uses
  (``stores.SECRET_OPTIONS``) recorded as ``${oc.env:NAME}`` with ``NAME`` ending in the option's own name
  (``..._AWS_SECRET_ACCESS_KEY``): the store sends the key id and token to the endpoint the checkpoint names,
  so a checkpoint cannot have it send another variable (another service's token) there.

A target is judged by the object it names, not by its spelling (``feedline.transforms.stacks.os.system`` is
``os.system``), and only modules under an allowed prefix are imported to find it. Anything else is refused by
checkpoint, key and target, with how to allow it, before anything is built.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

from feedline.storage.secrets import ENV_REFERENCE, SECRET_OPTIONS

PARTS = ("source", "transforms", "collate")
# modules whose classes build data; none of them writes a file of its arguments' choosing or runs a command
DATA_LAYER = ("feedline.datasets.", "feedline.transforms.")
TORCHVISION = ("torchvision.transforms.",)
GET_OBJECT = "hydra.utils.get_object"

_REBUILDING: ContextVar[tuple | None] = ContextVar("feedline_rebuilding", default=None)


class UntrustedCheckpointError(ValueError):
    """A checkpoint's recorded data config names code that the rebuild would run: the message names the
    checkpoint, each key and target, and how to allow it."""


@contextlib.contextmanager
def rebuilding(checkpoint: str, trusted_targets=(), given=()) -> Iterator[None]:
    """While ``load_from_checkpoint`` builds the datamodule: the parts ``ImageLoaders`` receives come from
    ``checkpoint``, but for those in ``given`` (passed again by the caller)."""
    token = _REBUILDING.set((checkpoint, _trusted(trusted_targets), frozenset(given)))
    try:
        yield
    finally:
        _REBUILDING.reset(token)


def check_rebuilt(parts: dict) -> None:
    """Before any part is built (``ImageLoaders.__init__``): nothing outside a rebuild; in one, the recorded
    parts name only what may run (module docstring), else ``UntrustedCheckpointError``."""
    rebuild = _REBUILDING.get()
    if rebuild is None:
        return
    checkpoint, trusted, given = rebuild
    recorded = {key: value for key, value in parts.items() if key not in given}
    check(recorded, checkpoint, trusted)


def check(parts: dict, checkpoint: str, trusted=((), ())) -> None:
    """``UntrustedCheckpointError`` naming each refused key of ``parts`` (``{"transforms": config, ...}``)."""
    found = [problem for key, value in parts.items() for problem in _problems(_plain(value), key, trusted)]
    if not found:
        return
    targets = sorted({target for _, _, target in found if target})
    keys = sorted({key.split(".")[0].split("[")[0] for key, _, _ in found})
    again = ", ".join(f"{k}=..." for k in keys)
    how = f"pass {'it' if len(keys) == 1 else 'them'} again: load_from_checkpoint(path, {again})"
    if targets:
        names = ", ".join(f'"{target}"' for target in targets)
        allow = f"load_from_checkpoint(path, trusted_targets=[{names}])"
        how = f"if you trust the file, allow what it names: {allow}; or {how}"
    raise UntrustedCheckpointError(
        f"checkpoint {checkpoint}: its recorded data config would run code of the file's choosing when the "
        f"datamodule is rebuilt, so nothing is built from it: {'; '.join(why for _, why, _ in found)}. "
        f"To rebuild, {how}"
    )


def _trusted(entries) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``trusted_targets`` as (exact names, package prefixes ending in '.')."""
    entries = [entries] if isinstance(entries, str) else list(entries or ())
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip(".") or " " in entry:
            raise ValueError(
                f"trusted_targets: {entry!r} is not a dotted name (module.Name, or package. for all of it)"
            )
    return tuple(e for e in entries if not e.endswith(".")), tuple(e for e in entries if e.endswith("."))


def _plain(value):
    """An OmegaConf node (an ``hparams_file``'s) as plain containers, interpolations left unresolved."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=False)
    return value


def _problems(value, key: str, trusted) -> Iterator[tuple[str, str, str | None]]:
    """(key, why, refused target or None) for each thing under ``value`` that may not be rebuilt."""
    if isinstance(value, Mapping):
        if "_target_" in value:
            target = value["_target_"]
            if not _allowed(target, value, trusted):
                shown = f"{GET_OBJECT} of {value.get('path')!r}" if target == GET_OBJECT else repr(target)
                yield (
                    f"{key}._target_",
                    f"{key}._target_ is {shown}, which is not a class of feedline's data layer "
                    "(feedline.datasets, feedline.transforms) or of torchvision.transforms",
                    str(target),
                )
        for name, item in value.items():
            if name == "_target_":
                continue
            if str(name).lower() in SECRET_OPTIONS and isinstance(item, str) and "${" in item:
                yield from _secret_reference(item, f"{key}.{name}", str(name))
            else:
                yield from _problems(item, f"{key}.{name}", trusted)
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            yield from _problems(item, f"{key}[{k}]", trusted)
    elif isinstance(value, str) and "${" in value:
        yield (
            key,
            f"{key} is {value!r}, an interpolation (a checkpoint records resolved values; resolving it would "
            "read the environment or call a resolver)",
            None,
        )


def _secret_reference(value: str, key: str, option: str) -> Iterator[tuple[str, str, str | None]]:
    found = ENV_REFERENCE.fullmatch(value.strip())
    if found and found.group(1).upper().endswith(option.upper()):
        return
    said = f"names the environment variable {found.group(1)}" if found else f"is {value!r}"
    yield (
        key,
        f"{key} {said}: the store sends this option to the endpoint the checkpoint names, so a checkpoint "
        f"may name only ${{oc.env:NAME}} with NAME ending in {option.upper()}",
        None,
    )


def _allowed(target, node: Mapping, trusted) -> bool:
    if not isinstance(target, str):
        return False
    if target == GET_OBJECT and GET_OBJECT not in trusted[0]:
        path = node.get("path")
        return set(node) == {"_target_", "path"} and isinstance(path, str) and _plain_object(path, trusted)
    return _callable(target, trusted)


def _callable(target: str, trusted) -> bool:
    names, prefixes = trusted
    if target in names:
        return True  # named by the caller: whatever it is
    own = tuple(p for p in prefixes if target.startswith(p))
    if not own and not target.startswith(DATA_LAYER + TORCHVISION):
        return False  # nothing else is imported to look
    found = _resolve(target)
    if found is None:
        return False
    module = getattr(found, "__module__", None) or ""
    kind = "class" if inspect.isclass(found) else "function" if inspect.isroutine(found) else None
    return bool(
        kind
        and (
            _under(module, own)
            or kind == "class"
            and _under(module, DATA_LAYER + TORCHVISION)
            or kind == "function"
            and _under(module, TORCHVISION)
        )
    )


def _plain_object(path: str, trusted) -> bool:
    """What ``hydra.utils.get_object`` may fetch (it calls nothing): a torch dtype, a torchvision enum member
    (``InterpolationMode.BICUBIC``), or what may be a target."""
    module, _, name = path.rpartition(".")
    if module == "torch":
        import torch

        return isinstance(getattr(torch, name, None), torch.dtype)
    if path.startswith(TORCHVISION):
        found = _resolve(path)
        if isinstance(found, enum.Enum) and _under(type(found).__module__, TORCHVISION):
            return True
    return _callable(path, trusted)


def _resolve(name: str):
    """The object Hydra's instantiate would call for ``name`` (its own lookup; ``get_object`` logs each miss
    as an error)."""
    from hydra._internal.utils import _locate

    try:
        return _locate(name)
    except Exception:  # not importable: Hydra raises ImportError, or whatever the module raised
        return None


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any((module + ".").startswith(prefix) for prefix in prefixes)

"""Find each secret given by value in a Hydra override or a config's tree, and rewrite it.

    out.storage_options.aws_session_token=tok
      out.storage_options.aws_session_token='${oc.env:FEEDLINE_SECRET_OUT_STORAGE_OPTIONS_AWS_SESSION_TOKEN}'
    source.storage_options={aws_access_key_id: AK, region_name: x}
      source.storage_options={aws_access_key_id:'${oc.env:FEEDLINE_SECRET_..._KEY_ID}',region_name:x}

as ``secrets_to_environment`` rewrites them, each value moved into that variable (a record's copy of the
overrides, ``secrets.hidden_overrides``, reads ``HIDDEN`` there instead).
A secret is any key ``storage.secrets.is_secret`` names. It is given by value unless it is empty, ``???``,
``HIDDEN`` or a reference (``is_reference``: ``${oc.env:NAME}``, or a resolver of the user's own); a
``${some.key}`` points at a value in the config, so it counts as one (``literal_secrets``).
``rewrite_override`` hands each secret value of an override to the caller's ``replace(key, value)`` and
quotes what that returns; an interpolation there is left for Hydra to resolve and the guard to check, and
every other override, flag and key comes back as written. It refuses (``SecretError``, naming the key, never
the value) what it cannot rewrite without writing a secret: an override Hydra cannot parse, a sweep over
secrets, a delete that spells the secret, and an endpoint URL with a user name and password in it.
"""

from __future__ import annotations

import os
import re

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, Quote, QuotedString

from feedline.storage.secrets import (
    ENV_PREFIX,
    ENV_REFERENCE,
    HIDDEN,
    SECRET_OPTIONS,
    is_endpoint,
    is_secret,
    userinfo_refusal,
)

# a whole ${resolver:...} with no interpolation inside: a reference that holds no value of its own
_RESOLVER = re.compile(r"\$\{\s*([\w.]+)\s*:[^${}]*\}")


class SecretError(ValueError):
    """A secret given where it would be written to disk: the message names the key, never the value."""


def env_name(key: str) -> str:
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", key).upper()


def is_reference(value) -> bool:
    """``${oc.env:NAME}`` (or with a null default) or a resolver of the user's own (a secret store's): no
    value of its own. ``${some.key}``, ``oc.select`` or an ``oc.env`` default point at a value in the config."""
    text = str(value).strip()
    found = _RESOLVER.fullmatch(text)
    return bool(ENV_REFERENCE.fullmatch(text) or found and not found.group(1).startswith("oc."))


def _may_hold_a_secret(arg: str) -> bool:
    return any(name in arg.lower() for name in (*SECRET_OPTIONS, "storage_options", "endpoint_url"))


def secrets_to_environment(args: list[str], environ=None) -> list[str]:
    """``args`` with every secret given by value replaced by ``${oc.env:FEEDLINE_SECRET_<KEY>}``, that
    variable set in ``environ`` (this process's environment)."""
    environ = os.environ if environ is None else environ

    def keep(key: str, value: str) -> str:
        environ[env_name(key)] = value
        return f"${{oc.env:{env_name(key)}}}"

    return [rewrite_override(arg, keep) for arg in args]


def rewrite_override(arg: str, replace) -> str:
    """``arg`` with each secret value in it replaced by ``replace(key, value)``, quoted; anything else (flags,
    other keys, references) as it is. An endpoint with a user name and password is refused."""
    if arg.startswith("-") or "=" not in arg or not _may_hold_a_secret(arg):
        return arg
    given = arg.split("=", 1)[0]  # the key with the user's own +, ++ or ~
    try:
        override = OverridesParser.create().parse_override(arg)
    except Exception:
        raise SecretError(  # Hydra's own message would quote the value
            f"{given.lstrip('~+')}: Hydra cannot parse this override (its value is not shown: it may be a "
            f"secret): quote the value for Hydra, and the whole override for the shell: '{given}=\"...\"'"
        ) from None
    key = override.key_or_group
    values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    for value in values:
        refusal = next(filter(None, (userinfo_at(k, v) for k, v in leaves(key, value))), None)
        if refusal:
            raise SecretError(refusal)
    if override.is_sweep_override():
        if any(literal_secrets(key, value) for value in values):
            raise SecretError(
                f"{key}: a sweep over secrets would write them into the sweep's files: sweep over references "
                f"instead, one environment variable per value ({key}=${{oc.env:NAME}}), or over profiles "
                f"({key.rsplit('.', 1)[0]}.profile_name)"
            )
        return arg
    if override.type == OverrideType.DEL:
        if literal_secrets(key, override.value()):
            raise SecretError(f"{key}: delete a secret without its value: ~{key}")
        return arg
    changed = False

    def walk(path: str, value):
        nonlocal changed
        if isinstance(value, dict | list):
            return map_items(path, value, walk)
        text = value.text if isinstance(value, QuotedString) else value
        # an interpolation is Hydra's to resolve (the guard checks what it points at)
        if not is_secret(path) or not _is_value(text) or "${" in str(text):
            return value
        changed = True
        return QuotedString(text=replace(path, str(text)), quote=Quote.single)  # as a user would quote it

    replaced = walk(key, override._value)
    if not changed:
        return arg
    return f"{override.get_key_element()}={Override._get_value_element_as_str(replaced)}"


def map_items(key: str, value, function):
    """``value``'s items through ``function(their key, item)``, as the same kind of container."""
    if isinstance(value, dict):
        return {k: function(f"{key}.{k}" if key else str(k), v) for k, v in value.items()}
    return [function(f"{key}.{n}" if key else str(n), v) for n, v in enumerate(value)]


def _is_value(value) -> bool:
    return value is not None and str(value) not in ("", "???", HIDDEN)


def leaves(key: str, value):
    """(key, value) of every leaf under ``key`` (itself, when ``value`` is no container)."""
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            yield from leaves(f"{key}.{k}" if key else str(k), v)
    else:
        yield key, value


def secret_leaves(key: str, value):
    """(key, value) of every secret option under ``key`` (itself included)."""
    return [(k, v) for k, v in leaves(key, value) if is_secret(k)]


def literal_secrets(key: str, value) -> list[str]:
    """The keys under ``key`` (itself included) whose secret is given by value."""
    return [k for k, v in secret_leaves(key, value) if _is_value(v) and not is_reference(v)]


def userinfo_at(key: str, value) -> str | None:
    """What to say of an endpoint at ``key`` whose URL holds a user name and password (shown without them),
    else None."""
    return userinfo_refusal(key, value) if is_endpoint(key) else None

"""What of a store's options is a secret, and how a record of them (a checkpoint's config) holds one: never
by value. ``storage/stores.py`` reads references back when it makes its client; ``cli/secrets.py`` keeps secrets out
of the files Hydra and a run write.

Secrets (``SECRET_OPTIONS``, and any key of ``storage_options`` that looks like one: ``is_secret``) are never
recorded: a record names the environment variable that holds each one (``${oc.env:NAME}``), else says
``HIDDEN``. An endpoint URL with a user name and password in it (``http://user:pass@host``) is refused
(``userinfo_refusal``): S3 takes no credentials there (boto3 sends neither), and the URL is written wherever
the endpoint is (configs, checkpoints, errors).
"""

from __future__ import annotations

import os
import re

SECRET_OPTIONS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
# what a storage option's name holds (lower case, letters only) when it may be a secret: a misspelt secret
# option (aws_secret_acess_key, secret_key, password) is kept out of every file too, then refused by name
SECRET_WORDS = ("secret", "token", "password", "passwd", "keyid", "accesskey", "credential")
# an endpoint URL's user name and password: scheme://user:pass@host
_USERINFO = re.compile(r"^\s*((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/?#]*@([^/?#]*)")
HIDDEN = "<hidden: feedline records no secret>"
# the variables that a secret given by value on the command line moves into (cli/secrets.py)
ENV_PREFIX = "FEEDLINE_SECRET_"
# ${oc.env:NAME} (or with a null default): a secret given by the name of the variable that holds it
ENV_REFERENCE = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:,\s*null\s*)?\}")


def is_secret(key) -> bool:
    """``key`` (a dotted path: ``source.storage_options.aws_secret_access_key``) names a secret: a secret
    option anywhere, or any key right under a ``storage_options`` whose name holds one of ``SECRET_WORDS``."""
    parent, _, name = f".{key}".rpartition(".")
    if name.lower() in SECRET_OPTIONS:
        return True
    letters = re.sub(r"[^a-z]", "", name.lower())
    return parent.rpartition(".")[2].lower() == "storage_options" and any(w in letters for w in SECRET_WORDS)


def is_endpoint(key) -> bool:
    return str(key).rpartition(".")[2].lower() == "endpoint_url"


def userinfo_refusal(key: str, url, parent: str | None = None) -> str | None:
    """What to say when endpoint ``url`` (at config key ``key``, its storage options at ``parent``) holds a
    user name and password, else None. The message never holds them: it shows the URL without them."""
    found = _USERINFO.match(url) if isinstance(url, str) else None
    if not found:
        return None
    parent = parent or key.rpartition(".")[0]
    return (
        f"{key}: the endpoint's URL holds a user name and password (not shown), which S3 does not take "
        f"(boto3 sends neither) and which would be written wherever the endpoint is recorded: give the "
        f"endpoint as {found.group(1)}{found.group(2)}, and the credentials as {parent}.aws_access_key_id and "
        f"aws_secret_access_key (by reference: '${{oc.env:NAME}}'), {parent}.profile_name or the AWS_* variables"
    )


def without_secrets(config, environ=None, key: str = ""):
    """``config`` (plain dicts and lists, at config key ``key``) as it may be recorded: every secret's value
    (``is_secret``) replaced by ``${oc.env:NAME}`` when an environment variable holds that very value
    (feedline moves a secret given on the command line into one; ``AWS_*`` ones count too), else by
    ``HIDDEN``. References stay as they are."""
    environ = os.environ if environ is None else environ
    if isinstance(config, dict):
        return {
            k: _recorded_secret(v, environ)
            if is_secret(f"{key}.{k}")
            else without_secrets(v, environ, f"{key}.{k}")
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [without_secrets(v, environ, f"{key}.{n}") for n, v in enumerate(config)]
    return config


def _recorded_secret(value, environ) -> object:
    if value is None or value == "" or value == HIDDEN or ENV_REFERENCE.fullmatch(str(value).strip()):
        return value
    # a variable of the user's own first: it outlives this process, where feedline's are set per command
    holders = sorted(
        (name.startswith(ENV_PREFIX), name) for name, held in environ.items() if held == str(value)
    )
    return f"${{oc.env:{holders[0][1]}}}" if holders else HIDDEN

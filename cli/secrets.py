"""Secrets stay out of every file a run writes: given by reference, never by value.

A secret storage option (``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``, under any
key: ``source.storage_options``, a mix part's, ``out.storage_options``; and any key of a ``storage_options``
that looks like one, ``stores.is_secret``, so that a misspelt ``aws_secret_acess_key`` is kept out of every
file too before the store refuses it by name) reaches a run in one of three ways:

- **By value on the command line.** ``train.py``, ``convert.py`` and ``bench.py`` wrap their ``main`` in
  ``from_command_line``, which runs before Hydra reads ``sys.argv``: the value moves into an environment
  variable of the process, ``FEEDLINE_SECRET_<KEY>``, and the override becomes
  ``key='${oc.env:FEEDLINE_SECRET_<KEY>}'``. Hydra never sees the value, so there is no moment at which it is
  on disk: ``.hydra/*.yaml``, ``multirun.yaml``, submitit's pickles, ``summary.json`` and the sweep summary
  hold the reference. Lightning's DDP ranks (started again with ``sys.argv``), a multirun's jobs and SLURM jobs
  through the submitit launcher (SLURM passes the submitting environment on by default) inherit the
  variable, and OmegaConf resolves it where the source is built. A resume is the same command again. A
  project of one's own gets the same by wrapping its entry point::

      @from_command_line
      @hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
      def main(cfg): ...

- **By reference in a config file**: ``${oc.env:NAME}``, or a resolver of the user's own. Kept as it is;
  ``cli/instantiate.py`` builds from a copy of the config, so the run's config stays unresolved.
- **By value in a config file**: refused by ``SecretsGuard`` (a Hydra callback, ``conf/hydra/default.yaml``)
  in ``on_run_start`` / ``on_multirun_start``, before Hydra writes anything, with the forms to use instead;
  likewise a ``${oc.env:NAME}`` whose variable is not set. A multirun job whose swept config group brings a
  secret is refused in ``on_job_start``, after Hydra wrote that job's ``.hydra/``, so those files are masked
  first. Hydra turns a callback's exception into a warning: the refusal is a ``SystemExit``. Where ``main``
  is not wrapped (a project that added only the guard), a secret given by value on the command line reaches
  the guard as it is, and is refused as given there (``hydra.overrides.task``), with the forms to use there.

An endpoint URL with a user name and password in it (``http://user:pass@host``) is refused on the command line
and by the guard alike, never printed (``stores.userinfo_refusal``): S3 takes no credentials there.

Checkpoints and the logger's ``hparams.yaml`` record the datamodule's config with each secret as the name of
a variable that holds it, else as ``HIDDEN`` (``storage/stores.py``, ``without_secrets``). The command line
itself is visible to the machine's users (``ps``) while the process runs; ``${oc.env:NAME}``,
``profile_name`` and the ``AWS_*`` variables never put a secret there.

The secrets in an override or a config are found and rewritten by ``cli/secret_overrides.py``.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from feedline.cli.instantiate import short_errors
from feedline.cli.secret_overrides import (
    SecretError,
    leaves,
    literal_secrets,
    map_items,
    rewrite_override,
    secret_leaves,
    secrets_to_environment,
    userinfo_at,
)
from feedline.moved import old_names
from feedline.storage.secrets import ENV_REFERENCE, HIDDEN

# set by from_command_line: this program moves a secret given by value on its command line into the environment
MOVES_SECRETS = "FEEDLINE_MOVES_COMMAND_LINE_SECRETS"
REFERENCE_HELP = (
    "give it by reference instead: {given}=${{oc.env:NAME}}{quote} with NAME an environment variable exported "
    "before the run, or a profile ({parent}.profile_name=NAME, ~/.aws/credentials), or the AWS_* variables"
)
MOVED_HELP = (
    "; on the command line a secret may also be given by value (feedline moves it into the environment)"
)
WRAP_HELP = (
    "; or wrap the program's @hydra.main function in feedline.cli.secrets.from_command_line (as feedline's "
    "train.py does), which moves a secret given by value on the command line into the environment before "
    "Hydra reads it"
)


def _help(key: str, given: str | None = None) -> str:
    """The forms to use for the secret at ``key``; ``given``: its key as written on the command line (with
    its ``+``), shown quoted for the shell."""
    where = {"given": f"'{given}", "quote": "'"} if given else {"given": key, "quote": ""}
    text = REFERENCE_HELP.format(parent=key.rsplit(".", 1)[0], **where)
    return text + (MOVED_HELP if os.environ.get(MOVES_SECRETS) else WRAP_HELP)


# -- the command line ------------------------------------------------------------------------------------------
def from_command_line(main):
    """Wrap an entry point's ``@hydra.main`` function: secrets in ``sys.argv`` move into the environment
    before Hydra parses it (``sys.argv`` itself is rewritten, for Lightning's DDP ranks that restart with it)."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        if not args and not kwargs:  # Hydra reads the command line (called with a config, it does not)
            # the guard's advice: this process, and the jobs it starts, move a secret given on the command line
            os.environ[MOVES_SECRETS] = "1"
            with short_errors():
                sys.argv[1:] = secrets_to_environment(sys.argv[1:])
        return main(*args, **kwargs)

    return wrapper


def hidden_overrides(overrides) -> list[str]:
    """Overrides (``hydra.overrides.task``) as a record may hold them (``summary.json``): as written, not
    resolved (a ListConfig's items are: ``'${oc.env:NAME}'`` would read as the secret), and a secret given by
    value (through the compose API, which has no command line) reads ``HIDDEN``."""
    return [rewrite_override(o, lambda key, value: HIDDEN) for o in _as_written(overrides)]


def _as_written(overrides) -> list[str]:
    if OmegaConf.is_config(overrides):
        overrides = OmegaConf.to_container(overrides, resolve=False)
    return [str(o) for o in overrides or []]


# -- the composed config ---------------------------------------------------------------------------------------
def secrets_by_value(cfg: DictConfig) -> list[str]:
    """Keys of ``cfg`` (``hydra.*`` included: ``hydra.job.env_set``) whose secret is written by value."""
    return literal_secrets("", OmegaConf.to_container(cfg, resolve=False))


def _endpoint_refusal(cfg: DictConfig) -> str | None:
    """What to say of the first endpoint of ``cfg`` that holds a user name and password, else None."""
    return next(
        filter(None, (userinfo_at(k, v) for k, v in leaves("", OmegaConf.to_container(cfg, resolve=False)))),
        None,
    )


def _given_on_command_line(config: DictConfig) -> dict[str, str]:
    """Each secret given by value on the run's command line (``hydra.overrides``; ``main`` not wrapped in
    ``from_command_line``): its key -> its key as the user wrote it (``+``, ``++``)."""
    found: dict[str, str] = {}
    for group in ("task", "hydra"):
        for arg in _as_written(OmegaConf.select(config, f"hydra.overrides.{group}", default=None)):
            prefix = arg[: len(arg) - len(arg.lstrip("~+"))]

            def collect(key: str, value: str, prefix: str = prefix) -> str:
                found.setdefault(key, prefix + key)
                return HIDDEN

            rewrite_override(arg, collect)
    return found


def _masked(key: str, value):
    if isinstance(value, dict | list):
        return map_items(key, value, _masked)
    return HIDDEN if literal_secrets(key, value) or userinfo_at(key, value) else value


def _refuse(config: DictConfig) -> None:
    """Stop the run when ``config`` holds a secret by value, an endpoint with a password, or refers to a
    variable that is not set. Hydra turns a callback's exception into a warning and goes on: the refusal is a
    ``SystemExit`` (status 1)."""
    try:
        given = _given_on_command_line(config)
    except SecretError as err:  # a sweep over secrets, an endpoint with a password
        raise SystemExit(f"Error: {err}") from None
    refusal = _endpoint_refusal(config)
    if refusal:
        raise SystemExit(f"Error: {refusal}")
    if given:
        key = next(iter(given))
        raise SystemExit(
            f"Error: {', '.join(given)}: a secret given by value on the command line, which Hydra would write "
            f"into the run's .hydra/overrides.yaml, hydra.yaml and config.yaml: " + _help(key, given[key])
        )
    keys = secrets_by_value(config)
    if keys:
        raise SystemExit(
            f"Error: {', '.join(keys)}: a secret written by value in a config file, which Hydra would copy into "
            f"the run's .hydra/config.yaml and a checkpoint would keep: " + _help(keys[0])
        )
    unset = _unset_references("", OmegaConf.to_container(config, resolve=False))
    if unset:
        key, name = unset[0]
        raise SystemExit(
            f"Error: {key} refers to the environment variable {name}, which this process does not have: export "
            f"{name}=... before the run (a resume in a new shell: give the secret again as on the first command)"
        )


def _unset_references(key: str, value) -> list[tuple[str, str]]:
    """(key, variable) for each secret given as ``${oc.env:NAME}`` (no default) whose variable is not set."""
    found = [(k, ENV_REFERENCE.fullmatch(str(v).strip()), str(v)) for k, v in secret_leaves(key, value)]
    return [(k, m.group(1)) for k, m, v in found if m and "," not in v and m.group(1) not in os.environ]


class SecretsGuard(Callback):
    """Refuses a secret written by value in the composed config before Hydra writes the run's files."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _refuse(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _refuse(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A multirun job composed with a swept config group: Hydra has just written its ``.hydra/``."""
        if not secrets_by_value(config) and not _endpoint_refusal(config):
            return
        if config.hydra.output_subdir is not None:
            out = Path(config.hydra.runtime.output_dir) / str(config.hydra.output_subdir)
            masked = _masked("", OmegaConf.to_container(config, resolve=False))
            hydra_part = {"hydra": masked.pop("hydra")}
            for name, part in (("config.yaml", masked), ("hydra.yaml", hydra_part)):
                if (out / name).exists():
                    OmegaConf.save(OmegaConf.create(part), out / name)
        _refuse(config)


__getattr__ = old_names(__name__)  # names that moved to another module keep working for one release

"""``--help`` lists the config groups a user picks from: each with one line on what it is for, and its options.

Hydra renders ``--help`` from ``hydra.help.template`` (``conf/hydra/default.yaml``), which asks for the groups
with ``${feedline_help_groups:}``: the resolver that ``register()`` adds (``train.py``, ``bench.py`` and
``convert.py`` call it before ``@hydra.main``). A command lists the groups that Hydra finds (``conf/``, the
ConfigStore, a project's search path) and that its config composes (``hydra.runtime.choices``), with their
subgroups (``source/parts``), less two kinds:

- ``INTERNAL``: groups feedline composes by itself and a user never names;
- Hydra's own groups (``hydra/...``) to which ``conf/`` adds no option: ``--hydra-help`` lists those.

So a new group in ``conf/`` shows by itself. Its line comes from ``GROUPS``, the one place that describes
groups: a group without one is listed as such, and ``tests/test_help.py`` fails until it has one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import resources

from omegaconf import OmegaConf

RESOLVER = "feedline_help_groups"

# What each group a user picks from is for, in the order --help lists them.
GROUPS = {
    "source": "where the samples live: class folders, an HDF5 file, shards (local or s3://), tars, a mix",
    "source/parts": "the parts of source=mix, each any source: +source/parts@source.parts.<name>=<option>",
    "transforms": "augmentation per sample (workers) and per batch (device); unset: the source's preset",
    "collate": "how samples become a batch: uint8 in shared memory, torch's default, padded",
    "mix": "MixUp or CutMix on the device, per training batch",
    "data": "the loaders: data.batch_size, data.num_workers, data.on_bad_sample, ...",
    "model": "the LightningModule to train; its network takes the class count from the data",
    "trainer": "Lightning's Trainer: accelerator, devices, DDP; any of its arguments as trainer.<name>=...",
    "logger": "where metrics go (metrics.csv in the run's directory), or none",
    "callbacks": "checkpoints (mid-epoch last.ckpt too), throughput and model summary, or none",
    "experiment": "a preset that sets several groups and keys at once",
    "paths": "where runs write (paths.log_dir) and the index cache every run shares (paths.cache_dir)",
    "hydra/launcher": "how -m runs its jobs: one after another in this process, or as SLURM jobs",
}

# Groups feedline composes by itself; a user never names them on a command line.
INTERNAL = frozenset(
    {
        "hydra",  # Hydra's own settings for feedline's runs (run dirs, callbacks, this help)
        "feedline_schema",  # the typed schemas (conf/__init__.py) that configs extend
        "feedline_schema/source",
        "transforms/for_source",  # the stack a run gets when it names no transforms=, chosen by source
        "experiment_source",  # what an experiment sets for the chosen source
        "experiment_source/backends",
    }
)


def register() -> None:
    """Add the resolver that ``hydra.help.template`` calls (once; calling again does nothing)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _groups_help)


def user_groups(found: Iterable[str], choices: Mapping[str, object]) -> list[str]:
    """The groups of ``found`` a user picks from, for a config that composed ``choices`` (group, or
    ``group@package``, to option), in ``GROUPS`` order, then any undescribed one by name."""
    composed = {key.split("@")[0] for key in choices}

    def listed(group: str) -> bool:
        parts = group.split("/")
        if group in INTERNAL:
            return False
        if parts[0] == "hydra":
            return resources.files("feedline.conf").joinpath(*parts).is_dir()
        # a group of the user's own (their --config-dir or search path) is theirs to add with +group=option
        return _own(group) or any("/".join(parts[:n]) in composed for n in range(1, len(parts) + 1))

    order = list(GROUPS)
    return sorted(filter(listed, set(found)), key=lambda g: (order.index(g) if g in order else len(order), g))


def _own(group: str) -> bool:
    """Whether ``group`` is not one of feedline's (neither a folder of feedline.conf nor a schema of its)."""
    return group.split("/")[0] not in {g.split("/")[0] for g in (*GROUPS, *INTERNAL)}


def format_groups(groups: Iterable[tuple[str, list[str], object]]) -> str:
    """Two lines per ``(group, options, this run's choice)``: its description, then its options, this run's
    starred (none is where the choice is unset or not one of them: ``transforms`` follows the source)."""
    groups = list(groups)
    width = max((len(name) for name, _, _ in groups), default=0) + 2
    lines = []
    for name, options, chosen in groups:
        about = GROUPS.get(name, f"a group of your own: {name}=<option>, or +{name}=<option> to add it")
        shown = ", ".join(f"{o}*" if o == chosen else o for o in options)
        lines += [f"{name:<{width}}{about}", f"{'':<{width}}{shown}"]
    return "\n".join(lines)


def _groups_help(_root_) -> str:
    from hydra.core.global_hydra import GlobalHydra

    if not GlobalHydra.instance().is_initialized():
        return "(the config groups are listed when Hydra renders --help)"
    hydra = GlobalHydra.instance().hydra
    choices = dict(_root_.hydra.runtime.choices)
    groups = user_groups(hydra.list_all_config_groups(), choices)
    text = format_groups((g, hydra.config_loader.get_group_options(g), choices.get(g)) for g in groups)
    return text.replace("$", "$$")  # Hydra fills the template in with string.Template

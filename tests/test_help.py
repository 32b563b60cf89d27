"""``--help`` lists the config groups a user picks from, each with its line and options; internal ones never."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.core.config_store import ConfigStore

from feedline.cli.help import GROUPS, INTERNAL, format_groups, user_groups
from tests.conftest import CONF, ROOT_DIR

RUNS = {
    "train": ["train.py", "model=resnet18", "--help"],  # an override: the config and the star follow it
    "bench": ["bench.py", "--help"],
    "convert": ["convert.py", "--help"],
    "hydra-help": ["train.py", "--hydra-help"],
    "unknown-option": ["train.py", "source=nope"],  # a typo'd option is refused, listing the valid ones
}
# what each command composes: bench has no logger or callbacks, convert only a source
LISTS = {
    "train": set(GROUPS),
    "bench": set(GROUPS) - {"logger", "callbacks"},
    "convert": {"source", "source/parts", "paths", "hydra/launcher"},
}


@pytest.fixture(scope="module")
def outputs() -> dict[str, tuple[int, str, str]]:
    """Each command's (exit status, stdout, stderr), the processes run side by side (a --help takes seconds:
    most of it imports)."""
    running = {
        name: subprocess.Popen(
            [sys.executable, *args], cwd=ROOT_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, args in RUNS.items()
    }
    done = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=300)
        done[name] = (process.returncode, out, err)
    return done


@pytest.mark.slow
def test_an_unknown_option_is_refused_on_the_command_line_listing_the_valid_ones(outputs):
    status, _, err = outputs["unknown-option"]
    assert status != 0 and "Could not find 'source/nope'" in err
    assert all(option in err for option in ("digits", "folder", "hdf5", "shards", "wds", "mix"))


@pytest.fixture
def helps(outputs):
    """``helps(name)``: that command's output, once it has exited cleanly."""

    def output(name: str) -> str:
        status, out, err = outputs[name]
        assert status == 0, f"{RUNS[name]}: {err[-3000:]}"
        return out

    return output


def listed(help_text: str) -> dict[str, tuple[str, list[str]]]:
    """``--help``'s groups section as {group: (its line, its options with this run's starred)}."""
    section = help_text.split("== Configuration groups ==")[1].split("== Config ==")[0]
    lines = [line for line in section.splitlines()[2:] if line.strip()]
    return {
        about.split()[0]: (about.split(maxsplit=1)[1], options.strip().split(", "))
        for about, options in zip(lines[::2], lines[1::2])
    }


def conf_groups() -> set[str]:
    """Every group folder of conf/ and every group feedline puts in the ConfigStore, by its full name."""
    from feedline.conf import register

    register()
    folders = {
        d.relative_to(CONF).as_posix()
        for d in CONF.rglob("*")
        if d.is_dir() and not d.name.startswith(("_", "."))
    }

    def stored(node: dict, prefix: str = "") -> set[str]:
        return {
            name
            for key, child in node.items()
            if isinstance(child, dict) and not key.startswith("hydra")
            for name in {prefix + key} | stored(child, f"{prefix}{key}/")
        }

    return folders | stored(ConfigStore.instance().repo)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "bench", "convert"])
def test_help_lists_each_user_group_with_its_line_and_options_and_no_internal_one(helps, command):
    groups = listed(helps(command))
    assert set(groups) == LISTS[command]
    for group, (about, options) in groups.items():
        assert about == GROUPS[group]
        yaml_options = {p.stem for p in (CONF / group).glob("*.yaml")}
        assert yaml_options and yaml_options <= {o.rstrip("*") for o in options}, group
    section = helps(command).split("== Config ==")[0]
    for internal in INTERNAL - {"hydra"}:
        assert internal not in section
    assert "hydra/job_logging" not in section  # Hydra's own groups are --hydra-help's


@pytest.mark.slow
def test_help_shows_the_config_the_overrides_compose(helps):
    groups, config = listed(helps("train")), helps("train").split("== Config ==")[1]
    assert "resnet18*" in groups["model"][1] and "uint8*" in groups["collate"][1]
    assert "_target_: torchvision.models.resnet18" in config and "SmallCNN" not in config
    assert "task_name: train" in config
    assert "task_name: bench" in helps("bench") and "out:\n  path: ???" in helps("convert")


@pytest.mark.slow
def test_hydra_help_still_lists_hydras_flags_and_groups(helps):
    assert "--hydra-help : Hydra's help" in helps("hydra-help")
    assert "hydra/job_logging: " in helps("hydra-help")


def test_every_group_in_conf_is_described_or_named_internal():
    groups = conf_groups()
    assert groups - set(GROUPS) - INTERNAL == set(), "describe each in GROUPS, feedline/cli/help.py"
    assert set(GROUPS) - groups == set() and INTERNAL - groups == set(), "no longer in conf/"
    assert set(GROUPS) & INTERNAL == set()
    for group, about in GROUPS.items():
        assert "\n" not in about and len(about) <= 90, group


def test_a_new_group_is_listed_without_being_described_first():
    choices = {
        "source": "folder",
        "optimizer": "adam",
        "transforms": "for_source/folder",
        "hydra/sweeper": "x",
    }
    found = ["optimizer", "source", "source/parts", "transforms", "transforms/for_source", "hydra/sweeper"]
    assert user_groups(found, choices) == ["source", "source/parts", "transforms", "optimizer"]
    # a group of the user's own is listed even where this run did not compose it; feedline's are not
    assert user_groups([*found, "scheduler", "logger"], choices) == [
        *user_groups(found, choices),
        "scheduler",
    ]
    text = format_groups([("optimizer", ["adam", "sgd"], "adam")])
    assert "optimizer  a group of your own: optimizer=<option>, or +optimizer=<option>" in text
    assert "adam*, sgd" in text

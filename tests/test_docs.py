"""The manual (docs/, mkdocs.yml) and the README's front page: every page is in the navigation, the README's links
lead to pages and headings that exist, the configuration reference covers every typed option schema, and the
shell blocks marked ``<!-- runnable -->`` run as written, on a small generated tree."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

from tests.conftest import ROOT_DIR
from tests.helpers import simple_tree
from tests.test_quiet import assert_quiet

DOCS = ROOT_DIR / "docs"
RUNNABLE = re.compile(r"<!-- runnable -->\n```bash\n(.*?)\n```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+?)\s*$", re.M)
SCHEMA_MARKER = re.compile(r"<!-- schema ([\w.]+)\n")
OPTION_MODULES = (
    "feedline.datasets.options",
    "feedline.datamodules.options",
    "feedline.writers.options",
    "feedline.diagnostics.options",
)
# What the runnable blocks' paths stand for: a small class-folder tree, and where outputs go.
DATA = "/data/"


def hook(name: str = "reference"):
    """One of the manual's MkDocs hooks (docs/hooks/NAME.py), as mkdocs.yml loads it."""
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(DOCS / "hooks"))


def nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return [page for item in node for page in nav_pages(item)]


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slugify(re.sub(r"[`*]", "", title), "-") for title in HEADING.findall(text)}


def runnable_blocks() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT_DIR / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for match in RUNNABLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            found.append((f"{path.relative_to(ROOT_DIR)}:{line}", match.group(1)))
    return found


def test_every_page_of_the_manual_is_in_the_navigation_and_every_entry_is_a_page():
    class Loader(
        yaml.SafeLoader
    ):  # mkdocs' own tags (!relative, !ENV) read as nothing: the nav is what counts
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    config = yaml.load((ROOT_DIR / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    nav = nav_pages(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert sorted(pages - set(nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - pages) == [], "nav entries with no page"
    assert len(nav) == len(set(nav)), "a page listed twice"


def test_the_readme_links_lead_to_pages_and_headings_of_the_manual():
    readme = (ROOT_DIR / "README.md").read_text(encoding="utf-8")
    links = [link for link in LINK.findall(readme) if "://" not in link]
    into_docs = [link for link in links if link.startswith("docs/") and ".md" in link]
    assert len(into_docs) >= 15, into_docs  # a front page that leads into the manual
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT_DIR / path
        assert target.exists(), f"README links to {link}: {path} does not exist"
        if anchor:
            assert anchor in anchors(target), f"README links to {link}: no such heading in {path}"


def test_the_readme_is_a_front_page_of_300_lines_or_fewer():
    assert len((ROOT_DIR / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


def option_schemas() -> set[str]:
    schemas = set()
    for name in OPTION_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if dataclasses.is_dataclass(value) and value.__module__ == name:
                schemas.add(f"{name}.{value.__name__}")
    return schemas


def test_the_configuration_reference_shows_every_option_schema_and_every_key():
    page = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    shown = set(SCHEMA_MARKER.findall(page))
    assert option_schemas() - shown == set(), "option schemas missing from docs/reference/configuration.md"
    reference = hook()
    for match in reference.MARKER.finditer(page):
        table = reference.render(match["target"], match["body"])
        prefix = reference.parse_body(match["body"], "")["prefix"]
        for field in dataclasses.fields(reference.load(match["target"])):
            assert f"`{prefix}.{field.name}`{{.feedline-key}}" in table, (match["target"], field.name)


def test_the_config_groups_table_lists_every_option_each_group_has():
    table = (DOCS / "reference" / "configuration.md").read_text().split("## Config groups")[1]
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines() if line.startswith("| `")}
    for group in ("source", "transforms", "collate", "model", "trainer", "logger", "callbacks", "experiment"):
        options = sorted(p.stem for p in (ROOT_DIR / "conf" / group).glob("*.yaml"))
        missing = [o for o in options if f"`{o}`" not in rows[group]]
        assert not missing, f"docs/reference/configuration.md's {group} row does not name {missing}"


def test_the_configuration_reference_names_every_key_the_entry_points_set_themselves():
    """The keys of conf/train.yaml, bench.yaml and convert.yaml outside any group (seed, ckpt_path, ...)."""
    from omegaconf import OmegaConf

    page = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    for primary in ("train", "bench", "convert"):
        own = OmegaConf.load(ROOT_DIR / "conf" / f"{primary}.yaml")
        for key in set(own) - {"defaults", "hydra", "bench"}:  # bench.*: its schema's table
            assert f"| `{key}` |" in page, f"conf/{primary}.yaml's {key} is not in the reference"


@dataclasses.dataclass
class _Documented:
    plain: int = 3  # the comment beside it
    # a comment block above it
    above: str = "x"
    spelled: int | None = None  # noqa: UP045 - what follows a noqa code
    bare: bool = False


def test_the_reference_takes_each_description_from_the_comment_beside_the_field(caplog):
    reference = hook()
    with caplog.at_level(logging.WARNING):
        table = reference.render(f"{__name__}._Documented", "prefix: t\n")
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[3:]}
    assert rows["`t.plain`{.feedline-key}"].endswith("| int | `3` | the comment beside it |")
    assert rows["`t.above`{.feedline-key}"].endswith("| str | `x` | a comment block above it |")
    assert "| int or null | `null` | what follows a noqa code |" in rows["`t.spelled`{.feedline-key}"]
    assert "field 'bare' has no description" in caplog.text  # a warning: --strict fails the build on it


def test_a_note_for_a_key_the_schema_does_not_have_fails_the_build():
    reference = hook()
    with pytest.raises(reference.PluginError, match="notes for keys it does not have: nope"):
        reference.render(f"{__name__}._Documented", "prefix: t\nnotes:\n  bare: a note\n  nope: a note\n")


def test_the_architecture_page_lists_every_public_name_and_each_folder_with_its_docstring():
    from feedline.public import PUBLIC

    layout = hook("layout")
    table = layout.public_names()
    for package, names in PUBLIC.items():
        for name in names:
            assert f"`{package}.{name}`{{.feedline-key}}" in table
    assert "| `datasets/folder/`{.feedline-key} |" in layout.tree(["datasets/folder"])
    with pytest.raises(layout.PluginError, match="not a package"):
        layout.tree(["docs"])


def test_the_manual_marks_a_handful_of_runnable_blocks():
    blocks = dict(runnable_blocks())
    assert 3 <= len(blocks) <= 8, sorted(blocks)
    commands = "\n".join(blocks.values())
    for command in ("python train.py", "python convert.py", "python bench.py"):
        assert command in commands


@pytest.mark.slow
@pytest.mark.parametrize("where,block", runnable_blocks(), ids=[where for where, _ in runnable_blocks()])
def test_a_runnable_block_of_the_manual_runs_as_written(where, block, tmp_path):
    simple_tree(tmp_path / "data" / "train", per_class=8)
    script = block.replace(DATA, f"{tmp_path}/data/")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python, feedline-index
        "PROJECT_ROOT": str(tmp_path),  # logs/ goes there, not into the checkout
        "FEEDLINE_CACHE_DIR": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{where}:\n{block}\n{output[-4000:]}"
    assert_quiet(output)

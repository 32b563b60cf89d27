"""feedline installs and imports as one package, and its import graph keeps the layers apart.

The layer rules (the manual's architecture page): readers (``datasets``) import no writer, datamodule or
Lightning, and their shared contract no source family; object storage (``storage``) imports no reader;
``transforms`` imports no source; nothing imports in a circle; and every internal import is spelled
``feedline.…``, never a bare ``datasets`` that would shadow (or be shadowed by) another project's package.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT_DIR
from tests.helpers import console_script

PACKAGES = (
    "callbacks",
    "cli",
    "conf",
    "datamodules",
    "datasets",
    "diagnostics",
    "models",
    "storage",
    "testing",
    "transforms",
    "writers",
)
ENTRY_MODULES = ("train", "convert", "bench", "public", "moved")
FAMILIES = tuple(
    f"feedline.datasets.{family}" for family in ("folder", "hdf5", "shards", "wds", "mix", "overlap")
)
CONTRACT = ("records", "arrays", "paths", "splits", "options", "cache")
# Layer -> what it must never import (prefixes of absolute module names).
FORBIDDEN = {
    "feedline.datasets": ("feedline.writers", "feedline.datamodules", "feedline.cli", "lightning", "torch"),
    # object storage serves readers and writers alike: it imports neither
    "feedline.storage": (
        "feedline.datasets",
        "feedline.writers",
        "feedline.datamodules",
        "feedline.cli",
        "torch",
    ),
    # the contract every source shares imports no family
    **{f"feedline.datasets.{name}": FAMILIES for name in CONTRACT},
    "feedline.datasets.__init__": FAMILIES,
    "feedline.transforms": ("feedline.datasets", "feedline.writers", "feedline.datamodules", "lightning"),
    "feedline.writers": ("feedline.datamodules", "lightning"),
    "feedline.datamodules.options": ("torch", "lightning", "numpy"),
    "feedline.writers.options": ("torch", "lightning", "numpy"),
    "feedline.conf": ("torch", "lightning", "numpy"),
    # the data layer without Lightning (ImageLoaders): only image.py, ImageDataModule, imports it
    **{
        f"feedline.datamodules.{name}": ("lightning",)
        for name in (
            "loaders",
            "samples",
            "split_dataset",
            "workers",
            "epoch",
            "knobs",
            "checkpoint",
            "bad_samples",
            "options",
        )
    },
}


def package_modules() -> dict[str, Path]:
    """Module name -> file, for every installed module of feedline."""
    modules = {f"feedline.{name}": ROOT_DIR / f"{name}.py" for name in ENTRY_MODULES}
    for package in PACKAGES:
        for path in sorted((ROOT_DIR / package).rglob("*.py")):
            dotted = ".".join(path.relative_to(ROOT_DIR).with_suffix("").parts)
            modules[f"feedline.{dotted}"] = path  # a package's own module as feedline.x.__init__
    return modules


def imports_of(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (lazy imports inside functions count too), but those for type
    checkers alone (``if TYPE_CHECKING:``), which never run."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_every_internal_import_is_spelled_feedline():
    ours = set(PACKAGES) | set(ENTRY_MODULES) | {"utils"}
    bare = [
        f"{path.relative_to(ROOT_DIR)}: import {name}"
        for path in package_modules().values()
        for name in imports_of(path)
        if name.split(".")[0] in ours
    ]
    assert not bare, "\n".join(bare)


def test_layers_import_only_what_they_may():
    broken = []
    for module, path in package_modules().items():
        for layer, forbidden in FORBIDDEN.items():
            if module == layer or module.startswith(layer + "."):
                broken += [f"{module} imports {n}" for n in imports_of(path) if n.startswith(forbidden)]
    assert not broken, "\n".join(broken)


def test_no_import_circles():
    modules = package_modules()
    graph = {m: {n for n in imports_of(p) if n in modules and n != m} for m, p in modules.items()}
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            cycle = stack[stack.index(module) :] + [module]
            pytest.fail("import circle: " + " -> ".join(cycle))
        if module in done:
            return
        for dependency in sorted(graph[module]):
            visit(dependency, [*stack, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.slow
def test_the_wheel_installs_feedline_and_nothing_else_top_level(feedline_wheel, tmp_path):
    wheel, site = feedline_wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "feedline",
        "hydra_plugins",
    }
    shipped_yaml = {n.removeprefix("feedline/") for n in names if n.endswith(".yaml")}
    assert shipped_yaml == {str(p.relative_to(ROOT_DIR)) for p in (ROOT_DIR / "conf").rglob("*.yaml")}
    assert "feedline/train.py" in names
    assert not [n for n in names if n.startswith(("feedline/tests/", "feedline/benchmarks/"))]
    accelerator = [n for n in names if n.startswith("feedline/transforms/_jpeg_window.")]
    headers = os.path.exists("/usr/include/jpeglib.h")  # where they are, pip builds the optional extension
    assert [n.rsplit(".", 1)[-1] for n in accelerator] == (["so"] if headers else []), accelerator

    probe = (
        "import feedline.datamodules.image as m, feedline.writers.derived\n"
        "from feedline.transforms.jpeg_window import available\n"
        "from hydra import compose, initialize_config_module\n"
        "with initialize_config_module('feedline.conf', version_base='1.3'):\n"
        "    cfg = compose('train', overrides=['source=folder', 'source.root=/x', 'data.batch_size=8'])\n"
        "print(m.__file__, cfg.data.batch_size, available())"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    where, batch_size, built = out.stdout.split()
    assert where.startswith(str(site)) and batch_size == "8" and built == str(headers)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "args", "printed"),
    [
        ("feedline-train", ["--cfg", "job"], "_target_: feedline.datamodules.ImageDataModule"),
        ("feedline-bench", ["--cfg", "job"], "sample_items:"),
        ("feedline-convert", ["out.path=/tmp/x.h5", "--cfg", "job"], "path: /tmp/x.h5"),
    ],
)
def test_console_scripts_run_from_anywhere(tmp_path, command, args, printed):
    out = subprocess.run(
        [console_script(command), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and printed in out.stdout, out.stderr[-3000:]

"""The manual's "Use feedline in your own project" (docs/own-project.md), run as written: its files, verbatim,
make a project of their own outside the checkout, with feedline installed from a wheel, which trains, tests
and runs the plain PyTorch loop, once with collate=uint8 and once with collate=default, and predicts to a CSV."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT_DIR
from tests.helpers import finish, running_beside, simple_tree
from tests.test_quiet import assert_quiet

SNIPPET = re.compile(r"<!-- project file: (\S+) -->\n```\w+[^\n]*\n(.*?)\n```", re.S)  # ```python title="..."
FILES = {"conf/config.yaml", "model.py", "train.py", "predict.py", "loop.py"}
PAGE = ROOT_DIR / "docs" / "own-project.md"


def readme_project(directory: Path) -> Path:
    files = dict(SNIPPET.findall(PAGE.read_text(encoding="utf-8")))
    assert set(files) == FILES, f"{PAGE.relative_to(ROOT_DIR)} project files: {sorted(files)}"
    for rel, text in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_text(text + "\n", encoding="utf-8")
    return directory


def test_the_readme_shows_every_file_of_the_project(tmp_path):
    project = readme_project(tmp_path)
    config = (project / "conf" / "config.yaml").read_text()
    assert (
        "defaults: [{source: folder}, {transforms: imagenet}, {collate: uint8}, {data: default}, _self_]"
        in config
    )
    assert "hydra: {searchpath: [pkg://feedline.conf]}" in config


@pytest.mark.slow
@pytest.mark.parametrize("collate", ["uint8", "default"])
def test_the_readme_project_trains_tests_and_predicts_with_feedline_from_a_wheel(
    collate, feedline_wheel, tmp_path
):
    _, site = feedline_wheel
    project = readme_project(tmp_path / "project")
    tree = simple_tree(tmp_path / "tree", per_class=6)
    incoming = Path(simple_tree(tmp_path / "incoming", classes=("x", "y"), per_class=2))
    shutil.copy(incoming / "x" / "000.png", incoming / "top.png")
    env = {**os.environ, "PYTHONPATH": str(site), "FEEDLINE_CACHE_DIR": str(tmp_path / "cache")}

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def succeeded(out: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
        assert out.returncode == 0, f"{out.args[1:]}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
        assert_quiet(out.stdout + out.stderr)
        return out

    def run(*args: str) -> subprocess.CompletedProcess:
        return succeeded(finish(start(*args)))

    where = run("-c", "import feedline.datasets as m; print(m.__file__)").stdout.strip()
    assert where.startswith(str(site)), where  # the wheel's feedline, not the checkout's

    data = [
        f"source.root={tree}",
        f"collate={collate}",
        "data.batch_size=4",
        "data.num_workers=1",
        "epochs=1",
    ]
    trained = run("train.py", *data, "source.test_fraction=0.34")
    assert "test/acc" in trained.stdout
    assert "infer the batch size" not in trained.stderr and "ambiguous collection" not in trained.stderr
    assert (project / "model.ckpt").is_file()

    if collate == "default":  # what depends on the collate is trained and looped; predict is the same code
        assert "epoch 0: loss" in run("loop.py", *data).stdout
        return
    with running_beside(start("loop.py", *data)) as loop:  # the loop writes nothing predict.py reads
        run("predict.py", "model.ckpt", str(incoming), "predictions.csv")
        looped = succeeded(loop())
    with open(project / "predictions.csv", newline="") as f:
        rows = list(csv.reader(f))
    expected = sorted(str(p) for p in incoming.rglob("*.png"))
    assert rows[0] == ["path", "class"] and [r[0] for r in rows[1:]] == expected
    assert {r[1] for r in rows[1:]} <= {"cat", "dog", "eel"}
    assert "epoch 0: loss" in looped.stdout


@pytest.mark.slow
def test_the_readme_project_without_a_test_split_fails_before_training(feedline_wheel, tmp_path):
    _, site = feedline_wheel
    project = readme_project(tmp_path / "project")
    tree = simple_tree(tmp_path / "tree", per_class=6)
    env = {**os.environ, "PYTHONPATH": str(site), "FEEDLINE_CACHE_DIR": str(tmp_path / "cache")}
    args = [sys.executable, "train.py", f"source.root={tree}", "data.num_workers=0", "epochs=1"]
    out = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1
    assert "has no test split: set source.test_root" in out.stderr
    assert "Epoch" not in out.stdout + out.stderr  # no training was thrown away: none started


@pytest.mark.slow
def test_a_wrong_key_in_the_project_is_one_short_message(tmp_path):
    project = readme_project(tmp_path / "project")
    env = {**os.environ, "FEEDLINE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HYDRA_FULL_ERROR", None)
    args = [sys.executable, "train.py", "source.root=/x", "data.batchsize=8"]
    out = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "full_key: data.batchsize" in out.stderr and "Traceback" not in out.stderr
    full = subprocess.run(
        args, cwd=project, env={**env, "HYDRA_FULL_ERROR": "1"}, capture_output=True, text=True, timeout=300
    )
    assert full.returncode == 1 and "Traceback" in full.stderr

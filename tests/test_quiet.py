"""A run prints feedline's lines, Lightning's progress and the summary: no notice a user cannot act on."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT_DIR
from tests.helpers import image_bytes, simple_tree

# Python warnings of any kind, and each notice a run used to print that says nothing a user can act on.
NOISE = re.compile(
    r"Warning:|💡|litlogger|litmodels|Total FLOPs: 0\b|LeafSpec|weights_only|tensorboardX|logging interval"
    r"|BytesIO| at 0x[0-9a-f]+|\.cpp:\d+"
)


def assert_quiet(output: str) -> None:
    noise = [line for line in output.splitlines() if NOISE.search(line)]
    assert not noise, "noise in the run's output:\n" + "\n".join(noise)


def run_train(tmp_path, *overrides: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            *overrides,
            f"paths.cache_dir={tmp_path / 'cache'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=ROOT_DIR,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "default"},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


@pytest.mark.slow
def test_the_default_training_run_is_quiet(tmp_path):
    output = run_train(tmp_path, "trainer.max_epochs=1", "+trainer.limit_train_batches=5")  # make train's run
    assert_quiet(output)
    assert "summary: val_acc=" in output and "files skipped: 0" in output


@pytest.mark.slow
def test_a_bad_file_is_one_line_and_the_summary_counts_it(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=8)
    (tmp_path / "tree" / "cat" / "broken.jpg").write_bytes(image_bytes(".jpg")[:60])  # a truncated JPEG
    output = run_train(
        tmp_path,
        "source=folder",
        f"source.root={tree}",
        "transforms=digits",
        "trainer.max_epochs=2",
        "trainer.accelerator=cpu",
        "data.batch_size=4",
        "data.num_workers=1",
    )
    assert_quiet(output)
    bad = [line for line in output.splitlines() if "broken.jpg" in line and "skipping" in line]
    assert len(bad) == 1 and "a corrupt or truncated JPEG file" in bad[0], bad  # one line: the path, in words
    assert "files skipped: 1" in output  # the summary counts it

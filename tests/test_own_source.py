"""A user's own source gets every guarantee: ``feedline.testing.check_source`` passes the manual's source and
names each broken contract; a source's ``BadInput`` is skipped and named, any other error stops the run; the
command line refuses ``source._target_=`` with keys the class does not take, and takes the user's
``conf/source/mine.yaml`` from their config dir."""

from __future__ import annotations

import logging
import os
import re
import sys

import numpy as np
import pytest

from feedline.cli.instantiate import instantiate
from feedline.datamodules import ImageLoaders
from feedline.datamodules.bad_samples import BadSampleError
from feedline.datasets import BadInput, Source
from feedline.testing import ContractError, check_source
from tests.conftest import ROOT_DIR

PAGE = ROOT_DIR / "docs" / "own-source.md"
HEREDOC = re.compile(r"cat > (\S+) <<'EOF'\n(.*?)\nEOF\n", re.S)
PROJECT_FILE = re.compile(r"<!-- project file: (\S+) -->\n```\w+[^\n]*\n(.*?)\n```", re.S)
built: list[str] = []


class Tiles(Source):
    """A user's source: ``count`` 8x8 tiles whose pixels are their row; ``bad`` rows raise ``error`` when read;
    ``broken`` breaks one rule of the contract."""

    classes = ["even", "odd"]

    def __init__(self, count=24, val_fraction=0.25, seed=0, bad=(), error="bad", broken=None):
        built.append("Tiles")
        self.count, self.val_fraction, self.seed = count, val_fraction, seed
        self.bad, self.error, self.broken = tuple(bad), error, broken
        self.rows = np.random.default_rng(None if broken == "unseeded" else seed).permutation(count)

    def prepare(self) -> None:
        pass

    def split(self, name: str):
        rows = self.rows
        held = round(self.count * self.val_fraction)
        if name not in ("train", "val"):
            raise ValueError(f"Tiles has no {name} split")
        if name == "val":
            return TileRecords(rows[:held], self.bad, self.error, self.broken)
        rows = rows if self.broken == "overlap" else rows[held:]  # train
        return TileRecords(rows, self.bad, self.error, self.broken)


class TileRecords:
    def __init__(self, rows, bad, error, broken):
        self.rows, self.bad, self.error, self.broken = rows, bad, error, broken
        self.names = [f"tile {n}" for n in range(20_000)] if broken == "pickle" else None  # a list per sample

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = int(self.rows[i])
        if row in self.bad:
            raise (
                BadInput(f"tile {row}: column 'shade' is not a number")
                if self.error == "bad"
                else RuntimeError(f"tile {row}: a bug in the reader")
            )
        shade = os.getpid() % 256 if self.broken == "worker" else row  # a worker would read another tile
        label = 2 if self.broken == "label" else row % 2
        return np.full((3, 8, 8), shade, np.uint8), label

    def describe(self, i: int) -> str:
        return "tile" if self.broken == "names" else f"tile {int(self.rows[i])}"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The manual's project, written from the page: squares.py and its config files; squares importable."""
    text = PAGE.read_text(encoding="utf-8")
    files = {**dict(HEREDOC.findall(text)), **dict(PROJECT_FILE.findall(text))}
    assert set(files) == {"squares.py", "conf/source/mine.yaml", "conf/transforms/for_source/mine.yaml"}
    for name, body in files.items():
        path = tmp_path / "project" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body + "\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    sys.modules.pop("squares", None)
    yield tmp_path / "project"
    sys.modules.pop("squares", None)


def test_the_manuals_source_keeps_the_contract_and_a_users_source_too(project):
    from squares import Squares

    check_source(Squares())
    check_source(Tiles())


@pytest.mark.parametrize(
    "broken, said",
    [
        ("pickle", r'split\("train"\) pickled: \d+ bytes, over 65536'),
        ("worker", r"a DataLoader worker reads sample \d+ otherwise than the main process"),
        ("overlap", r"splits: 6 sample\(s\) are in both train and val: tile"),
        ("unseeded", r'split\("train"\): differs when drawn again with the same arguments'),
        ("names", r"samples 0 and 1 are both named 'tile'"),
        ("label", r"label 2 is not an int in range\(len\(classes\)\) = range\(2\)"),
    ],
)
def test_check_source_names_the_contract_a_source_breaks(broken, said):
    with pytest.raises(ContractError, match=said):
        check_source(Tiles(broken=broken))


def test_a_users_bad_input_is_skipped_and_named_and_any_other_error_stops_the_run(caplog):
    bad = int(Tiles().split("train").rows[3])

    def loader(error, policy):
        source = Tiles(bad=[bad], error=error)
        return ImageLoaders(
            source, batch_size=6, num_workers=0, seed=1, on_bad_sample=policy
        ).train_dataloader()

    with caplog.at_level(logging.WARNING):
        labels = [label for batch in loader("bad", "skip") for label in batch.label.tolist()]
    assert len(labels) == 18 and f"skipping bad sample tile {bad}: tile {bad}: column 'shade'" in caplog.text
    with pytest.raises(BadSampleError, match=rf"bad sample tile {bad}: .*data\.on_bad_sample=skip"):
        list(loader("bad", "raise"))
    with pytest.raises(RuntimeError, match="a bug in the reader") as raised:
        list(loader("bug", "skip"))
    assert not isinstance(raised.value, BadSampleError)


def test_source_target_on_the_command_line_is_refused_naming_the_keys_and_the_fix(make_cfg):
    cfg = make_cfg(f"source._target_={__name__}.Tiles")
    built.clear()
    with pytest.raises(ValueError) as refused:
        instantiate(cfg.data, "data")
    said = str(refused.value)
    assert said.startswith(
        f"source._target_={__name__}.Tiles does not take root, val_root, test_root, test_fraction, extensions, "
        "cache_dir, refresh, scan_workers (it takes count, val_fraction, seed, bad, error, broken)"
    )
    assert "conf/source/mine.yaml" in said and "--config-dir conf source=mine" in said
    assert built == []  # refused before the class was called


def test_a_users_source_config_in_their_config_dir_builds_their_source(project, make_cfg):
    cfg = make_cfg(f"hydra.searchpath=[file://{project}/conf]", "source=mine", "source.count=24")
    dm = instantiate(cfg.data, "data")
    assert type(dm.source).__name__ == "Squares" and dm.source.count == 24
    assert dm.transforms.train is None  # the project's for_source/mine.yaml: the `none` stack
    batch = next(iter(dm.train_dataloader()))
    assert tuple(batch.image.shape[1:]) == (3, 16, 16) and len(dm.datasets["train"]) == 18


def test_convert_refuses_source_target_with_the_keys_it_does_not_take_too(make_cfg, tmp_path):
    from feedline.convert import run_convert

    cfg = make_cfg(
        "source=folder",
        "source.root=/x",
        f"source._target_={__name__}.Tiles",
        f"out.path={tmp_path / 'out.h5'}",
        config="convert",
    )
    with pytest.raises(
        ValueError, match=rf"^source\._target_={__name__}\.Tiles does not take root, val_root, .*source=mine"
    ):
        run_convert(cfg)


def test_a_users_source_without_a_transform_stack_is_told_to_pick_one(make_cfg, tmp_path):
    from feedline.cli.instantiate import require

    (tmp_path / "conf" / "source").mkdir(parents=True)
    (tmp_path / "conf" / "source" / "bare.yaml").write_text(
        "_target_: feedline.datasets.DigitsSource\nroot: /x\n"
    )
    cfg = make_cfg(f"hydra.searchpath=[file://{tmp_path}/conf]", "source=bare")
    with pytest.raises(
        ValueError, match=r"no transform stack is chosen for source=bare .*transforms=imagenet"
    ):
        require(cfg, "source", "model")
    require(
        make_cfg(f"hydra.searchpath=[file://{tmp_path}/conf]", "source=bare", "transforms=none"), "source"
    )

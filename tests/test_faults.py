"""Faults around the data rather than in it: full disks, killed builds and conversions, bad loader knobs."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

import feedline.datasets.index as index_module
from feedline.datasets.cache import temporary_prefix
from feedline.datasets.index import index_dir, open_index
from tests.helpers import make_tree, simple_tree


def test_a_full_disk_names_the_cache_directory_and_how_to_move_it(tmp_path, monkeypatch):
    root = simple_tree(tmp_path / "t")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index_module.np, "save", full)
    with pytest.raises(
        OSError, match=r"cache directory .*folder-index is full .*paths\.cache_dir=.*FEEDLINE_CACHE_DIR"
    ):
        open_index(root, cache_dir=tmp_path / "cache")


def test_a_full_disk_under_a_split_cache_says_the_same(tmp_path, monkeypatch):
    from feedline.datasets import cache
    from feedline.datasets.folder import FolderSource

    source = FolderSource(simple_tree(tmp_path / "t"), cache_dir=tmp_path / "cache")
    source.prepare()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.np, "save", full)
    with pytest.raises(OSError, match=r"is full .*FEEDLINE_CACHE_DIR"):
        source.split("val")
    assert not [p for p in (tmp_path / "cache").rglob(".split*")]  # no temporary left behind


def test_temporaries_of_a_killed_build_are_removed_by_the_next(tmp_path):
    root = make_tree(tmp_path / "t", {"a": ["1.png"], "b": ["2.png"]})
    dest = index_dir(root, index_module.IMG_EXTENSIONS, tmp_path / "cache")
    dest.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = dest.parent / temporary_prefix(dest.name).replace(f"-{os.getpid()}-", f"-{dead.pid}-")
    stale = stale.with_name(stale.name + "abc")
    (stale).mkdir()
    (stale / "paths.npy").write_bytes(b"half")
    live = dest.parent / (temporary_prefix(dest.name) + "xyz")  # this process: a build still running
    live.mkdir()
    open_index(root, cache_dir=tmp_path / "cache")
    assert not stale.exists() and live.exists()


@pytest.mark.slow
def test_conversion_workers_exit_when_the_converter_is_killed(tmp_path):
    psutil = pytest.importorskip("psutil")
    script = f"""
import os, time
from feedline.writers.hdf5 import convert
from feedline.writers.options import HDF5WriteOptions

class Slow:
    def __len__(self): return 10_000
    def __getitem__(self, i):
        time.sleep(0.05)
        raise OSError("unreadable")
    def describe(self, i): return str(i)

print(os.getpid(), flush=True)
convert(Slow(), ["a"], HDF5WriteOptions(path={str(tmp_path / "out.h5")!r}, workers=2, chunk=4))
"""
    main = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    parent = psutil.Process(int(main.stdout.readline()))
    deadline = time.time() + 60
    while len(parent.children()) < 2 and time.time() < deadline:
        time.sleep(0.1)
    workers = parent.children()
    assert len(workers) >= 2
    os.kill(parent.pid, signal.SIGKILL)
    main.wait()
    gone, alive = psutil.wait_procs(workers, timeout=15)
    for proc in alive:
        proc.kill()
    assert not alive, f"{len(alive)} conversion worker(s) outlived their parent"


def test_prefetch_factor_zero_names_the_key(make_cfg, tree):
    from feedline.cli.instantiate import instantiate

    cfg = make_cfg("source=folder", f"source.root={tree}", "data.prefetch_factor=0")
    with pytest.raises(ValueError, match=r"data\.prefetch_factor=0 must be an integer >= 1"):
        instantiate(cfg.data, "data")


def test_a_batch_larger_than_the_split_with_drop_last_fails_naming_both(make_cfg, tree):
    from feedline.train import train

    cfg = make_cfg(
        "source=folder",
        f"source.root={tree}",
        "source.val_fraction=0",
        "data.batch_size=64",
        "data.drop_last=true",
        "data.num_workers=0",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
    )
    with pytest.raises(
        ValueError, match=r"data\.batch_size=64 is larger than the 18 training sample.*zero steps"
    ):
        train(cfg)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.max_epochs=abc", r"trainer\.max_epochs='abc' must be an integer >= -1"),
        ("trainer.devices=zero", r"trainer\.devices='zero' must be a count"),
        ("+trainer.precision=17", r"trainer\.precision=17 must be one of"),
        ("trainer.limit_train_batches=1.5", r"trainer\.limit_train_batches=1\.5 must be"),
    ],
)
def test_common_trainer_keys_are_checked_before_any_work(make_cfg, tree, override, message, monkeypatch):
    import feedline.train as train_module

    monkeypatch.setattr(train_module, "instantiate", lambda *a, **k: pytest.fail("work started"))
    cfg = make_cfg("source=folder", f"source.root={tree}", override)
    with pytest.raises(ValueError, match=message):
        train_module.train(cfg)


def test_a_val_share_that_would_empty_every_class_leaves_each_a_training_sample_and_says_so(
    make_cfg, tmp_path, caplog
):
    from feedline.cli.instantiate import instantiate

    root = make_tree(tmp_path / "t", {"a": ["1.png"], "b": ["2.png"]})
    cfg = make_cfg("source=folder", f"source.root={root}", "source.val_fraction=0.9")
    dm = instantiate(cfg.data, "data")
    dm.prepare_data()
    with caplog.at_level("WARNING"):
        dm.setup("fit")
    assert len(dm.datasets["train"]) == 2 and len(dm.datasets["val"]) == 0
    assert "every sample of 2 class(es) (samples in brackets): 'a' (1), 'b' (1)" in caplog.text
    assert "the val split is empty: source.val_fraction=0.9 holds out no sample" in caplog.text


@pytest.mark.parametrize(
    ("entry", "overrides", "key"),
    [
        ("train", ["source=folder"], "source.root"),
        ("train", ["source=hdf5"], "source.path"),
        ("convert", [], "out.path"),
    ],
)
def test_a_required_key_left_unset_is_named_by_its_full_key(make_cfg, entry, overrides, key):
    from feedline.convert import run_convert
    from feedline.train import train

    cfg = make_cfg(*overrides, config=entry)
    with pytest.raises(ValueError, match=rf"^{key} must be set: add {key}=\.\.\."):
        (train if entry == "train" else run_convert)(cfg)


@pytest.mark.slow
def test_the_commands_print_an_error_that_names_its_key_alone(tmp_path):
    """No traceback above the message that says what to fix; HYDRA_FULL_ERROR=1 brings it back."""
    from tests.helpers import console_script

    args = [console_script("feedline-train"), "source=folder", f"source.root={tmp_path / 'nowhere'}"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["FEEDLINE_CACHE_DIR"] = str(tmp_path / "cache")
    short = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert short.returncode == 1 and "Traceback" not in short.stderr
    assert f"Error: source.root '{tmp_path / 'nowhere'}' does not exist" in short.stderr
    full = subprocess.run(
        args, cwd=tmp_path, env={**env, "HYDRA_FULL_ERROR": "1"}, capture_output=True, text=True, timeout=300
    )
    assert full.returncode == 1 and "Traceback" in full.stderr


@pytest.mark.parametrize(
    "message, short",
    [
        (
            "out.size=16 centre-crops raw squares: set out.mode=raw, or use out.max_side",
            True,
        ),  # convert.py's keys
        ("bench.batches must be >= 1", True),
        ("something went wrong inside torch", False),  # names no key: the traceback is the story
    ],
)
def test_errors_naming_any_commands_key_print_alone(monkeypatch, capsys, message, short):
    from feedline.cli.instantiate import short_errors

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit if short else ValueError), short_errors():
        raise ValueError(message)
    assert (f"Error: {message}" in capsys.readouterr().err) is short

from __future__ import annotations

import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from tests.helpers import simple_tree

ROOT_DIR = Path(__file__).resolve().parents[1]
CONF = ROOT_DIR / "conf"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))


_ITERATORS: weakref.WeakSet = weakref.WeakSet()
_start_iterator = _MultiProcessingDataLoaderIter.__init__


def _tracked_start(self, *args, **kwargs):
    _ITERATORS.add(self)
    _start_iterator(self, *args, **kwargs)


_MultiProcessingDataLoaderIter.__init__ = _tracked_start


@pytest.fixture(autouse=True)
def _workers_stopped_after_each_test():
    """The worker processes a test left running (an iterator it stopped reading mid-epoch) are stopped when it
    ends. Left to the garbage collector, torch stops them from inside a later collection, where its message to
    persistent workers is not sent: each waits out its join timeout, 5 s per worker, in another test."""
    yield
    for iterator in list(_ITERATORS):
        if not getattr(iterator, "_shutdown", True):
            iterator._shutdown_workers()


@pytest.fixture
def tree(tmp_path) -> str:
    return simple_tree(tmp_path / "tree")


@pytest.fixture
def make_cfg(tmp_path):
    """Compose ``conf/train.yaml`` with overrides, as ``python train.py ...`` would, outputs in tmp_path."""

    def _make(*overrides: str, config: str = "train"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(
                config,
                overrides=[
                    f"paths.output_dir={tmp_path / 'out'}",
                    f"paths.cache_dir={tmp_path / 'cache'}",
                    *overrides,
                ],
                return_hydra_config=True,
            )
        HydraConfig().set_config(cfg)
        return cfg

    yield _make
    GlobalHydra.instance().clear()


@pytest.fixture
def fake_clock(monkeypatch):
    """Only the stages made slow on purpose take (fake) time (``tests/sleepy.py``): bench's measurements,
    shares and verdicts do not depend on the machine's load."""
    import feedline.diagnostics.loader_bench as loader_bench
    from tests.sleepy import CLOCK

    monkeypatch.setattr(loader_bench, "clock", CLOCK)
    return CLOCK


FAST = ["trainer.fast_dev_run=true", "trainer.accelerator=cpu", "data.num_workers=0", "data.batch_size=4"]


UNSHIPPED = (
    "*.so",  # the checkout's in-place build of the C extension: the wheel builds its own
    ".git",
    ".venv",
    "build",
    "logs",
    ".data",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
)


@pytest.fixture(scope="session")
def feedline_wheel(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel built from this checkout, a directory it is installed into with ``--target``): put that
    directory on PYTHONPATH to run against the installed package rather than the checkout. Built from a
    copy: setuptools leaves build/ behind in the tree it builds, and a checkout's own build/ (from an
    earlier build) could hold modules that no longer exist."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    shutil.copytree(ROOT_DIR, source, ignore=shutil.ignore_patterns(*UNSHIPPED))
    pip = [sys.executable, "-m", "pip"]
    wheels = base / "wheels"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, source],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("feedline-*.whl")
    site = base / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "-q", "--target", site, wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return wheel, site


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS S3 server for the session (``tests/s3_server.py``), stopped by its process id at the end."""
    from tests.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()

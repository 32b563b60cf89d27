"""Faults around the data rather than in it: full disks, killed builds and conversions, bad loader knobs."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import feedline.datasets.folder.index as index_module
from feedline.datasets.cache import temporary_prefix
from feedline.datasets.folder.index import index_dir, open_index
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
    from feedline.datasets.folder.source import FolderSource

    tree = simple_tree(tmp_path / "t")
    FolderSource(tree, cache_dir=tmp_path / "cache").prepare()  # the index, and the split of seed 42
    source = FolderSource(tree, cache_dir=tmp_path / "cache", seed=1)  # a split not drawn yet

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.np, "save", full)
    with pytest.raises(OSError, match=r"is full .*FEEDLINE_CACHE_DIR"):
        source.split("val")
    assert not [p for p in (tmp_path / "cache").rglob(".split*")]  # no temporary left behind


def test_temporaries_of_a_killed_build_are_removed_by_the_next(tmp_path):
    root = make_tree(tmp_path / "t", {"a": ["1.png"], "b": ["2.png"]})
    dest = index_dir(root, index_module.IMG_EXTENSIONS, tmp_path / "cache")
    dest.parent.mkdir(parents=True, exist_ok=True)  # index_dir makes it (mode 0o700)
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


# -- a file replaced or written while a run reads it ------------------------------------------------
def _converted(tmp_path, out, per_class, mode="encoded"):
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.hdf5 import convert_source
    from feedline.writers.options import HDF5WriteOptions

    tree = make_tree(
        tmp_path / f"t{per_class}", {c: [f"{i}.png" for i in range(per_class)] for c in ("a", "b")}
    )
    options = HDF5WriteOptions(path=str(out), mode=mode, max_side=8 if mode == "raw" else None, workers=1)
    return convert_source(FolderSource(tree, val_fraction=0, cache_dir=tmp_path / "cache"), options)


@pytest.mark.parametrize("mode", ["encoded", "raw"])
def test_a_file_replaced_while_a_run_reads_it_stops_the_run_naming_it(tmp_path, mode):
    """convert.py renames its new file over the old: a process that opens the file after that (a new
    epoch's workers, trainer.test after fit) stops, naming the file, rather than read the new file's rows
    under the labels and offsets of the old one. A process that had it open reads the old file whole."""
    import pickle

    from feedline.datasets.hdf5.files import HDF5FileError
    from feedline.datasets.hdf5.source import HDF5Source

    out = tmp_path / "out.h5"
    _converted(tmp_path, out, 3, mode)
    source = HDF5Source(out, val_fraction=0, cache_dir=tmp_path / "cache")
    source.prepare()
    records = source.split("train")
    before = [(bytes(np.asarray(p)), label) for p, label in (records[i] for i in range(len(records)))]
    _converted(tmp_path, out, 5, mode)  # another conversion to the same out.path, 10 images now
    assert [(bytes(np.asarray(p)), label) for p, label in (records[i] for i in range(6))] == before
    worker = pickle.loads(pickle.dumps(records))  # what a DataLoader worker opens
    with pytest.raises(HDF5FileError, match=r"source\.path '.*out\.h5' was replaced .*Restart the run"):
        worker[0]
    with pytest.raises(HDF5FileError, match=r"source\.path '.*out\.h5' was replaced"):
        source.split("train")


def test_workers_of_a_new_epoch_stop_on_a_replaced_file(tmp_path):
    import torch

    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.hdf5.files import HDF5FileError
    from feedline.datasets.hdf5.source import HDF5Source
    from feedline.transforms.collate import Uint8Collate

    out = tmp_path / "out.h5"
    _converted(tmp_path, out, 3)
    records = HDF5Source(out, val_fraction=0, cache_dir=tmp_path / "cache").split("train")
    loader = torch.utils.data.DataLoader(
        SampleDataset(records),
        batch_size=2,
        num_workers=1,
        collate_fn=Uint8Collate(),
        persistent_workers=False,
    )
    assert sum(len(batch.label) for batch in loader) == 6
    _converted(tmp_path, out, 5)
    with pytest.raises(HDF5FileError, match=r"out\.h5' was replaced"):
        list(loader)


def test_a_file_locked_by_its_writer_is_named_as_such(tmp_path):
    import h5py

    from feedline.datasets.hdf5.files import HDF5FileError
    from feedline.datasets.hdf5.source import HDF5Source

    path = tmp_path / "foreign.h5"
    with h5py.File(path, "w") as f:
        f["images"], f["labels"] = np.zeros((2, 4, 4, 3), np.uint8), np.zeros(2, np.int64)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import h5py, time; f = h5py.File({str(path)!r}, 'a'); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        writer.stdout.readline()
        with pytest.raises(
            HDF5FileError, match=r"foreign\.h5' is locked: another program has it open for writing"
        ) as err:
            HDF5Source(path)
        assert "convert.py" not in str(err.value) and "HDF5_USE_FILE_LOCKING" in str(err.value)
    finally:
        writer.kill()
        writer.wait()


# -- two writers of one output ----------------------------------------------------------------------
def test_a_second_conversion_to_the_same_path_is_refused_and_leaves_the_first_whole(tmp_path):
    """The second run refuses before it touches anything, naming the first; the first finishes."""
    from feedline.datasets.hdf5.source import HDF5Source
    from feedline.transforms.decode import decode
    from feedline.writers.hdf5 import convert
    from feedline.writers.lock import OutputBusyError
    from feedline.writers.options import HDF5WriteOptions

    tree = simple_tree(tmp_path / "t", classes=("a", "b"), per_class=4)
    out, hold = tmp_path / "out.h5", tmp_path / "hold"
    hold.touch()  # the first conversion reads nothing while this file exists: it is mid-write, whatever the load
    script = f"""
import os, time
from feedline.datasets.folder.source import FolderSource
from feedline.writers.hdf5 import convert_source
from feedline.writers.options import HDF5WriteOptions

class Slow(FolderSource):
    def split(self, name):
        return SlowRecords(super().split(name))

class SlowRecords:
    def __init__(self, inner): self.inner = inner
    def __len__(self): return len(self.inner)
    def __getitem__(self, i):
        deadline = time.time() + 120
        while os.path.exists({str(hold)!r}) and time.time() < deadline:
            time.sleep(0.05)
        return self.inner[i]
    def describe(self, i): return self.inner.describe(i)

source = Slow({tree!r}, val_fraction=0, cache_dir={str(tmp_path / "cache")!r})
convert_source(source, HDF5WriteOptions(path={str(out)!r}, workers=1, chunk=1))
"""
    first = subprocess.Popen([sys.executable, "-c", script])
    spool, partial = tmp_path / "out.h5.partial.spool", tmp_path / "out.h5.partial"
    deadline = time.time() + 60
    while not (spool.exists() and partial.exists()) and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(OutputBusyError, match=rf"another conversion is writing .*out\.h5 \(pid {first.pid} "):
        convert([], ["a"], HDF5WriteOptions(path=str(out), workers=1))
    assert partial.exists() and spool.exists()
    hold.unlink()
    assert first.wait(60) == 0
    records = HDF5Source(out, val_fraction=0).split("train")
    assert [records[i][1] for i in range(8)] == [0] * 4 + [1] * 4
    assert all(decode(records[i][0]).shape == (3, 10, 12) for i in range(8))  # every row whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "out.h5", "t"]  # no lock or scratch left


def test_a_lock_left_by_a_killed_conversion_is_taken_over(tmp_path):
    from feedline.writers.hdf5 import convert
    from feedline.writers.options import HDF5WriteOptions

    (tmp_path / "out.h5.lock").write_text('{"pid": 999999999, "host": "gone", "since": "yesterday"}')
    assert convert([], ["a"], HDF5WriteOptions(path=str(tmp_path / "out.h5"), workers=1))["images"] == 0
    assert not (tmp_path / "out.h5.lock").exists()


def test_a_second_layout_into_the_same_dst_is_refused_before_it_touches_it(tmp_path):
    from feedline.writers.lazy_layout import layout
    from feedline.writers.lock import OutputBusyError, writer_lock

    src, dst = simple_tree(tmp_path / "src"), tmp_path / "dst"
    with writer_lock(str(dst), "layout", "DST"):  # another process's layout, as far as flock can tell
        with pytest.raises(OutputBusyError, match=rf"another layout is writing .*dst \(pid {os.getpid()} "):
            layout(src, str(dst))
        assert not dst.exists()
    assert "laid out 18 files" in layout(src, str(dst))


def test_a_source_converted_on_first_use_waits_for_another_node_converting_it(tmp_path, monkeypatch):
    """prepare() on several nodes at once: one converts, the others wait and read its file."""
    import threading

    import feedline.writers.hdf5 as hdf5_write
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.derived import ConvertedHDF5Source
    from feedline.writers.lock import writer_lock
    from feedline.writers.options import HDF5WriteOptions

    origin = FolderSource(simple_tree(tmp_path / "t"), val_fraction=0)
    path = tmp_path / "made.h5"
    held, conversions, convert_source = threading.Event(), [], hdf5_write.convert_source

    def other_node():
        with writer_lock(str(path), "conversion", "source.path"):
            held.set()
            time.sleep(0.5)
            convert_source(origin, HDF5WriteOptions(path=str(path), workers=1), lock=False)

    thread = threading.Thread(target=other_node)
    thread.start()
    held.wait(30)
    monkeypatch.setattr(hdf5_write, "convert_source", lambda *a, **k: conversions.append(a))
    source = ConvertedHDF5Source(path, origin, convert_options={"workers": 1}, val_fraction=0)
    source.prepare()
    thread.join()
    assert conversions == [] and len(source.split("train")) == 18


def test_prefetch_factor_zero_names_the_key(make_cfg, tree):
    from feedline.cli.instantiate import instantiate

    cfg = make_cfg("source=folder", f"source.root={tree}", "data.prefetch_factor=0")
    with pytest.raises(ValueError, match=r"data\.prefetch_factor=0 must be an integer >= 1"):
        instantiate(cfg.data, "data")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.batch_size=0", r"data\.batch_size=0 must be an integer >= 1"),
        ("data.batch_size=-1", r"data\.batch_size=-1 must be an integer >= 1"),
        ("data.global_batch_size=0", r"data\.global_batch_size=0 must be an integer >= 1"),
        ("data.global_batch_size=-8", r"data\.global_batch_size=-8 must be an integer >= 1"),
        ("data.num_workers=-1", r"data\.num_workers=-1 must be an integer >= 0"),
        ("data.num_workers=2.5", r"data\.num_workers=2\.5 must be an integer >= 0"),
        ("data.num_workers=100000", r"data\.num_workers=100000 starts that many processes per device"),
        (
            "data.prefetch_factor=1000000",
            r"data\.prefetch_factor=1000000 must be an integer >= 1 and at most 64",
        ),
        ("data.max_bad_fraction=-0.1", r"data\.max_bad_fraction=-0\.1 must be in \[0, 1\]"),
        ("data.max_bad_fraction=1e9", r"data\.max_bad_fraction=1000000000\.0 must be in \[0, 1\]"),
        ("data.max_pixels=-1", r"data\.max_pixels=-1 must be null \(PIL's limit\), 0 \(no limit\) or"),
        ("data.seed=-1", r"data\.seed=-1 must be an integer from 0 to 2\*\*32-1"),
        ("data.seed=4294967296", r"data\.seed=4294967296 must be an integer from 0 to 2\*\*32-1"),
        (
            "data.multiprocessing_context=bogus",
            r"data\.multiprocessing_context='bogus' is not one of: .*fork",
        ),
    ],
)
def test_extreme_data_values_are_refused_by_key_before_any_work(make_cfg, tmp_path, override, message):
    from feedline.cli.instantiate import instantiate

    tree = simple_tree(tmp_path / "tree")
    cfg = make_cfg("source=folder", f"source.root={tree}", override)
    with pytest.raises(ValueError, match=message):
        instantiate(cfg.data, "data")
    assert not (tmp_path / "cache").exists()  # nothing was scanned or cached


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


def _refused_by_the_store():
    from feedline.storage.stores import StoreError

    raise StoreError(
        "s3://bucket/p/index.json: http://x refused the credentials (403): set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or this source's own source.storage_options.aws_access_key_id"
    )


def test_an_object_store_error_inside_a_nested_target_prints_alone(monkeypatch, capsys):
    """A StoreError raised while building data -> source is the whole story: not a repr of nested
    InstantiationExceptions with escaped quotes."""
    from omegaconf import OmegaConf

    from feedline.cli.instantiate import instantiate, short_errors
    from feedline.storage.stores import StoreError

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    cfg = OmegaConf.create(
        {"_target_": "builtins.dict", "source": {"_target_": "tests.test_faults._refused_by_the_store"}}
    )
    with pytest.raises(StoreError, match=r"^s3://bucket/p/index.json: http://x refused"):
        instantiate(cfg, "data")
    with pytest.raises(SystemExit), short_errors():
        instantiate(cfg, "data")
    err = capsys.readouterr().err
    assert err.startswith("Error: s3://bucket/p/index.json: http://x refused the credentials (403)"), err
    assert "InstantiationException" not in err and "\\'" not in err

"""Bad input gives an error that names the path and the config key; bad samples follow the policy."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from feedline.datamodules.samples import BadSampleError, SampleDataset
from feedline.datasets.folder.source import FolderSource
from feedline.train import train
from tests.conftest import FAST
from tests.helpers import make_tree


def test_missing_root_names_path_and_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"source\.root '.*trian' does not exist"):
        FolderSource(tmp_path / "trian")


def test_missing_val_root_names_its_key(tmp_path, tree):
    with pytest.raises(FileNotFoundError, match=r"source\.val_root '.*nope' does not exist"):
        FolderSource(tree, val_root=tmp_path / "nope")


def test_tree_without_class_folders(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.png").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"source\.root '.*flat' has no class folders"):
        FolderSource(tmp_path / "flat").prepare()


def test_tree_without_images(tmp_path):
    root = make_tree(tmp_path / "t", {"a": ["x.txt"], "b": ["y.csv"]})
    with pytest.raises(FileNotFoundError, match=r"Found 0 images .*source\.root.*source\.extensions"):
        FolderSource(root).prepare()


def test_class_without_images_is_named(tmp_path):
    root = make_tree(tmp_path / "t", {"a": ["1.png"], "empty": ["notes.txt"]})
    with pytest.raises(FileNotFoundError, match=r"hold no images: .*/t/empty"):
        FolderSource(root).prepare()


def test_bad_config_values_name_their_key(tree):
    with pytest.raises(ValueError, match=r"source\.val_fraction"):
        FolderSource(tree, val_fraction=1.5)
    with pytest.raises(ValueError, match=r"source\.refresh"):
        FolderSource(tree, refresh="sometimes")


def _lazy(tree, tmp_path, **options):
    from feedline.datasets.folder.lazy import LazyFolderSource
    from feedline.writers.lazy_layout import layout

    layout(tree, str(tmp_path / "lazy"), cache_dir=str(tmp_path / "layout-cache"))
    return LazyFolderSource(tmp_path / "lazy", cache_dir=tmp_path / "cache", **options)


def _hdf5(tree, tmp_path, **options):
    import h5py
    import numpy as np

    from feedline.datasets.hdf5.source import HDF5Source

    with h5py.File(tmp_path / "tiny.h5", "w") as f:
        f["images"] = np.zeros((4, 3, 8, 8), np.uint8)
        f["labels"] = np.array([0, 1, 2, 0])
    return HDF5Source(tmp_path / "tiny.h5", cache_dir=tmp_path / "cache", **options)


def _folder(tree, tmp_path, **options):
    return FolderSource(tree, cache_dir=tmp_path / "cache", **options)


EXTREMES = [
    (source, {"seed": seed}, r"source\.seed=.* must be an integer from 0 to 2\*\*64 - 1")
    for source in (_folder, _lazy, _hdf5)
    for seed in (-1, 2**64, 1.5)
] + [
    (_folder, {"scan_workers": 0}, r"source\.scan_workers=0 must be 'auto' or an integer from 1"),
    (_folder, {"scan_workers": -4}, r"source\.scan_workers=-4 must be"),
    (_folder, {"scan_workers": 10**6}, r"source\.scan_workers=1000000 must be .* to \d+ \(8 per CPU"),
    (_folder, {"scan_workers": "many"}, r"source\.scan_workers='many' must be"),
    (_folder, {"extensions": []}, r"source\.extensions=\[\] .*an empty list matches no image"),
    (_folder, {"extensions": [".png", ""]}, r"source\.extensions=\['\.png', ''\] .*'' is not one"),
    (_lazy, {"extension": "."}, r"source\.extension='\.' is not a file extension"),
    (_hdf5, {"classes": ["a", "b", "a"]}, r"source\.classes names class\(es\) 'a' more than once"),
]


@pytest.mark.parametrize(
    "make, options, said", EXTREMES, ids=[f"{m.__name__[1:]}-{o}" for m, o, _ in EXTREMES]
)
def test_source_values_out_of_range_are_refused_by_key_before_any_work(tree, tmp_path, make, options, said):
    with pytest.raises(ValueError, match=said):
        make(tree, tmp_path, **options)
    assert not (tmp_path / "cache").exists()  # nothing indexed, counted or cached


def test_a_source_seed_out_of_range_is_refused_from_the_command_line(make_cfg, tree):
    from feedline.cli.instantiate import instantiate

    cfg = make_cfg("source=folder", f"source.root={tree}", "source.seed=-1")
    with pytest.raises(ValueError, match=r"source\.seed=-1 must be an integer"):
        instantiate(cfg.data, "data")


def test_a_lazy_class_without_a_file_of_the_given_extension_is_named(tree, tmp_path):
    with pytest.raises(ValueError, match=r"class folder .*/lazy/cat has no '\.jpg' file \(source\.extension"):
        _lazy(tree, tmp_path, extension="jpg").prepare()


@pytest.fixture
def corrupt_tree(tmp_path):
    root = make_tree(
        tmp_path / "t", {"a": [f"{i}.png" for i in range(4)], "b": [f"{i}.png" for i in range(4)]}
    )
    (tmp_path / "t" / "a" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return root


def test_corrupt_image_is_skipped_and_reported_by_path(corrupt_tree, caplog):
    records = FolderSource(corrupt_tree, val_fraction=0).split("train")
    dataset = SampleDataset(records, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING):
        images = [dataset[i][0] for i in range(len(dataset))]
    assert all(img.dtype == torch.uint8 and img.shape[0] == 3 for img in images)
    assert os.path.join(corrupt_tree, "a", "1.png") in caplog.text
    assert torch.equal(images[1], images[2])  # replaced by the next readable sample


def test_corrupt_image_raises_with_path_and_key(corrupt_tree):
    dataset = SampleDataset(FolderSource(corrupt_tree, val_fraction=0).split("train"), on_bad_sample="raise")
    with pytest.raises(BadSampleError, match=r"a/1\.png.*data\.on_bad_sample"):
        dataset[1]


def test_missing_file_during_training_is_a_bad_sample(corrupt_tree, caplog):
    records = FolderSource(corrupt_tree, val_fraction=0).split("train")
    os.remove(os.path.join(corrupt_tree, "b", "2.png"))
    with caplog.at_level(logging.WARNING):
        SampleDataset(records, on_bad_sample="skip")[6]
    assert "b/2.png" in caplog.text


def test_train_raises_on_corrupt_image_when_asked(make_cfg, corrupt_tree):
    cfg = make_cfg(
        *FAST,
        "source=folder",
        f"source.root={corrupt_tree}",
        "source.val_fraction=0",
        "data.on_bad_sample=raise",
        "data.batch_size=8",
        "transforms=digits",
    )
    with pytest.raises(BadSampleError, match=r"a/1\.png"):
        train(cfg)


def test_train_skips_corrupt_image_by_default(make_cfg, corrupt_tree):
    cfg = make_cfg(
        *FAST,
        "source=folder",
        f"source.root={corrupt_tree}",
        "source.val_fraction=0",
        "data.batch_size=8",
        "transforms=digits",
    )
    assert train(cfg)["metrics"]["train/loss"] > 0


def _tree_with_bad_files(tmp_path, good: int, bad: list[int]) -> str:
    root = make_tree(tmp_path / "t", {"a": [f"{i:03d}.png" for i in range(good)]})
    for i in bad:
        with open(os.path.join(root, "a", f"{i:03d}.png"), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n truncated by a failed copy")
    return root


def test_a_few_bad_files_stay_within_the_budget(tmp_path):
    root = _tree_with_bad_files(tmp_path, 100, [10, 40, 70])
    dataset = SampleDataset(FolderSource(root, val_fraction=0).split("train"), max_bad_fraction=0.05)
    labels = [dataset[i][1] for i in range(len(dataset))]
    assert len(labels) == 100 and dataset.bad.count == 3


def test_a_mostly_bad_split_stops_with_a_summary(tmp_path):
    root = _tree_with_bad_files(tmp_path, 20, list(range(2, 20)))
    dataset = SampleDataset(FolderSource(root, val_fraction=0).split("train"), max_bad_fraction=0.05)
    with pytest.raises(
        BadSampleError,
        match=r"2 of 20 samples are unreadable, more than data\.max_bad_fraction=0\.05 allows \(1\)",
    ):
        for i in range(len(dataset)):
            dataset[i]


def test_each_bad_file_is_warned_once_even_when_drawn_as_a_substitute(tmp_path, caplog):
    root = _tree_with_bad_files(tmp_path, 20, [5, 6])
    dataset = SampleDataset(FolderSource(root, val_fraction=0).split("train"), max_bad_fraction=0.2)
    with caplog.at_level(logging.WARNING):
        for i in range(len(dataset)):  # 5 is replaced by 7, through bad 6; then 6 itself comes up
            dataset[i]
    warned = [r.getMessage() for r in caplog.records if "skipping bad sample" in r.getMessage()]
    assert len(warned) == 2 and any("005.png" in m for m in warned) and any("006.png" in m for m in warned)


def test_workers_share_one_set_of_bad_sample_flags(make_cfg, tmp_path):
    from feedline.cli.instantiate import instantiate

    root = _tree_with_bad_files(tmp_path, 24, [3, 11])
    cfg = make_cfg(
        "source=folder",
        f"source.root={root}",
        "source.val_fraction=0",
        "data.num_workers=2",
        "data.batch_size=4",
        "data.max_bad_fraction=0.1",
        "transforms=digits",
    )
    dm = instantiate(cfg.data, "data")
    dm.prepare_data()
    dm.setup("fit")
    assert sum(len(b.label) for b in dm.train_dataloader()) == 24
    assert dm.datasets["train"].bad.count == 2  # found in the workers, seen here


def test_max_bad_fraction_outside_0_1_names_the_key(tree):
    with pytest.raises(ValueError, match=r"data\.max_bad_fraction=1\.5"):
        SampleDataset(FolderSource(tree).split("train"), max_bad_fraction=1.5)


@pytest.mark.slow
def test_bad_samples_found_in_spawned_workers_reach_the_run_log(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT_DIR

    root = _tree_with_bad_files(tmp_path, 12, [4])
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "train.py",
        "source=folder",
        f"source.root={root}",
        "source.val_fraction=0",
        "data.num_workers=1",
        "data.multiprocessing_context=spawn",
        "data.batch_size=4",
        "data.max_bad_fraction=0.1",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        "transforms=digits",
        "logger=none",
        "callbacks=none",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={run_dir}",
    ]
    done = subprocess.run(cmd, cwd=ROOT_DIR, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "skipping bad sample" in (run_dir / "train.log").read_text()
        and "004.png" in (run_dir / "train.log").read_text()
    )

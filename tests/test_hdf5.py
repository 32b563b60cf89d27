"""hdf5 source and convert.py: round trips, foreign layouts, workers, interruptions, truncation."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import feedline.writers.hdf5 as hdf5_write
import feedline.writers.prepare as prepare
from feedline.convert import run_convert
from feedline.datamodules.samples import SampleDataset
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.hdf5.source import HDF5Source
from feedline.train import train
from feedline.transforms.collate import Uint8Collate
from feedline.transforms.decode import decode
from tests.conftest import FAST
from tests.helpers import convert_cli, make_tree, simple_tree


def _convert(make_cfg, tree, out, *overrides):
    cfg = make_cfg("source=folder", f"source.root={tree}", f"out.path={out}", *overrides, config="convert")
    return run_convert(cfg)


@pytest.fixture
def tree(tmp_path):
    root = make_tree(
        tmp_path / "tree", {c: [f"{i}.png" for i in range(5)] + ["x.jpg"] for c in ("a", "b", "c")}
    )
    return root


def test_encoded_round_trip_is_pixel_identical(make_cfg, tree, tmp_path):
    summary = _convert(make_cfg, tree, tmp_path / "out.h5")
    assert summary["images"] == 18 and summary["skipped"] == 0 and os.path.exists(tmp_path / "out.h5")
    folder = FolderSource(tree, val_fraction=0).split("train")
    h5 = HDF5Source(tmp_path / "out.h5", val_fraction=0).split("train")
    assert len(h5) == len(folder)
    for i in range(len(folder)):
        (a, la), (b, lb) = folder[i], h5[i]
        assert la == lb and torch.equal(decode(a), decode(b))


def test_file_layout_and_attributes(make_cfg, tree, tmp_path):
    _convert(make_cfg, tree, tmp_path / "out.h5")
    folder = FolderSource(tree, val_fraction=0).split("train")
    with h5py.File(tmp_path / "out.h5") as f:
        # encoded files, packed: one flat byte array, row i between offsets[i] and offsets[i + 1]
        images, offsets = f["images"], f["offsets"][:]
        assert images.dtype == np.uint8 and images.attrs["layout"] == "ragged-bytes"
        assert images.chunks is None and offsets.shape == (19,) and offsets[-1] == len(images)
        for i in range(18):
            assert images[offsets[i] : offsets[i + 1]].tobytes() == folder[i][0].tobytes()  # the files' bytes
        assert f["labels"].dtype == np.int64 and f["labels"][:].tolist() == [0] * 6 + [1] * 6 + [2] * 6
        assert f.attrs["classes"] == '["a", "b", "c"]' and f.attrs["mode"] == "encoded"
    records = HDF5Source(tmp_path / "out.h5", val_fraction=0).split("train")
    assert records.mapped is not None  # read straight from the page cache, no HDF5 call per row
    batch = records.getitems([5, 0, 5, 17])
    assert [p.tobytes() for p, _ in batch] == [folder[i][0].tobytes() for i in (5, 0, 5, 17)]
    assert [label for _, label in batch] == [0, 0, 0, 2]


def test_packed_encoded_file_read_as_the_old_variable_length_one(make_cfg, tree, tmp_path):
    """Files written before the packed layout (or by other tools) hold variable-length rows: the same samples."""
    _convert(make_cfg, tree, tmp_path / "out.h5")
    with h5py.File(tmp_path / "out.h5") as f, h5py.File(tmp_path / "vlen.h5", "w") as old:
        offsets, flat = f["offsets"][:], f["images"][:]
        rows = old.create_dataset("images", (18,), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(18):
            rows[i] = flat[offsets[i] : offsets[i + 1]]
        old["labels"] = f["labels"][:]
        old.attrs.update(f.attrs)
    packed = HDF5Source(tmp_path / "out.h5", val_fraction=0).split("train")
    vlen = HDF5Source(tmp_path / "vlen.h5", val_fraction=0).split("train")
    assert vlen.mapped is None
    for (a, la), (b, lb) in zip(packed.getitems(range(18)), vlen.getitems(range(18))):
        assert la == lb and a.tobytes() == b.tobytes()
    with h5py.File(tmp_path / "out.h5", "a") as f:  # offsets that overrun the bytes: refused, by name
        f["offsets"][-1] = f["offsets"][-1] + 7
    with pytest.raises(ValueError, match="offsets end at .* damaged"):
        HDF5Source(tmp_path / "out.h5", val_fraction=0).split("train")


def test_max_side_and_raw_modes(make_cfg, tmp_path):
    root = make_tree(tmp_path / "t", {"a": ["0.png"], "b": ["0.png"]})
    big = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    from PIL import Image

    Image.fromarray(big).save(os.path.join(root, "a", "0.png"))
    _convert(make_cfg, root, tmp_path / "small.h5", "out.max_side=30")
    assert decode(HDF5Source(tmp_path / "small.h5", val_fraction=0).split("train")[0][0]).shape == (3, 20, 30)
    _convert(make_cfg, root, tmp_path / "raw.h5", "out.mode=raw", "out.size=16")  # centre-cropped squares
    with h5py.File(tmp_path / "raw.h5") as f:
        assert f["images"].shape == (2, 16, 16, 3) and f["images"].dtype == np.uint8
    payload, _ = HDF5Source(tmp_path / "raw.h5", val_fraction=0).split("train")[0]
    assert payload.shape == (3, 16, 16) and decode(payload).dtype == torch.uint8


def test_raw_keeps_whole_images_at_their_aspect_ratio(make_cfg, tmp_path):
    """out.mode=raw out.max_side=S: every image whole, its longer side at most S, the same pixels as the
    decoded image shrunk once; rows of different sizes in one mapped array, a skipped input left out."""
    from PIL import Image

    rng = np.random.default_rng(0)
    root = make_tree(tmp_path / "t", {"a": [], "b": []})
    sizes = {"a/0.png": (40, 60), "a/1.png": (60, 30), "a/2.png": (10, 12), "b/0.png": (33, 33)}
    for name, shape in sizes.items():
        Image.fromarray(rng.integers(0, 255, (*shape, 3), dtype=np.uint8)).save(os.path.join(root, name))
    (tmp_path / "t" / "a" / "3.png").write_bytes(b"broken")
    _convert(make_cfg, root, tmp_path / "raw.h5", "out.mode=raw", "out.max_side=30", "out.workers=1")
    records = HDF5Source(tmp_path / "raw.h5", val_fraction=0).split("train")
    assert records.mapped is not None and len(records) == 4
    assert [records[i][0].shape for i in range(4)] == [(3, 20, 30), (3, 30, 15), (3, 10, 12), (3, 30, 30)]
    for i, name in enumerate(sizes):
        image = decode(Path(root, name).read_bytes())
        assert torch.equal(torch.as_tensor(records[i][0]), prepare.shrink(image, 30)), name
    batch = records.getitems([3, 0, 3])
    assert [p.shape for p, _ in batch] == [(3, 30, 30), (3, 20, 30), (3, 30, 30)]
    assert [lab for _, lab in batch] == [1, 0, 1] and np.array_equal(batch[1][0], records[0][0])


def test_raw_ragged_file_with_inconsistent_offsets_is_refused(make_cfg, tree, tmp_path):
    _convert(make_cfg, tree, tmp_path / "raw.h5", "out.mode=raw", "out.max_side=8", "out.workers=1")
    with h5py.File(tmp_path / "raw.h5", "r+") as f:
        f["offsets"][-1] = f["offsets"][-1] + 5
    with pytest.raises(ValueError, match=r"offsets end at .* truncated or damaged"):
        HDF5Source(tmp_path / "raw.h5")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["out.size=16"], r"out\.size=16 centre-crops raw squares: set out\.mode=raw"),
        (["out.mode=raw", "out.size=16", "out.max_side=20"], r"two raw layouts: set one"),
    ],
)
def test_raw_layout_options_are_checked(make_cfg, tree, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _convert(make_cfg, tree, tmp_path / "raw.h5", *overrides)


OUT_EXTREMES = [
    ("out.max_side=0", r"out\.max_side=0 must be in 1\.\.65535"),
    ("out.max_side=-3", r"out\.max_side=-3 must be in 1\.\.65535"),
    ("out.max_side=99999999999999999999", r"out\.max_side=9+ must be in 1\.\.65535"),
    ("out.size=0", r"out\.size=0 must be in 1\.\.13377"),
    ("out.size=100000", r"out\.size=100000 must be in 1\.\.13377"),
    ("out.quality=0", r"out\.quality=0 must be in 1\.\.100"),
    ("out.quality=101", r"out\.quality=101 must be in 1\.\.100"),
    ("out.workers=0", r"out\.workers=0 must be an integer >= 1, or 'auto'"),
    ("out.workers=-2", r"out\.workers=-2 must be an integer >= 1"),
    ("out.workers=abc", r"out\.workers='abc' must be an integer or 'auto'"),
    ("out.workers=1.5", r"out\.workers=1\.5 must be an integer"),
    ("out.workers=100000", r"out\.workers=100000 starts that many processes .* set out\.workers=auto"),
    ("out.chunk=0", r"out\.chunk=0 must be in 1\.\.65536"),
    ("out.chunk=-1", r"out\.chunk=-1 must be in 1\.\.65536"),
    ("out.chunk=100000000000", r"out\.chunk=100000000000 must be in 1\.\.65536"),
    ("out.path=''", r"out\.path must be set"),
]


@pytest.mark.parametrize("override, message", OUT_EXTREMES, ids=[o for o, _ in OUT_EXTREMES])
def test_out_values_at_their_extremes_are_refused_by_key_before_any_work(
    make_cfg, tree, tmp_path, override, message
):
    mode = ["out.mode=raw"] if override.startswith("out.size") else []
    with pytest.raises(ValueError, match=message):
        _convert(make_cfg, tree, tmp_path / "o" / "out.h5", *mode, override)
    assert not (tmp_path / "o").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_an_out_path_that_cannot_be_a_file_is_refused_before_any_work(make_cfg, tree, tmp_path, where):
    (tmp_path / "o").mkdir()
    (tmp_path / "f").write_text("a file")
    out, message = {
        "a directory": (tmp_path / "o", r"out\.path=.*/o is a directory: name the HDF5 file to write"),
        "under a file": (tmp_path / "f" / "x.h5", r"out\.path=.*x\.h5 cannot be written: .*/f is a file"),
    }[where]
    with pytest.raises(OSError if where == "under a file" else ValueError, match=message):
        _convert(make_cfg, tree, out)
    assert not (tmp_path / "cache").exists()


def test_foreign_float_chw_file_trains_by_config_alone(make_cfg, tmp_path):
    rng = np.random.default_rng(0)
    images = rng.random((24, 3, 8, 8), dtype=np.float32)
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = images
        f["y"] = np.arange(24, dtype=np.int64) % 3
    source = HDF5Source(tmp_path / "foreign.h5", images_key="x", labels_key="y", val_fraction=0.25)
    assert source.classes == ["0", "1", "2"]
    payload, label = source.split("train")[0]
    assert payload.dtype == np.uint8 and payload.shape == (3, 8, 8)
    assert np.array_equal(payload, np.rint(images[0] * 255).astype(np.uint8))
    val = source.split("val")
    assert len(val) == 6 and sorted(val[i][1] for i in range(6)) == [0, 0, 1, 1, 2, 2]
    cfg = make_cfg(
        *FAST,
        "source=hdf5",
        f"source.path={tmp_path / 'foreign.h5'}",
        "source.images_key=x",
        "source.labels_key=y",
        "source.layout=chw",
        "transforms=digits",
    )
    assert train(cfg)["metrics"]["train/loss"] > 0


def test_spawn_workers_read_batches(make_cfg, tree, tmp_path):
    _convert(make_cfg, tree, tmp_path / "out.h5")
    records = HDF5Source(tmp_path / "out.h5", val_fraction=0).split("train")
    records[0]  # a handle opened in the parent must not travel to the workers
    from torchvision.transforms import v2

    dataset = SampleDataset(records, v2.Resize([8, 8]))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=5, num_workers=2, collate_fn=Uint8Collate(), multiprocessing_context="spawn"
    )
    labels = torch.cat([batch.label for batch in loader])
    assert labels.tolist() == [0] * 6 + [1] * 6 + [2] * 6


def test_batch_reads_equal_single_reads(make_cfg, tree, tmp_path):
    _convert(make_cfg, tree, tmp_path / "out.h5")
    records = HDF5Source(tmp_path / "out.h5", val_fraction=0.3, seed=2).split("train")
    picks = [5, 1, 9, 1, 0]
    batch = records.getitems(picks)
    assert [lab for _, lab in batch] == [records[i][1] for i in picks]
    assert all(np.array_equal(p, records[i][0]) for (p, _), i in zip(batch, picks))


def test_split_matches_the_folder_source(make_cfg, tree, tmp_path):
    _convert(make_cfg, tree, tmp_path / "out.h5")
    folder = FolderSource(tree, val_fraction=0.34, seed=5).split("val")
    h5 = HDF5Source(tmp_path / "out.h5", val_fraction=0.34, seed=5).split("val")
    assert [bytes(folder[i][0]) for i in range(len(folder))] == [bytes(h5[i][0]) for i in range(len(h5))]


def test_corrupt_inputs_are_skipped_and_reported(make_cfg, tree, tmp_path):
    (tmp_path / "tree" / "b" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    summary = _convert(make_cfg, tree, tmp_path / "out.h5")
    assert summary["images"] == 17 and summary["skipped"] == 1
    report = (tmp_path / "out.h5.skipped.tsv").read_text()
    assert os.path.join(tree, "b", "2.png") in report


def test_interrupted_conversion_leaves_no_complete_looking_file(make_cfg, tree, tmp_path, monkeypatch):
    def boom(indices):
        raise KeyboardInterrupt

    monkeypatch.setattr(hdf5_write, "ProcessPoolExecutor", _InlinePool)
    monkeypatch.setattr(hdf5_write, "prepare_chunk", boom)
    with pytest.raises(KeyboardInterrupt):
        _convert(make_cfg, tree, tmp_path / "out.h5")
    assert not os.path.exists(tmp_path / "out.h5") and not os.path.exists(tmp_path / "out.h5.partial")
    monkeypatch.undo()
    assert _convert(make_cfg, tree, tmp_path / "out.h5")["images"] == 18  # a rerun starts clean


class _InlinePool:
    def __init__(self, workers, initializer, initargs):
        initializer(*initargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, tasks):
        return map(fn, tasks)


def test_truncated_file_error_names_it(make_cfg, tree, tmp_path):
    _convert(make_cfg, tree, tmp_path / "out.h5")
    data = (tmp_path / "out.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match=r"source\.path '.*cut\.h5' cannot be read as HDF5.*truncated"):
        HDF5Source(tmp_path / "cut.h5")


def test_missing_key_lists_what_the_file_holds(tmp_path):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["pixels"] = np.zeros((2, 4, 4, 3), np.uint8)
        f["labels"] = np.zeros(2, np.int64)
    with pytest.raises(KeyError, match=r"no dataset 'images'.*source\.images_key.*pixels"):
        HDF5Source(tmp_path / "f.h5")


def test_train_from_a_converted_file(make_cfg, tmp_path):
    tree = simple_tree(tmp_path / "t")
    _convert(make_cfg, tree, tmp_path / "out.h5")
    cfg = make_cfg(
        *FAST, "source=hdf5", f"source.path={tmp_path / 'out.h5'}", "transforms=digits", "data.num_workers=2"
    )
    assert train(cfg)["metrics"]["train/loss"] > 0


def test_bad_payload_in_a_file_is_a_bad_sample(tmp_path, caplog):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        images = f.create_dataset("images", (3,), dtype=h5py.vlen_dtype(np.uint8))
        from tests.helpers import image_bytes

        images[0] = np.frombuffer(image_bytes(".png"), np.uint8)
        images[1] = np.frombuffer(b"garbage", np.uint8)
        images[2] = np.frombuffer(image_bytes(".png", seed=3), np.uint8)
        f["labels"] = np.array([0, 1, 1])
    dataset = SampleDataset(HDF5Source(tmp_path / "f.h5", val_fraction=0).split("train"))
    with caplog.at_level(logging.WARNING):
        out = dataset.__getitems__([0, 1, 2])
    assert len(out) == 3 and "f.h5:images[1]" in caplog.text


@pytest.mark.slow
def test_convert_cli(tmp_path, tree):
    out = tmp_path / "cli.h5"
    done = convert_cli(tmp_path, tree, f"out.path={out}", timeout=300)
    assert "converted 18 images" in done.stderr + done.stdout and out.exists()


def test_contiguous_arrays_are_memory_mapped_and_match_h5py(make_cfg, tmp_path):
    root = make_tree(tmp_path / "t", {c: [f"{i}.png" for i in range(4)] for c in ("a", "b")})
    (tmp_path / "t" / "a" / "2.png").write_bytes(b"broken")  # a skipped input: the raw file is trimmed
    _convert(make_cfg, root, tmp_path / "raw.h5", "out.mode=raw", "out.size=8")
    records = HDF5Source(tmp_path / "raw.h5", val_fraction=0).split("train")
    assert records.mapped is not None and isinstance(records.images.base, np.memmap)
    with h5py.File(tmp_path / "raw.h5") as f:
        assert f["images"].shape == (7, 8, 8, 3)
        for i in range(7):
            assert np.array_equal(records[i][0], f["images"][i].transpose(2, 0, 1))
    batch = records.getitems([6, 0, 3])
    assert [lab for _, lab in batch] == [1, 0, 1] and np.array_equal(batch[0][0], records[6][0])


def test_origin_is_converted_on_prepare_and_gives_the_same_split(tree, tmp_path):
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.derived import ConvertedHDF5Source

    origin = FolderSource(tree, val_fraction=0)
    path = tmp_path / "made.h5"
    source = ConvertedHDF5Source(path, origin, convert_options={"workers": 1}, val_fraction=0.34)
    assert source.classes == origin.classes and not path.exists()  # known before prepare(), from the origin
    source.prepare()
    assert path.exists()
    folder = FolderSource(tree, val_fraction=0.34)
    folder.prepare()
    for split in ("train", "val"):
        ours, theirs = source.split(split), folder.split(split)
        assert [ours[i][1] for i in range(len(ours))] == [theirs[i][1] for i in range(len(theirs))]
        assert all(bytes(ours[i][0]) == bytes(theirs[i][0]) for i in range(len(ours)))


def test_raw_ragged_rows_read_the_same_when_the_file_is_compressed(make_cfg, tree, tmp_path):
    """A ragged file repacked with compression (h5repack, or written by another tool) cannot be mapped: its
    rows are read through h5py, one slice each, and come out the same."""
    _convert(make_cfg, tree, tmp_path / "raw.h5", "out.mode=raw", "out.max_side=8", "out.workers=1")
    with h5py.File(tmp_path / "raw.h5") as src, h5py.File(tmp_path / "packed.h5", "w") as dst:
        for name in ("labels", "shapes", "offsets"):
            src.copy(name, dst)
        dst.attrs.update(dict(src.attrs))
        dst.create_dataset("images", data=src["images"][:], chunks=(500,), compression="gzip")
        dst["images"].attrs.update(dict(src["images"].attrs))
    mapped = HDF5Source(tmp_path / "raw.h5", val_fraction=0).split("train")
    packed = HDF5Source(tmp_path / "packed.h5", val_fraction=0).split("train")
    assert mapped.mapped is not None and packed.mapped is None
    rows = [5, 0, 17, 5]
    for (a, la), (b, lb) in zip(mapped.getitems(rows), packed.getitems(rows)):
        assert la == lb and np.array_equal(a, b)
    assert np.array_equal(packed[3][0], mapped[3][0])


@pytest.mark.parametrize("max_side", [None, 256])  # 256: larger than every image, so nothing is resized
def test_reconverting_raw_hdf5_reencodes_pixels(make_cfg, tree, tmp_path, max_side):
    """A raw file converted again to an encoded one stores image files (PNG, lossless), never the pixel
    array's bytes: every row decodes to the very pixels of the raw row."""
    _convert(make_cfg, tree, tmp_path / "raw.h5", "out.mode=raw", "out.max_side=8", "out.workers=1")
    cfg = make_cfg(
        "source=hdf5",
        f"source.path={tmp_path / 'raw.h5'}",
        f"out.path={tmp_path / 're.h5'}",
        "out.workers=1",
        *([f"out.max_side={max_side}"] if max_side else []),
        config="convert",
    )
    assert run_convert(cfg)["skipped"] == 0
    raw = HDF5Source(tmp_path / "raw.h5", val_fraction=0).split("train")
    again = HDF5Source(tmp_path / "re.h5", val_fraction=0).split("train")
    assert again.encoded and len(again) == len(raw) == 18
    for i in range(len(raw)):
        assert again[i][1] == raw[i][1] and torch.equal(decode(again[i][0]), torch.as_tensor(raw[i][0])), i


def test_reconverting_raw_hdf5_smaller_reencodes_as_jpeg(make_cfg, tree, tmp_path):
    _convert(make_cfg, tree, tmp_path / "raw.h5", "out.mode=raw", "out.size=8", "out.workers=1")
    cfg = make_cfg(
        "source=hdf5",
        f"source.path={tmp_path / 'raw.h5'}",
        f"out.path={tmp_path / 're.h5'}",
        "out.max_side=4",
        "out.workers=1",
        config="convert",
    )
    run_convert(cfg)
    again = HDF5Source(tmp_path / "re.h5", val_fraction=0).split("train")
    assert bytes(again[0][0][:3]) == b"\xff\xd8\xff" and decode(again[0][0]).shape == (3, 4, 4)

"""source=seg_folder: images/ and masks/ paired by stem, indexed once, a mask on its image through crop and flip,
unpaired files named before training, the class list required by name, small pickles, split trees."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
from PIL import Image

from feedline.cli.instantiate import instantiate
from feedline.datamodules.bad_samples import BadSampleError
from feedline.datasets import SegFolderSource
from feedline.transforms import RandomHorizontalFlip, RandomResizedCrop
from feedline.transforms.masks import decode_mask
from tests.field_data import misaligned, pixels
from tests.helpers import backdate_tree
from tests.test_fields import loaders


def seg_tree(root, rows=range(10), nested: bool = False) -> str:
    """Images whose pixels encode their row and block (``field_data.pixels``), a mask of the same stem each."""
    for n in rows:
        image, mask = pixels(n)
        sub = f"g{n % 2}/" if nested else ""
        for top, array, ext in (("images", image, ".png"), ("masks", mask, ".png")):
            path = root / top / f"{sub}s{n:03d}{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(path)
    backdate_tree(root)
    return str(root)


def ids(batch) -> list[int]:
    """The rows a batch holds (red is the row), each mask checked against its image, pixel for pixel."""
    for image, mask in zip(batch.image, batch.mask):
        pure, wrong = misaligned(image, mask)
        assert pure > 50 and wrong == 0, f"{wrong} of {pure} pixels off their mask"
    x, y = batch
    assert y is batch.mask and batch.mask.dim() == 3
    return batch.image[:, 0, 0, 0].long().tolist()


def test_a_mask_stays_on_its_image_through_feedlines_crop_and_flip(tmp_path):
    source = SegFolderSource(seg_tree(tmp_path / "seg", nested=True), num_classes=4, val_fraction=0.2)
    assert source.classes == ["0", "1", "2", "3"] and source.fields.target == "mask"
    train = [RandomResizedCrop(24, scale=(0.3, 1.0), antialias=True), RandomHorizontalFlip()]
    data = loaders(source, train=train)
    seen = [n for batch in data.train_dataloader() for n in ids(batch)]
    held = [n for batch in data.val_dataloader() for n in ids(batch)]
    assert len(seen) == 8 and len(held) == 2 and sorted(seen + held) == list(range(10))


def test_the_pairs_are_indexed_once_and_a_split_pickles_small(tmp_path, caplog):
    root = seg_tree(tmp_path / "seg")
    with caplog.at_level(logging.INFO, logger="feedline.datasets.folder.seg_index"):
        SegFolderSource(root, num_classes=4).prepare()
        again = SegFolderSource(root, num_classes=4)
        again.prepare()
    assert sum("indexed 10 image/mask pairs" in r.getMessage() for r in caplog.records) == 1
    records = again.split("train")
    assert len(pickle.dumps(records)) < 1000  # the index directory's name, never the file list
    copy = pickle.loads(pickle.dumps(records))
    for i in range(len(records)):
        image, mask = copy.paths(i)
        assert image.endswith(mask[-8:]) and "/images/" in image and "/masks/" in mask
        assert np.array_equal(decode_mask(copy[i]["mask"])[0].numpy(), pixels(int(mask[-7:-4]))[1])
    seg_tree(tmp_path / "seg", rows=[10])  # a new pair: the folders changed, so the index is built again
    assert len(SegFolderSource(root, num_classes=4, val_fraction=0).split("train")) == 11


def test_unpaired_files_are_named_before_training(tmp_path):
    root = tmp_path / "seg"
    seg_tree(root, rows=range(14))
    for n in range(12):
        (root / "masks" / f"s{n:03d}.png").unlink()
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(root / "masks" / "stray.png")
    with pytest.raises(FileNotFoundError) as err:
        SegFolderSource(str(root), num_classes=4).prepare()
    message = str(err.value)
    assert "12 image(s) without a mask: images/s000.png" in message and "images/s009.png ..." in message
    assert "images/s010.png" not in message  # ten named, then ...
    assert "1 mask(s) without an image: masks/stray.png" in message


def test_the_class_list_is_required_by_name(tmp_path):
    root = seg_tree(tmp_path / "seg", rows=range(2))
    with pytest.raises(ValueError, match=r"source\.classes=\[background, \.\.\.\].*source\.num_classes=K"):
        SegFolderSource(root)
    with pytest.raises(ValueError, match=r"source\.num_classes=3 but source\.classes names 4"):
        SegFolderSource(root, classes=["a", "b", "c", "d"], num_classes=3)
    assert SegFolderSource(root, classes=["a", "b", "c", "d"]).fields["mask"].classes == ("a", "b", "c", "d")


def test_split_trees_give_val_and_test(tmp_path, make_cfg):
    seg_tree(tmp_path / "seg" / "train", rows=range(6))
    seg_tree(tmp_path / "seg" / "val", rows=range(20, 23))
    cfg = make_cfg("source=seg_folder", f"source.root={tmp_path / 'seg'}", "source.num_classes=4")
    source = instantiate(cfg.source, "source")
    source.prepare()
    assert [len(source.split(s)) for s in ("train", "val")] == [6, 3]  # val_fraction unused: val/ is there
    assert (
        source.split("val")
        .describe(0)
        .endswith("seg/val/images/s020.png (mask " + source.split("val").paths(0)[1] + ")")
    )
    with pytest.raises(ValueError, match=r"no test split.*test/ tree.*source\.test_fraction"):
        source.split("test")
    with pytest.raises(FileNotFoundError, match=r"neither images/ nor train/images/"):
        SegFolderSource(str(tmp_path), num_classes=4)
    seg_tree(tmp_path / "flat", rows=range(4))  # images/ and masks/ at the root, and a val/ tree beside them
    seg_tree(tmp_path / "flat" / "val", rows=range(20, 22))
    with pytest.raises(ValueError, match=r"holds images/ and val/images/: move images/ and masks/ under"):
        SegFolderSource(str(tmp_path / "flat"), num_classes=4)


def test_a_mask_removed_after_indexing_is_named_as_bad_input(tmp_path):
    root = tmp_path / "seg"
    source = SegFolderSource(seg_tree(root, rows=range(8)), num_classes=4, val_fraction=0)
    source.prepare()
    (root / "masks" / "s005.png").unlink()
    with pytest.raises(BadSampleError, match=r"seg/images/s005\.png \(mask .*seg/masks/s005\.png\)"):
        list(loaders(source, on_bad_sample="raise").train_dataloader())

"""Segmentation, multi-label and regression: the embedded shapes (``datasets/shapes``) and the models that train
them (``models/segmenter.py``, ``multilabel.py``, ``regressor.py``), each from the command line."""

from __future__ import annotations

import csv
import filecmp
import json
import math
import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from feedline.datasets.shapes.generate import CLASSES, SHAPES, TABLE, materialise
from feedline.models import ImageRegressor, MultiLabelClassifier, Segmenter, SmallCNN, SmallUNet
from tests.conftest import ROOT_DIR


def table(root) -> list[dict]:
    with open(os.path.join(root, TABLE), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_shapes_are_generated_the_same_every_time_and_once(tmp_path):
    first, second = (
        materialise(str(tmp_path / "a"), n=12, size=32),
        materialise(str(tmp_path / "b"), n=12, size=32),
    )
    files = sorted(os.path.relpath(os.path.join(d, f), first) for d, _, fs in os.walk(first) for f in fs)
    assert len(files) == 2 * 12 + 3  # images, masks, the table, the COCO file and its parameters
    same, different, missing = filecmp.cmpfiles(first, second, files, shallow=False)
    assert (different, missing) == ([], [])
    stamp = os.stat(os.path.join(first, TABLE)).st_mtime_ns
    assert materialise(first, n=12, size=32) == first
    assert os.stat(os.path.join(first, TABLE)).st_mtime_ns == stamp  # not written again
    with pytest.raises(RuntimeError, match=r"holds shapes generated with .*'n': 12.*set source.root"):
        materialise(first, n=20, size=32)
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temporary directory left


def test_each_row_of_the_shapes_table_says_what_its_mask_holds(tmp_path):
    root = materialise(str(tmp_path / "shapes"), n=16, size=32)
    rows = table(root)
    assert len(rows) == 16 and list(rows[0]) == ["image", "mask", "shapes", "coverage", "caption", "largest"]
    for row in rows:
        image = np.asarray(Image.open(os.path.join(root, row["image"])))
        mask = np.asarray(Image.open(os.path.join(root, row["mask"])))
        assert image.shape == (32, 32, 3) and mask.shape == (32, 32) and mask.dtype == np.uint8
        present = [CLASSES[c] for c in np.unique(mask) if c]
        assert row["shapes"].split() == present and present  # 1-3 shapes, each of them visible
        assert float(row["coverage"]) == (mask > 0).mean()
        assert row["largest"] == CLASSES[int(np.argmax(np.bincount(mask.ravel(), minlength=4)[1:])) + 1]
        caption = row["caption"].replace("circles", "circle").replace("squares", "square")
        assert {w for w in caption.replace("triangles", "triangle").split() if w in SHAPES} == set(present)
        # the shapes are drawn in colour on a grey background: the mask is where the image is not grey
        rgb = image.astype(int)
        coloured = (rgb.max(axis=2) - rgb.min(axis=2)) > 60
        assert (coloured == (mask > 0)).all(), row


def test_the_shapes_source_keeps_the_source_contract(tmp_path):
    from feedline.datasets import ShapesSource
    from feedline.testing import check_source

    source = ShapesSource(root=str(tmp_path / "shapes"), n=16, size=16, target="shapes")
    check_source(source)
    assert source.classes == list(SHAPES) and source.split("val")[0]["caption"]


def logged(module) -> dict:
    """What the module logs, by name, without a Trainer."""
    seen: dict = {}
    module.log = lambda name, value, **kw: seen.__setitem__(name, value)
    return seen


class Fixed(torch.nn.Module):
    """A network that answers ``out`` whatever it is shown (``net(num_classes=...)``, as the models build it)."""

    def __init__(self, out: torch.Tensor, num_classes: int = 0):
        super().__init__()
        self.out = out
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.out + self.weight


def masks() -> torch.Tensor:
    y = torch.zeros((2, 16, 16), dtype=torch.uint8)
    y[0, 2:8, 2:8] = 1
    y[1, 4:12, 6:10] = 3
    y[:, 0, :] = 255  # void: neither loss nor IoU
    return y


def test_the_segmenter_trains_on_uint8_masks_ignoring_void_pixels_and_reports_mean_iou():
    y = masks()
    model = Segmenter(num_classes=4, net=partial(SmallUNet, width=4))
    seen = logged(model)
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    loss = model.training_step((x, y), 0)
    assert torch.isfinite(loss) and loss.requires_grad
    kept = y.long().clone()
    kept[kept == 255] = -100  # cross-entropy's own ignore value
    assert torch.allclose(loss, F.cross_entropy(model(x), kept))
    assert "train/loss" in seen

    right = F.one_hot(y.long().clamp(max=3), 4).permute(0, 3, 1, 2).float() * 10
    wrong = right.roll(1, dims=1)  # every pixel one class off
    for logits, expected in ((right, 1.0), (wrong, 0.0)):
        model = Segmenter(num_classes=4, net=partial(Fixed, logits))
        seen = logged(model)
        with torch.no_grad():
            model.validation_step((x, y), 0)
        assert float(seen["val/miou"].compute()) == pytest.approx(expected)
        assert torch.isfinite(seen["val/loss"])


def test_the_segmenter_refuses_an_ignore_index_other_than_the_datas():
    from types import SimpleNamespace

    from feedline.datasets import Field, Fields
    from feedline.models.segmenter import check_ignore_index

    fields = Fields(
        [Field("image", "image"), Field("seg", "mask", classes=("a", "b"), ignore_index=0)], "seg"
    )
    check_ignore_index(0, SimpleNamespace(fields=fields))
    check_ignore_index(255, None)  # no datamodule (a plain loop): nothing to compare
    with pytest.raises(
        ValueError, match=r"model.ignore_index=255, .* 'seg' with 0 .*set model.ignore_index=0"
    ):
        check_ignore_index(255, SimpleNamespace(fields=fields))


def test_the_multilabel_classifier_trains_on_multi_hot_targets_and_reports_map_and_f1():
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    x = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    model = MultiLabelClassifier(num_classes=3, net=partial(SmallCNN, width=4))
    seen = logged(model)
    loss = model.training_step((x, y), 0)
    assert torch.isfinite(loss) and loss.requires_grad and "train/loss" in seen
    for logits, expected in ((10 * (2 * y - 1), 1.0), (-10 * (2 * y - 1), 0.0)):
        model = MultiLabelClassifier(num_classes=3, net=partial(Fixed, logits))
        seen = logged(model)
        with torch.no_grad():  # a mixed (soft) target counts where it is mostly there
            model.validation_step((x, y * 0.9 + 0.05), 0)
        assert float(seen["val/f1"].compute()) == pytest.approx(expected)
        # all wrong: each class's two positives tie below its two negatives, precision 2/4 at any recall
        assert float(seen["val/map"].compute()) == pytest.approx(1.0 if expected else 0.5)


def test_the_regressor_accepts_no_classes_and_reports_the_mean_absolute_error():
    y = torch.tensor([0.1, 0.25, 0.4, 0.05])
    x = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    model = ImageRegressor(num_classes=0, net=partial(SmallCNN, width=4))
    seen = logged(model)
    loss = model.training_step((x, y), 0)
    assert torch.isfinite(loss) and loss.requires_grad and "train/loss" in seen
    model = ImageRegressor(num_classes=0, net=partial(Fixed, (y + 0.1)[:, None]), loss="l1")
    seen = logged(model)
    with torch.no_grad():
        model.validation_step((x, y), 0)
    assert float(seen["val/mae"].compute()) == pytest.approx(0.1)
    assert float(seen["val/loss"]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="set model.outputs to the target's size"):
        model.training_step((x, torch.zeros((4, 2))), 0)


def test_the_shapes_source_declares_the_fields_its_config_names(make_cfg):
    from feedline.datasets.shapes.source import FIELDS

    cfg = make_cfg("source=shapes")
    assert cfg.source.fields == FIELDS and cfg.source.target == "mask"


@pytest.mark.slow
def test_each_shapes_experiment_trains_from_the_command_line(tmp_path):
    """One process, three jobs: segmentation, multi-label and regression, each reporting its metric and
    keeping its best checkpoint by it (the default checkpoint callback follows the model's metric)."""
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        "experiment=shapes_segmentation,shapes_multilabel,shapes_regression",
        "source=shapes",  # the sweep's own config composes without an experiment: name the source it sets
        "source.n=24",
        "source.size=32",
        "data.batch_size=8",
        "data.num_workers=0",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "model.net.width=4",
        "logger=none",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "PROJECT_ROOT": str(tmp_path)}
    done = subprocess.run(cmd, cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    metrics = {"0": ["val/miou"], "1": ["val/map", "val/f1"], "2": ["val/mae"]}
    for job, names in metrics.items():
        with open(sweep / job / "summary.json") as f:
            summary = json.load(f)
        for name in names:
            assert math.isfinite(summary["metrics"][name]), summary["metrics"]
        assert summary["val_metric"] == {"name": names[0], "value": summary["metrics"][names[0]]}
        assert f"summary: {names[0]}=" in done.stderr + done.stdout  # the model's own metric, said at the end
        assert summary["samples"] == {"train": 19, "val": 5}  # a seeded 20% of the 24 rows
        assert (sweep / job / "checkpoints" / "epoch00.ckpt").exists()  # the best, by the model's metric


def test_a_model_refuses_a_target_of_another_kind_and_names_the_model_to_pick():
    from types import SimpleNamespace

    from feedline.datasets import Field, Fields
    from feedline.models import ImageClassifier
    from feedline.models.training import check_target

    masks = SimpleNamespace(
        fields=Fields([Field("image", "image"), Field("seg", "mask", classes=("a", "b"))], "seg")
    )
    with pytest.raises(
        ValueError,
        match=r"ImageClassifier trains on a target of kind class, .*='seg' is of kind mask: use model=segmenter",
    ):
        check_target(ImageClassifier, masks)
    check_target(Segmenter, masks)
    tags = Fields([Field("image", "image"), Field("t", "classes", classes=("a",))], "t")
    with pytest.raises(ValueError, match="use model=multilabel"):
        check_target(Segmenter(num_classes=2, net=partial(SmallUNet, width=4)), SimpleNamespace(fields=tags))

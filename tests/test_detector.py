"""Detection: ``model=detector`` (``models/detector.py``), the shapes' COCO file (``datasets/shapes/generate.py``)
and ``experiment=shapes_detection`` from the command line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors

from feedline.datasets import Field, Fields
from feedline.datasets.shapes.generate import INSTANCES, SHAPES, materialise
from feedline.models import Detector, Segmenter
from feedline.models.detector import fasterrcnn, from_net, to_net
from feedline.models.training import check_target
from tests.conftest import ROOT_DIR


def target(boxes: list, labels: list) -> dict:
    return {
        "boxes": tv_tensors.BoundingBoxes(
            torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY", canvas_size=(64, 64)
        ),
        "labels": torch.tensor(labels, dtype=torch.int64),
        "image_id": 0,
    }


def test_the_detector_trains_a_step_and_reports_map_on_images_with_and_without_boxes():
    torch.manual_seed(0)
    model = Detector(
        num_classes=3, net=partial(fasterrcnn, min_size=64, max_size=64, box_batch_size_per_image=16)
    )
    seen: dict = {}
    model.log = lambda name, value, **kw: seen.__setitem__(name, value)
    images = torch.rand(3, 3, 64, 64)
    targets = [
        target([[4, 4, 30, 30], [34, 10, 60, 40]], [0, 2]),
        target([[2, 30, 20, 62], [25, 5, 45, 25], [40, 40, 63, 63]], [1, 1, 2]),
        target([], []),  # an image without boxes is a normal sample
    ]
    loss = model.training_step((images, targets), 0)
    assert torch.isfinite(loss) and loss.requires_grad and "train/loss" in seen
    loss.backward()
    assert model.net.roi_heads.box_predictor.cls_score.weight.grad is not None

    model.eval()
    with torch.no_grad():
        model.validation_step((list(images), targets), 0)  # a list of images, as where sizes differ
        predictions = model(images)
    model.on_validation_epoch_end()
    assert 0.0 <= float(seen["val/map"]) <= 1.0 and 0.0 <= float(seen["val/map_50"]) <= 1.0
    assert len(predictions) == 3
    for p in predictions:  # feedline's labels: the background, torchvision's 0, never comes out
        assert ((p["labels"] >= 0) & (p["labels"] < 3)).all() and p["boxes"].shape[1:] == (4,)


def test_labels_shift_past_the_background_into_the_network_and_back():
    t = target([[1, 2, 10, 12], [5, 5, 9, 9]], [0, 2])
    into = to_net(t)
    assert type(into["boxes"]) is torch.Tensor  # a plain tensor, not BoundingBoxes
    assert into["labels"].tolist() == [1, 3] and torch.equal(
        into["boxes"], t["boxes"].as_subclass(torch.Tensor)
    )
    back = from_net({"boxes": into["boxes"], "scores": torch.ones(2), "labels": into["labels"]})
    assert back["labels"].tolist() == [0, 2] and torch.equal(back["scores"], torch.ones(2))
    with pytest.raises(ValueError, match="source.fields.<name>.classes"):
        Detector(num_classes=0)


def test_the_detector_and_the_boxes_kind_name_each_other_when_the_target_does_not_fit():
    boxes = Fields([Field("image", "image"), Field("objects", "boxes", classes=("a", "b"))], "objects")
    mask = Fields([Field("image", "image"), Field("seg", "mask", classes=("a", "b"))], "seg")
    check_target(Detector, SimpleNamespace(fields=boxes))
    with pytest.raises(ValueError, match=r"Detector trains on a target of kind boxes.*use model=segmenter"):
        check_target(Detector, SimpleNamespace(fields=mask))
    with pytest.raises(ValueError, match=r"of kind boxes: use model=detector"):
        check_target(Segmenter, SimpleNamespace(fields=boxes))


def test_the_shapes_coco_file_frames_each_drawn_shape_exactly(tmp_path):
    root = materialise(str(tmp_path / "shapes"), n=12, size=32)
    with open(os.path.join(root, INSTANCES), encoding="utf-8") as f:
        coco = json.load(f)
    assert [c["name"] for c in coco["categories"]] == SHAPES
    assert [i["file_name"] for i in coco["images"]] == [f"{k:04d}.png" for k in range(12)]
    for a in coco["annotations"]:
        image = np.asarray(Image.open(os.path.join(root, "images", f"{a['image_id']:04d}.png"))).astype(int)
        mask = np.asarray(Image.open(os.path.join(root, "masks", f"{a['image_id']:04d}.png")))
        x, y, w, h = a["bbox"]
        crop = image[y : y + h, x : x + w]
        coloured = crop[(crop.max(axis=2) - crop.min(axis=2)) > 60]
        values, counts = np.unique(coloured, axis=0, return_counts=True)
        colour = values[counts.argmax()]  # a shape is one colour
        is_shape = (image == colour).all(axis=2)
        inside = is_shape[y : y + h, x : x + w]
        # the shape's colour reaches every edge of its box, and none of it lies outside the box
        assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any(), a
        assert is_shape.sum() == inside.sum() == a["area"], a
        assert (mask[y : y + h, x : x + w][inside] == a["category_id"]).all()
    # a cache written before the shapes had boxes gets the very same file
    path = tmp_path / "shapes" / INSTANCES
    written = path.read_bytes()
    path.unlink()
    materialise(root, n=12, size=32)
    assert path.read_bytes() == written


def test_shapes_detection_trains_from_the_command_line_and_reports_map(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "train.py",
        "experiment=shapes_detection",
        "source.n=16",
        "source.size=32",
        "model.net.min_size=64",
        "model.net.max_size=64",
        "data.batch_size=4",
        "data.num_workers=0",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "trainer.num_sanity_val_steps=0",
        "logger=none",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={out}",
    ]
    env = {**os.environ, "PROJECT_ROOT": str(tmp_path)}
    done = subprocess.run(cmd, cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    assert summary["val_metric"]["name"] == "val/map" and math.isfinite(summary["val_metric"]["value"])
    assert math.isfinite(summary["metrics"]["val/map_50"])
    assert summary["samples"] == {"train": 13, "val": 3}  # a seeded 20% of the 16 images

"""benchmarks/detection.py on tiny inputs: every row loads the same COCO samples as detection batches, each is
measured as the benchmark's fresh processes measure it (here in this process), and the verdicts judge
feedline's rows against the anchor and LitData. Its figures come from full-size runs, not from here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torchvision import tv_tensors

from tests.test_benchmarks import bench_module


def test_detection_benchmark_measures_each_row_on_the_same_samples(tmp_path):
    detection, peers = bench_module("detection"), bench_module("peers")
    args = argparse.Namespace(
        images=10, annotations=200, data_dir=str(tmp_path), batch_size=2, workers=0, batches=1
    )
    data = detection.prepare(args, list(detection.LOADERS))
    coco = json.loads(Path(data["json"]).read_text())
    large = json.loads(Path(data["large"]).read_text())
    assert len(coco["images"]) == 10 and len(large["annotations"]) >= 200
    assert (
        sum(1 for i in coco["images"] if not any(a["image_id"] == i["id"] for a in coco["annotations"])) == 1
    )
    args.data = json.dumps(data)
    for name, (_, _, build) in detection.LOADERS.items():
        images, targets = next(iter(build(data, args)))
        assert len(images) == len(targets) == 2, name
        for image, target in zip(images, targets):
            assert image.shape == (3, detection.SIZE, detection.SIZE) and image.dtype == torch.uint8, name
            boxes = target["boxes"]
            assert isinstance(boxes, tv_tensors.BoundingBoxes) and boxes.canvas_size == (detection.SIZE,) * 2
            # the anchor keeps COCO's category ids; feedline maps them to 0..4 (the shards hold those)
            allowed = {i for i, _ in detection.CATEGORIES} if name == detection.ANCHOR else set(range(5))
            assert len(target["labels"]) == len(boxes) and set(target["labels"].tolist()) <= allowed, name
    runs = {name: [peers.child(name, args, detection.LOADERS)] for name in detection.LOADERS}
    rows = detection.summarise(runs)
    assert [row["loader"] for row in rows] == list(detection.LOADERS)
    assert all(row["images_per_s"] > 0 and row["cpu_ms"] > 0 for row in rows)
    by = {row["loader"]: row for row in rows}
    ours = by[detection.OURS]
    assert ours["vs_anchor"] == ours["cpu_ms"] / by[detection.ANCHOR]["cpu_ms"]
    assert ours["vs_litdata"] == ours["cpu_ms"] / by[detection.LITDATA]["cpu_ms"]
    lines, met = detection.verdict(rows)
    assert met[f"{detection.OURS} vs anchor"] == (ours["vs_anchor"] <= 0.5)
    assert (
        f"{detection.OURS}: CPU per sample {ours['vs_anchor']:.2f}x the anchor's (target <= 0.50x)"
        in lines[0]
    )

"""The ``source.*`` keys of each source: one typed schema per source, the one place their defaults are written.

``conf/source/<name>.yaml`` extends its schema (registered by ``feedline.conf.register``), so a misspelt key
(``source.rooot=``) or a wrong type (``source.val_fraction=abc``) fails when the config is composed, naming
``source.<key>``; each source's constructor takes its defaults from here. Standard library only: Hydra
imports it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional  # noqa: UP035 - OmegaConf reads typing's generics

from feedline.datasets.paths import IMG_EXTENSIONS

REQUIRED = "???"  # OmegaConf's MISSING: composing succeeds, using the config without setting it fails


@dataclass
class FolderOptions:
    _target_: str = "feedline.datasets.FolderSource"
    root: str = REQUIRED  # root/<class>/**/<image>
    val_root: Optional[str] = None  # noqa: UP045 - a separate class-folder tree for validation
    val_fraction: float = 0.1  # else: a seeded, per-class share of root goes to val (0 = all train)
    test_root: Optional[str] = None  # noqa: UP045 - a separate class-folder tree for trainer.test
    test_fraction: float = 0.0  # else: a seeded, per-class share of root held out for test
    seed: int = 0
    extensions: List[str] = field(default_factory=lambda: list(IMG_EXTENSIONS))  # noqa: UP006
    cache_dir: Optional[str] = None  # noqa: UP045 - null: $FEEDLINE_CACHE_DIR, else ~/.cache/feedline
    refresh: str = "auto"  # auto: re-index when the tree changed | always | never
    scan_workers: Any = "auto"  # auto: 16 threads on network filesystems, a process per CPU on local disks


@dataclass
class LazyFolderOptions:
    _target_: str = "feedline.datasets.LazyFolderSource"
    root: str = REQUIRED  # root/<class>/0.<ext> .. <n-1>.<ext>
    val_fraction: float = 0.1  # seeded, per class: the same split `folder` draws from the original tree
    test_fraction: float = 0.0  # a seeded, per-class share held out for trainer.test (as `folder` draws it)
    test_root: Optional[str] = None  # noqa: UP045 - or a separate lazy layout (same classes) for test
    seed: int = 0
    extension: Optional[str] = None  # noqa: UP045 - null: detected per class (one extension per class)
    verify: bool = False  # true: check every class holds exactly 0..n-1 before training
    cache_dir: Optional[str] = None  # noqa: UP045
    refresh: str = "auto"  # auto: re-count when a class folder changed | always | never


@dataclass
class HDF5Options:
    _target_: str = "feedline.datasets.HDF5Source"
    path: str = REQUIRED  # the HDF5 file (convert.py ... out.path=...)
    val_path: Optional[str] = None  # noqa: UP045 - a separate file for validation
    val_fraction: float = 0.1  # else: a seeded, per-class share (the same split `folder` draws)
    test_path: Optional[str] = None  # noqa: UP045 - a separate file for trainer.test
    test_fraction: float = 0.0  # else: a seeded, per-class share held out for test
    seed: int = 0
    images_key: str = "images"  # foreign files: the dataset holding images
    labels_key: str = "labels"
    layout: str = "auto"  # auto (from the file) | hwc | chw  (array images)
    dtype: Optional[str] = None  # noqa: UP045 - uint8 (0..255) | float32 (0..1); null: from the file
    classes: Optional[List[str]] = None  # noqa: UP006, UP045 - names; null: from the file, else 0..max(label)
    cache_dir: Optional[str] = None  # noqa: UP045
    # named fields: name -> {column: <dataset>, kind: ..., classes: [...]} (docs/sources/hdf5.md#named-fields);
    # empty: the file's own (convert.py writes them), else images and labels (classification). A mapping, not
    # null: OmegaConf cannot merge `+source.fields={...}` from the command line into a null
    fields: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    target: Optional[str] = None  # noqa: UP045 - the field that is `y` in `x, y = batch`; null: the file's own


@dataclass
class ShardsOptions:
    _target_: str = "feedline.datasets.ShardsSource"
    path: str = REQUIRED  # a shards directory (convert.py ... out.format=shards out.path=...)
    val_path: Optional[str] = None  # noqa: UP045 - a separate shards directory for validation
    val_fraction: float = 0.1  # else: a seeded, per-class share held out for val
    test_path: Optional[str] = None  # noqa: UP045 - a separate shards directory for trainer.test
    test_fraction: float = 0.0  # else: a seeded, per-class share held out for test
    seed: int = 0
    # the train order shuffles the samples of this many chunks together (datasets/shards/order.py); the default
    # is benchmarks/shard_mixing.py's pick (tests/test_shard_mixing.py): a node holds ~2 x window chunks
    window: int = 32
    cache_dir: Optional[str] = None  # noqa: UP045 - where the split arrays (and chunks from a URL) are kept
    # a URL source.path (s3://bucket/prefix): its chunk cache's hard bound on disk, and boto3's settings for
    # this source alone (endpoint_url, region_name, aws_access_key_id, ..., profile_name; storage/stores.py)
    cache_limit: Any = "20GB"
    storage_options: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006


@dataclass
class WdsOptions:
    _target_: str = "feedline.datasets.WdsSource"
    path: str = REQUIRED  # WebDataset tars: a directory of *.tar, one tar, or shards-{000000..000009}.tar
    val_path: Optional[str] = None  # noqa: UP045 - other tars for validation (the same forms)
    val_fraction: float = 0.1  # else: a seeded, per-class share held out for val
    test_path: Optional[str] = None  # noqa: UP045 - other tars for trainer.test
    test_fraction: float = 0.0  # else: a seeded, per-class share held out for test
    seed: int = 0
    label_key: str = "label"  # the field of <key>.json holding the label (a <key>.cls is read first)
    cache_dir: Optional[str] = None  # noqa: UP045 - where the tar index and the split arrays are kept
    # field -> {column: a member's extension (jpg, seg.png, json), kind, classes, ...}; empty: image and cls/json label
    fields: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    target: Optional[str] = None  # noqa: UP045 - the field that is y in x, y = batch (with fields)


@dataclass
class ManifestOptions:
    _target_: str = "feedline.datasets.ManifestSource"
    path: str = REQUIRED  # the table: .csv, .tsv, .parquet, or a "path label" .txt list
    root: Optional[str] = None  # noqa: UP045 - where relative paths start; null: the table's folder
    # field -> {column, kind, classes, ignore_index, separator}; empty: columns image and label (a .txt: path, label)
    fields: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    target: Optional[str] = None  # noqa: UP045 - the field that is y in x, y = batch; null: label, or the one non-image field
    val_path: Optional[str] = None  # noqa: UP045 - another table (the same fields) for validation
    val_fraction: float = 0.1  # else: a seeded share of path, stratified on a class target
    test_path: Optional[str] = None  # noqa: UP045 - another table for trainer.test
    test_fraction: float = 0.0  # else: a seeded share of path held out for test
    seed: int = 0
    cache_dir: Optional[str] = None  # noqa: UP045 - where the index and the splits are kept


@dataclass
class SegFolderOptions:
    _target_: str = "feedline.datasets.SegFolderSource"
    root: str = REQUIRED  # root/images/<stem>.<ext> + root/masks/<stem>.png, or root/train/... (+ val/)
    classes: Optional[List[str]] = None  # noqa: UP006, UP045 - class names, index = pixel value
    num_classes: Optional[int] = None  # noqa: UP045 - or: classes "0".."K-1" (one of the two is required)
    ignore_index: int = 255  # the mask value that marks "no class" (VOC's void border)
    val_fraction: float = 0.1  # a seeded share of root for val, where root has no val/ tree
    test_fraction: float = 0.0  # a seeded share of root held out for test, where root has no test/ tree
    seed: int = 0
    extensions: List[str] = field(default_factory=lambda: list(IMG_EXTENSIONS))  # noqa: UP006 - of images
    cache_dir: Optional[str] = None  # noqa: UP045 - null: $FEEDLINE_CACHE_DIR, else ~/.cache/feedline
    refresh: str = "auto"  # auto: re-index when a folder changed | always | never


@dataclass
class ShapesOptions:
    _target_: str = "feedline.datasets.ShapesSource"
    root: str = REQUIRED  # where the images, masks and shapes.csv are written, once
    # field -> {column, kind, classes} as source=manifest takes them; empty: every column of shapes.csv
    fields: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    target: str = "mask"  # mask | shapes | coverage | largest | caption: the field that is y in x, y = batch
    n: int = 600  # images generated
    size: int = 64  # their side, in pixels
    val_fraction: float = 0.2  # a seeded share of the table (stratified when the target is a class)
    test_fraction: float = 0.0  # a seeded share held out for trainer.test
    seed: int = 0  # the split's seed (the images are always the same)
    cache_dir: Optional[str] = None  # noqa: UP045 - where the manifest index and the splits are kept


@dataclass
class CocoOptions:
    _target_: str = "feedline.datasets.CocoSource"
    annotations: str = REQUIRED  # the instances JSON (annotations/instances_train2017.json)
    images: str = REQUIRED  # the folder its images' file_name start from (train2017/)
    val_annotations: Optional[str] = None  # noqa: UP045 - val's JSON (with val_images); else val_fraction
    val_images: Optional[str] = None  # noqa: UP045 - the folder of val's images
    test_annotations: Optional[str] = None  # noqa: UP045 - a JSON for trainer.test (with test_images)
    test_images: Optional[str] = None  # noqa: UP045 - the folder of test's images
    val_fraction: float = 0.1  # without val_annotations: a seeded share of the images
    test_fraction: float = 0.0  # without test_annotations: a seeded share held out for test
    seed: int = 0
    crowd: bool = False  # false: iscrowd annotations are left out (torchvision's detection references do)
    empty: str = "keep"  # keep | skip: an image without (kept) annotations is a sample with no boxes, or none
    masks: bool = False  # true: each box's instance mask (polygons or RLE, through pycocotools)
    cache_dir: Optional[str] = None  # noqa: UP045 - where the index and the splits are kept


@dataclass
class ShapesCocoOptions:
    _target_: str = "feedline.datasets.ShapesCocoSource"
    root: str = REQUIRED  # where the shapes and their instances.json are written, once (source=shapes' files)
    n: int = 600  # images generated
    size: int = 64  # their side, in pixels
    val_fraction: float = 0.2  # a seeded share of the images
    test_fraction: float = 0.0  # a seeded share held out for trainer.test
    seed: int = 0  # the split's seed (the images are always the same)
    masks: bool = False  # true: each box's instance mask (the shape's pixels) in objects.masks
    cache_dir: Optional[str] = None  # noqa: UP045 - where the coco index and the splits are kept

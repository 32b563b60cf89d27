"""Loader throughput: torchvision ImageFolder's classic pipeline against feedline's backends, one run.

    python benchmarks/throughput.py [--images 5000] [--workers 2] [--repeat 5] [--json results.json]

Data: an ImageNet-like tree of JPEGs (about 500x375, quality 75-95) cut from the two photos scikit-learn
ships, made once under --data-dir, and its HDF5 conversions (encoded; encoded with max_side=256; raw pixels, whole images at max side 256).
Every row applies the same training crop (RandomResizedCrop 224 + flip) with the same number of workers
and counts images/s over full epochs after a warm-up; rows alternate and the median repeat is reported.
feedline rows use the `imagenet` preset and `collate=uint8`; "folder (1 process)" runs the same pipeline
with no workers, the rate each worker could reach if the loader cost nothing. The "fresh buffers" rows
turn off the collate's shared-memory buffer reuse (`collate.reuse_buffers=false`), to show what it buys.

The anchors: ImageFolder with PIL, ToTensor and Normalize (the classic pipeline), and a plain h5py
Dataset that opens its file in ``__getitem__`` (the usual fix for "HDF5 breaks with workers"), given the
same decode and transforms as feedline so that only the reading differs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from feedline.diagnostics.results import write_json  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


# -- data -----------------------------------------------------------------------------------------------
def ensure_jpeg_tree(data_dir: str, images: int, classes: int = 10) -> str:
    """JPEG crops of scikit-learn's sample photos, landscape and portrait, at random qualities."""
    root = os.path.join(data_dir, f"jpeg-{images}")
    if os.path.exists(root + ".complete"):
        return root
    from PIL import Image
    from sklearn.datasets import load_sample_images
    from tqdm import tqdm

    photos = [Image.fromarray(p) for p in load_sample_images().images]  # 427 x 640
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"n{c:04d}"), exist_ok=True)
    for i in tqdm(range(images), desc="writing JPEG tree", unit="img"):
        photo = photos[i % len(photos)]
        w, h = (500, 375) if rng.random() < 0.75 else (375, 427)
        x, y = int(rng.integers(0, photo.width - w + 1)), int(rng.integers(0, photo.height - h + 1))
        crop = photo.crop((x, y, x + w, y + h))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        crop.save(
            os.path.join(root, f"n{i % classes:04d}", f"img_{i:06d}.JPEG"), quality=int(rng.integers(75, 96))
        )
    open(root + ".complete", "w").close()
    return root


def ensure_hdf5(root: str, name: str, **options) -> str:
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.hdf5 import convert
    from feedline.writers.options import HDF5WriteOptions

    path = os.path.join(os.path.dirname(root), f"{os.path.basename(root)}-{name}.h5")
    if not os.path.exists(path) or _written_before_packing(path):
        source = FolderSource(root, val_fraction=0, cache_dir=os.path.join(os.path.dirname(root), "cache"))
        convert(source.split("train"), source.classes, HDF5WriteOptions(path=path, **options))
    return path


def _written_before_packing(path: str) -> bool:
    """A file from before every non-square layout was packed into one flat array: converted again, so the
    rows measure what convert.py writes now."""
    import h5py

    with h5py.File(path, "r") as f:
        return f["images"].ndim == 1 and "offsets" not in f


# -- rows -----------------------------------------------------------------------------------------------
def train_stack():
    """feedline's `imagenet` training stack, built from conf/transforms/imagenet.yaml."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load(os.path.join(ROOT, "conf", "transforms", "imagenet.yaml"))).train


class PlainH5(Dataset):
    """The common hand-written HDF5 Dataset: opens the file in every ``__getitem__``."""

    def __init__(self, path: str, transform):
        import h5py

        self.path, self.transform = path, transform
        with h5py.File(path, "r") as f:
            self.length = len(f["labels"])

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        import h5py

        from feedline.transforms.decode import decode

        with h5py.File(self.path, "r") as f:
            label = int(f["labels"][i])
            if "offsets" in f:  # one flat array: encoded files' bytes, or raw whole images' pixels
                start, stop = (int(x) for x in f["offsets"][i : i + 2])
                data = f["images"][start:stop]
                data = data.reshape(f["shapes"][i]) if "shapes" in f else data
            else:
                data = f["images"][i]
        image = torch.from_numpy(data).permute(2, 0, 1) if data.ndim == 3 else decode(data)
        return self.transform(image), label


def make_row(name: str, tree: str, files: dict[str, str], cache: str):
    """(dataset, collate) for one row."""
    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.folder.source import FolderSource
    from feedline.datasets.hdf5.source import HDF5Source
    from feedline.transforms.collate import Uint8Collate

    if name == "ImageFolder (PIL classic)":
        from torchvision import transforms as T
        from torchvision.datasets import ImageFolder

        classic = T.Compose(
            [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
        )
        return ImageFolder(tree, transform=classic), None
    stack = train_stack()
    kind, _, variant = name.partition(" ")
    fresh = variant.endswith(" fresh buffers")
    variant = variant.removesuffix(" fresh buffers").strip("()")
    collate = Uint8Collate(reuse_buffers=not fresh)
    if kind == "folder":
        return SampleDataset(
            FolderSource(tree, val_fraction=0, cache_dir=cache).split("train"), stack
        ), collate
    path = files[variant]
    if kind == "hdf5":
        return SampleDataset(HDF5Source(path, val_fraction=0, cache_dir=cache).split("train"), stack), collate
    return PlainH5(path, stack), collate


ROWS = [
    "ImageFolder (PIL classic)",
    "folder",
    "folder (1 process)",
    "hdf5 (encoded)",
    "h5py-plain (encoded)",
    "hdf5 (max_side=256)",
    "h5py-plain (max_side=256)",
    "hdf5 (raw max_side=256)",
    "h5py-plain (raw max_side=256)",
    "hdf5 (max_side=256) fresh buffers",
    "hdf5 (raw max_side=256) fresh buffers",
]


def measure(dataset, collate, workers: int, batch_size: int, epochs: int = 1, warmup: int = 2) -> float:
    """Images/s over ``epochs`` shuffled epochs, after ``warmup`` batches (worker start-up excluded). feedline
    rows shuffle as its train loader does (``EpochSampler``: the resumable order, a seed per sample); the
    others through torch's RandomSampler."""
    from feedline.datamodules.epoch.sampler import EpochSampler
    from feedline.datamodules.samples import SampleDataset

    ours = isinstance(dataset, SampleDataset)
    sampler = EpochSampler(len(dataset), 1, 0, True, 0, True) if ours else None
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=None if ours else True,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None,
        drop_last=True,
    )
    count, start = 0, None
    for epoch in range(epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for k, batch in enumerate(loader):
            if epoch == 0 and k < warmup:
                continue
            if start is None:
                start = time.perf_counter()
            count += len(batch[1])
        if epoch == 0 and start is None:
            raise ValueError("dataset too small for the warm-up")
    return count / (time.perf_counter() - start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rows", default=None, help="comma-separated subset of rows, by name")
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    tree = ensure_jpeg_tree(args.data_dir, args.images)
    files = {
        "encoded": ensure_hdf5(tree, "encoded"),
        "max_side=256": ensure_hdf5(tree, "max256", max_side=256),
        "raw max_side=256": ensure_hdf5(tree, "rawmax256", mode="raw", max_side=256),
    }
    cache = os.path.join(args.data_dir, "cache")
    rows = [r for r in ROWS if not args.rows or r in args.rows.split(",")]
    rates: dict[str, list[float]] = {r: [] for r in rows}
    for _ in range(args.repeat):
        for row in rows:
            single = row.endswith(" (1 process)")
            dataset, collate = make_row(row.removesuffix(" (1 process)"), tree, files, cache)
            rates[row].append(measure(dataset, collate, 0 if single else args.workers, args.batch_size))
    median = {r: statistics.median(v) for r, v in rates.items()}
    anchor = median.get(ROWS[0])

    targets = {"folder": 2.2, "hdf5 (max_side=256)": 4.0, "hdf5 (raw max_side=256)": 6.0}
    result_rows = []
    print(
        f"\nthroughput: {args.images} JPEGs (~500x375), RandomResizedCrop 224 + flip, {args.workers} workers, "
        f"batch {args.batch_size}; images/s, median of {args.repeat}\n"
    )
    print("| row | images/s | vs ImageFolder | target | met |\n|---|---:|---:|---|---|")
    for row in rows:
        ratio = median[row] / anchor if anchor else None
        checks = []
        if row in targets and ratio is not None:
            checks.append((f">= {targets[row]:g}x ImageFolder", ratio >= targets[row]))
        if row == "folder" and "folder (1 process)" in median:
            share = median[row] / (args.workers * median["folder (1 process)"])
            checks.append((f">= 85% of {args.workers} x 1 process ({share:.0%})", share >= 0.85))
        if row.startswith("hdf5") and "fresh" not in row:
            plain = "h5py-plain" + row[4:]
            if plain in median:
                checks.append(
                    (f">= h5py-plain ({median[row] / median[plain]:.2f}x)", median[row] >= median[plain])
                )
        target = "; ".join(t for t, _ in checks)
        met = "; ".join("yes" if ok else "NO" for _, ok in checks)
        print(f"| {row} | {median[row]:.0f} | {f'{ratio:.2f}x' if ratio else ''} | {target} | {met} |")
        result_rows.append(
            {
                "row": row,
                "images_per_s": median[row],
                "runs": rates[row],
                "ratio": ratio,
                "checks": [{"target": t, "met": bool(ok)} for t, ok in checks],
            }
        )
    result = {
        "images": args.images,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "rows": result_rows,
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

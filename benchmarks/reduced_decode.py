"""Reduced-size JPEG decode: large photos through an eval stack, decoded at full size or reduced.

    python benchmarks/reduced_decode.py [--images 200] [--side 2048] [--repeat 3] [--json results.json]

Data: JPEGs of about ``--side`` x 2/3 ``--side`` pixels (quality 85), made once under --data-dir by
upscaling the two photos scikit-learn ships. Every row reads the same files through the same
Resize 256 + CenterCrop 224 in one process and reports images/s (median of alternating repeats):
ImageFolder with PIL (the classic pipeline), feedline with ``data.reduced_decode=false`` (torchvision.io at
full size) and feedline with ``data.reduced_decode=true`` (DCT-scaled decode when the Resize allows it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from feedline.diagnostics.results import write_json  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def ensure_tree(data_dir: str, images: int, side: int) -> str:
    root = os.path.join(data_dir, f"photos-{images}x{side}")
    if os.path.exists(root + ".complete"):
        return root
    from PIL import Image
    from sklearn.datasets import load_sample_images
    from tqdm import tqdm

    photos = [Image.fromarray(p) for p in load_sample_images().images]
    size = (side, side * 2 // 3)
    big = [p.resize(size, Image.BICUBIC) for p in photos]
    for c in range(2):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
    for i in tqdm(range(images), desc="writing large JPEGs", unit="img"):
        photo = big[i % 2].transpose(Image.FLIP_LEFT_RIGHT) if i % 4 >= 2 else big[i % 2]
        photo.save(os.path.join(root, f"c{i % 2}", f"{i:05d}.jpg"), quality=85)
    open(root + ".complete", "w").close()
    return root


def rows(tree: str, cache: str) -> dict:
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    from feedline.datamodules.samples import SampleDataset
    from feedline.datasets.folder.source import FolderSource

    records = FolderSource(tree, val_fraction=0, cache_dir=cache).split("train")
    stack = v2.Compose([v2.Resize(256, antialias=True), v2.CenterCrop(224)])
    classic = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    return {
        "ImageFolder (PIL classic)": ImageFolder(tree, transform=classic),
        "feedline, full-size decode": SampleDataset(records, stack, reduced_decode=False),
        "feedline, reduced decode": SampleDataset(records, stack, reduced_decode=True),
    }


def measure(dataset) -> float:
    dataset[0]
    start = time.perf_counter()
    for i in range(len(dataset)):
        dataset[i]
    return len(dataset) / (time.perf_counter() - start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--side", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", ".data"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # one core, as one DataLoader worker has
    tree = ensure_tree(args.data_dir, args.images, args.side)
    datasets = rows(tree, os.path.join(args.data_dir, "cache"))
    rates: dict[str, list[float]] = {name: [] for name in datasets}
    for _ in range(args.repeat):
        for name, dataset in datasets.items():
            rates[name].append(measure(dataset))
    median = {name: statistics.median(v) for name, v in rates.items()}
    anchor, full = median["ImageFolder (PIL classic)"], median["feedline, full-size decode"]

    print(
        f"\nreduced decode: {args.images} JPEGs of {args.side}x{args.side * 2 // 3}, Resize 256 + CenterCrop 224, "
        f"one process; images/s, median of {args.repeat}\n"
    )
    print("| row | images/s | vs ImageFolder | vs full-size decode |\n|---|---:|---:|---:|")
    result_rows = []
    for name, rate in median.items():
        print(f"| {name} | {rate:.1f} | {rate / anchor:.2f}x | {rate / full:.2f}x |")
        result_rows.append(
            {
                "row": name,
                "images_per_s": rate,
                "runs": rates[name],
                "ratio": rate / anchor,
                "vs_full_decode": rate / full,
            }
        )
    result = {"images": args.images, "side": args.side, "repeat": args.repeat, "rows": result_rows}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()

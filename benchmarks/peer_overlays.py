"""The peers that cannot share feedline's environment: FFCV, NVIDIA DALI (CPU only), Mosaic Streaming.

Each is installed by ``benchmarks/install_peers.sh`` into an overlay folder of its own (``pip install
--target``; Mosaic Streaming with the numpy < 2.2 it pins) and runs in a child process whose PYTHONPATH starts
with that folder, so torch, torchvision and psutil still come from the environment feedline runs in.

Same contract as ``peers.py``: every loader is ``build(data, args)`` returning an iterable of ``(images,
labels)`` batches, images uint8 [B, 3, 224, 224], doing: read, decode, RandomResizedCrop 224 (scale 0.08-1,
ratio 3/4-4/3), random horizontal flip, ``args.batch_size`` per batch, ``args.workers`` workers (processes) or
threads, shuffled. Only the standard library is imported at module level.
"""

from __future__ import annotations

import os

from peer_work import crop_and_flip, decode_jpeg, samples

PEERS = ("ffcv", "dali", "mosaic")
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".peers")


def overlays_dir() -> str:
    return os.environ.get("FEEDLINE_PEERS_DIR", DEFAULT_DIR)


def overlay_installed(peer: str) -> bool:
    return os.path.exists(os.path.join(overlays_dir(), peer, ".installed"))


def overlay_env(peer: str) -> dict:
    """The environment of a child process that sees ``peer``'s overlay before everything else."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    parts = [
        os.path.join(overlays_dir(), peer),
        here,
        *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if peer == "ffcv":
        env.setdefault("OMP_NUM_THREADS", "1")  # numba's own pool is sized by num_workers
    return env


# == FFCV ===================================================================================================
FFCV_VARIANTS = {
    # data key: RGBImageField options
    "ffcv_jpg": dict(write_mode="jpg"),  # JPEG, full size (re-encoded by FFCV at jpeg_quality=90)
    "ffcv_jpg256": dict(write_mode="jpg", max_resolution=256),  # JPEG, longer side <= 256
    "ffcv_raw256": dict(write_mode="raw", max_resolution=256),  # raw RGB pixels, longer side <= 256
}


class _FolderImages:
    """Indexable (PIL RGB image, label) view of a JPEG tree, the input FFCV's DatasetWriter wants."""

    def __init__(self, tree: str):
        self.items = samples(tree)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        from PIL import Image

        path, label = self.items[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label


def ensure_ffcv(tree: str, data_dir: str, variants=tuple(FFCV_VARIANTS), num_workers: int = 1) -> dict:
    """Write the FFCV .beton files for ``variants`` (made once each); returns {data key: path}."""
    paths = {}
    for key in variants:
        path = os.path.join(data_dir, f"{os.path.basename(tree)}-{key}.beton")
        if not os.path.exists(path + ".complete"):
            from ffcv.fields import IntField, RGBImageField
            from ffcv.writer import DatasetWriter

            fields = {"image": RGBImageField(**FFCV_VARIANTS[key]), "label": IntField()}
            DatasetWriter(path, fields, num_workers=num_workers).from_indexed_dataset(_FolderImages(tree))
            open(path + ".complete", "w").close()
        paths[key] = path
    return paths


def ffcv_loader(key: str):
    """build(data, args) for the FFCV file ``data[key]`` (one of FFCV_VARIANTS)."""

    def build(data, args):
        from ffcv.fields.basics import IntDecoder
        from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

        pipelines = {
            # default scale (0.08, 1) and ratio (3/4, 4/3); ToTorchImage leaves uint8 alone (it only
            # reinterprets float16), and returns an NCHW view of channels-last memory (channels_last=True).
            "image": [
                RandomResizedCropRGBImageDecoder((224, 224)),
                RandomHorizontalFlip(),
                ToTensor(),
                ToTorchImage(),
            ],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        }
        return Loader(
            data[key],
            batch_size=args.batch_size,
            num_workers=args.workers,  # numba threads in this process, not worker processes
            order=OrderOption.RANDOM,
            os_cache=True,
            drop_last=False,
            pipelines=pipelines,
        )

    return build


# == NVIDIA DALI, CPU only ==================================================================================
class _DALIBatches:
    """Iterable of (images uint8 [B,3,224,224], labels int64 [B]) over one epoch per ``iter()``."""

    def __init__(self, pipe, batch_size):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        self.iterator = DALIGenericIterator(
            [pipe],
            ["images", "labels"],
            reader_name="Reader",
            last_batch_policy=LastBatchPolicy.PARTIAL,
            auto_reset=True,
        )

    def __iter__(self):
        for (out,) in self.iterator:
            yield out["images"], out["labels"].view(-1).long()

    def __len__(self):
        return len(self.iterator)


def _dali_build(data, args, roi_decode: bool):
    from nvidia.dali import fn, pipeline_def, types

    area, aspect = [0.08, 1.0], [3 / 4, 4 / 3]

    @pipeline_def(batch_size=args.batch_size, num_threads=args.workers, device_id=None)  # CPU only
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=data["tree"], random_shuffle=True, name="Reader")
        if roi_decode:  # decodes only the crop window (libjpeg-turbo ROI decode), then resizes it
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=types.RGB, random_area=area, random_aspect_ratio=aspect
            )
            images = fn.resize(images, resize_x=224, resize_y=224)
        else:  # full decode, then crop + resize in one op
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.random_resized_crop(
                images, size=(224, 224), random_area=area, random_aspect_ratio=aspect
            )
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        images = fn.transpose(images, perm=[2, 0, 1])  # HWC -> CHW, like the other loaders' batches
        return images, labels

    pipe = pipeline()
    pipe.build()
    return _DALIBatches(pipe, args.batch_size)


def dali_loader(data, args):
    """DALI CPU: fn.decoders.image_random_crop (ROI decode) + fn.resize + fn.flip, ``args.workers`` threads."""
    return _dali_build(data, args, roi_decode=True)


def dali_loader_full_decode(data, args):
    """DALI CPU: fn.decoders.image + fn.random_resized_crop + fn.flip, ``args.workers`` threads."""
    return _dali_build(data, args, roi_decode=False)


# == Mosaic Streaming ======================================================================================
def ensure_mosaic(tree: str, data_dir: str) -> dict:
    """MDS shards of {"jpg": JPEG bytes as stored, "cls": int label}."""
    root = os.path.join(data_dir, f"{os.path.basename(tree)}-mds")
    if not os.path.exists(root + ".complete"):
        from streaming import MDSWriter

        with MDSWriter(out=root, columns={"jpg": "bytes", "cls": "int"}, size_limit="64mb") as writer:
            for path, label in samples(tree):
                with open(path, "rb") as f:
                    writer.write({"jpg": f.read(), "cls": label})
        open(root + ".complete", "w").close()
    return {"mds": root}


def mosaic_loader(data, args):
    import streaming
    from torch.utils.data import DataLoader

    transform = crop_and_flip()

    class Dataset(streaming.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return transform(decode_jpeg(item["jpg"])), item["cls"]

    # Stale shared memory from a killed earlier run would otherwise make the new dataset fail to start.
    streaming.base.util.clean_stale_shared_memory()
    dataset = Dataset(local=data["mds"], shuffle=True, batch_size=args.batch_size)
    return DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True)


# name: (format class, overlay, build)
LOADERS = {
    "FFCV (JPEG, full size)": ("JPEG tree", "ffcv", ffcv_loader("ffcv_jpg")),
    "DALI CPU (ROI decode)": ("JPEG tree", "dali", dali_loader),
    "DALI CPU (full decode)": ("JPEG tree", "dali", dali_loader_full_decode),
    "Mosaic Streaming": ("JPEG tree", "mosaic", mosaic_loader),
    "FFCV (JPEG at 256 px)": ("256 px", "ffcv", ffcv_loader("ffcv_jpg256")),
    "FFCV (raw at 256 px)": ("raw", "ffcv", ffcv_loader("ffcv_raw256")),
}
CONVERTERS = {"ffcv": ensure_ffcv, "mosaic": ensure_mosaic}  # DALI reads the JPEG tree itself

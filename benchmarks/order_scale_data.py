"""Simulated datasets for ``order_scale.py``: what feedline reads at start-up, at any size, with no image.

    shards-<N>/     a shards dataset as ``convert.py out.format=shards`` writes it (``datasets/shards/chunks.py``):
                    index.json (LitData's: one entry per chunk of ``--per-chunk`` samples), feedline.json (classes,
                    counts, settings, a sha256 per chunk), labels.npy (int64, one per sample, shuffled classes as
                    a shuffled conversion writes them) and the chunk files, sparse: each truncated to the size
                    index.json gives it (start-up only stats them; nothing reads a byte)
    mds-<N>/        the same chunks described by Mosaic Streaming's index.json (MDS shards), for the peers' rows
    folder-<N>/     class folders, empty, and under cache/ the folder index feedline would build for them
                    (``datasets/folder/index.py``: paths, offsets, labels, dirs.json, meta.json with checksums),
                    written directly instead of scanning N empty files

Each is written once, block by block (memory-mapped ``.npy`` files, never one array of N), and marked complete
by a ``.complete`` file beside it; a run finds it there and reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib

import numpy as np

BLOCK = 1 << 24  # samples written per block
CLASSES = 1000
SAMPLE_BYTES = 110_000  # a chunk's bytes in index.json: ~600 ImageNet-sized JPEGs, 66 MB
LITDATA_CONFIG = {  # index.json's config, as LitData's writer records (image bytes, int label) samples
    "chunk_bytes": 64_000_000,
    "chunk_size": None,
    "compression": None,
    "compression_batch_size": None,
    "compression_level": None,
    "data_format": ["bytes", "int"],
    "data_spec": '[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": '
    'null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]',
    "encryption": None,
    "ipc_compression": None,
    "item_loader": "PyTreeLoader",
    "types": "json",
}


def _done(path: str) -> bool:
    return os.path.exists(path + ".complete")


def _complete(path: str, what: dict) -> str:
    with open(path + ".complete", "w") as f:
        json.dump(what, f)
    return path


def chunk_sizes(samples: int, per_chunk: int) -> np.ndarray:
    sizes = np.full(-(-samples // per_chunk), per_chunk, dtype=np.int64)
    sizes[-1] = samples - per_chunk * (len(sizes) - 1)
    return sizes


def _labels(path: str, samples: int, class_major: bool, dtype) -> None:
    """labels.npy of ``samples`` labels, written in blocks into a mapped file: shuffled classes (a shuffled
    conversion), or class-major runs of equal counts (a folder index)."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(samples,))
    rng = np.random.default_rng(0)
    per_class = -(-samples // CLASSES)
    for a in range(0, samples, BLOCK):
        b = min(samples, a + BLOCK)
        out[a:b] = np.arange(a, b) // per_class if class_major else rng.integers(0, CLASSES, b - a)
    out.flush()
    del out


def ensure_shards(data_dir: str, samples: int, per_chunk: int = 600) -> str:
    """The simulated shards dataset of ``samples`` samples in chunks of ``per_chunk``."""
    out = os.path.join(data_dir, f"shards-{samples}")
    if _done(out):
        return out
    os.makedirs(out, exist_ok=True)
    sizes = chunk_sizes(samples, per_chunk)
    names = [f"chunk-0-{c}.bin" for c in range(len(sizes))]
    entries = []
    for name, size in zip(names, sizes.tolist()):
        head = 4 * (size + 2)
        nbytes = head + size * SAMPLE_BYTES
        offsets = head + SAMPLE_BYTES * np.arange(size + 1, dtype="<u4")
        with open(os.path.join(out, name), "wb") as f:
            f.write(np.uint32(size).tobytes() + offsets.astype("<u4").tobytes())  # the head a reader maps
            f.truncate(nbytes)  # the samples sparse: no block of theirs is written
        entries.append({"chunk_bytes": nbytes, "chunk_size": size, "dim": None, "filename": name})
    _labels(os.path.join(out, "labels.npy"), samples, False, np.int64)
    sidecar = {
        "format": "feedline-shards/1",
        "classes": [f"n{c:05d}" for c in range(CLASSES)],
        "samples": samples,
        "skipped": 0,
        "chunks": len(names),
        "max_side": 0,
        "quality": 90,
        "shuffle": True,
        "seed": 0,
        "rows": samples,
        "part": None,
        "parts": None,
        "source": "simulated (benchmarks/order_scale_data.py)",
        "source_kind": "FolderRecords",
        "mode": "encoded",
        "chunk_bytes": LITDATA_CONFIG["chunk_bytes"],
        "chunk_digests": {
            "algorithm": "sha256",
            "chunks": {name: hashlib.sha256(name.encode()).hexdigest() for name in names},
        },
    }
    with open(os.path.join(out, "feedline.json"), "w") as f:
        json.dump(sidecar, f, indent=1)
    index = {"chunks": entries, "config": LITDATA_CONFIG, "updated_at": f"{time.time():.6f}"}
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True)  # last, as LitData's writer does
    return _complete(out, {"samples": samples, "per_chunk": per_chunk})


def ensure_mds(data_dir: str, samples: int, per_chunk: int = 600) -> str:
    """Mosaic Streaming's index.json (MDS, version 2) over shards of ``per_chunk`` samples; no shard file."""
    out = os.path.join(data_dir, f"mds-{samples}")
    if _done(out):
        return out
    os.makedirs(out, exist_ok=True)
    shards = [
        {
            "column_encodings": ["bytes", "int"],
            "column_names": ["image", "label"],
            "column_sizes": [None, 8],
            "compression": None,
            "format": "mds",
            "hashes": [],
            "raw_data": {
                "basename": f"shard.{c:05d}.mds",
                "bytes": 4 * (size + 2) + size * SAMPLE_BYTES,
                "hashes": {},
            },
            "samples": size,
            "size_limit": 1 << 26,
            "version": 2,
            "zip_data": None,
        }
        for c, size in enumerate(chunk_sizes(samples, per_chunk).tolist())
    ]
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"shards": shards, "version": 2}, f)
    return _complete(out, {"samples": samples, "per_chunk": per_chunk})


def _file_record(path: str) -> dict:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    st = os.stat(path)
    return {"crc32": crc, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def ensure_folder(data_dir: str, samples: int) -> tuple[str, str]:
    """(root, cache_dir): empty class folders, and the folder index of ``samples`` files in them
    (``n00000/n00000_0000000.JPEG``, ...) that ``FolderSource`` maps without scanning."""
    from feedline.datasets.cache import json_checksum
    from feedline.datasets.folder.index import FORMAT, index_dir
    from feedline.datasets.paths import IMG_EXTENSIONS, normalize_extensions

    root = os.path.join(data_dir, f"folder-{samples}")
    cache = os.path.join(data_dir, f"folder-{samples}-cache")
    if _done(root):
        return root, cache
    classes = [f"n{c:05d}" for c in range(CLASSES)]
    past = time.time_ns() - 60 * 10**9
    for name in classes:
        os.makedirs(os.path.join(root, name), exist_ok=True)
        os.utime(os.path.join(root, name), ns=(past, past))
    os.utime(root, ns=(past, past))
    extensions = normalize_extensions(IMG_EXTENSIONS)
    dest = index_dir(root, extensions, cache)
    os.makedirs(dest, exist_ok=True)
    per_class = -(-samples // CLASSES)
    counts = [min(per_class, max(0, samples - c * per_class)) for c in range(CLASSES)]
    digits = max(7, len(str(per_class)))
    width = 6 + 1 + 6 + 1 + digits + 5 + 1  # n00000/n00000_<i>.JPEG NUL
    paths = np.lib.format.open_memmap(dest / "paths.npy", mode="w+", dtype=np.uint8, shape=(samples * width,))
    offsets = np.lib.format.open_memmap(dest / "offsets.npy", mode="w+", dtype=np.int64, shape=(samples + 1,))
    for a in range(0, samples, BLOCK):
        rows = np.arange(a, min(samples, a + BLOCK), dtype=np.int64)
        c, i = rows // per_class, rows % per_class
        name = np.zeros((len(rows), width), dtype=np.uint8)
        name[:, [0, 7]], name[:, 6], name[:, 13] = ord("n"), ord("/"), ord("_")
        name[:, width - 6 : width - 1] = np.frombuffer(b".JPEG", dtype=np.uint8)
        for k in range(5):  # the class's digits, twice
            name[:, 5 - k] = name[:, 12 - k] = ord("0") + (c // 10**k) % 10
        for k in range(digits):
            name[:, 13 + digits - k] = ord("0") + (i // 10**k) % 10
        paths[a * width : (a + len(rows)) * width] = name.reshape(-1)
        offsets[a : a + len(rows)] = rows * width
    offsets[samples] = samples * width
    paths.flush(), offsets.flush()
    del paths, offsets
    _labels(str(dest / "labels.npy"), samples, True, np.int16)
    dirs = [("", os.stat(root).st_mtime_ns)] + [
        (n, os.stat(os.path.join(root, n)).st_mtime_ns) for n in classes
    ]
    (dest / "dirs.json").write_text(json.dumps(dirs))
    names = ("paths.npy", "offsets.npy", "labels.npy", "dirs.json")
    meta = {
        "format": FORMAT,
        "root": os.path.abspath(root),
        "classes": classes,
        "counts": counts,
        "num_samples": samples,
        "extensions": list(extensions),
        "scan_started_ns": past,
        "build_seconds": 0.0,
        "symlink_loops": [],
        "unreadable_dirs": [],
        "skipped_entries": [],
        "files": {name: _file_record(str(dest / name)) for name in names},
    }
    meta["checksum"] = json_checksum(meta)
    (dest / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    _complete(root, {"samples": samples})
    return root, cache

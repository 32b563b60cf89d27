"""``peers.py``'s data in the formats of this environment's peers (WebDataset tar shards, LitData's chunks),
converted once from the JPEG tree and marked complete by a file beside them."""

from __future__ import annotations

import io
import os
import tarfile

from peer_work import samples


def ensure_webdataset(tree: str, data_dir: str, per_shard: int = 500) -> list[str]:
    root = os.path.join(data_dir, f"{os.path.basename(tree)}-wds")
    items = samples(tree)
    shards = [os.path.join(root, f"shard-{k:04d}.tar") for k in range(-(-len(items) // per_shard))]
    if os.path.exists(root + ".complete"):
        return shards
    os.makedirs(root, exist_ok=True)
    for k, shard in enumerate(shards):
        with tarfile.open(shard, "w") as tar:
            for n, (path, label) in enumerate(items[k * per_shard : (k + 1) * per_shard]):
                with open(path, "rb") as f:
                    jpeg = f.read()
                for ext, payload in (("jpg", jpeg), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{k:04d}{n:06d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    open(root + ".complete", "w").close()
    return shards


def _litdata_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


def ensure_litdata(tree: str, data_dir: str) -> str:
    return optimize_once(
        _litdata_item, samples(tree), os.path.join(data_dir, f"{os.path.basename(tree)}-litdata")
    )


def optimize_once(fn, inputs: list, root: str) -> str:
    """``litdata.optimize`` of ``fn`` over ``inputs`` into ``root``, once (marked complete by a file beside it)."""
    import multiprocessing

    import litdata

    if not os.path.exists(root + ".complete"):
        # optimize() sets the start method of the whole process (spawn unless told): keep the caller's
        method = multiprocessing.get_start_method(allow_none=True)
        try:
            litdata.optimize(
                fn=fn,
                inputs=inputs,
                output_dir=root,
                chunk_bytes="64MB",
                num_workers=1,
                start_method="fork",
                verbose=False,
            )
        finally:
            multiprocessing.set_start_method(method, force=True)
        open(root + ".complete", "w").close()
    return root

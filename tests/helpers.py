"""Tiny generated image trees for tests."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
from PIL import Image

from feedline.datasets.records import Records

_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP", ".webp": "WEBP", ".tif": "TIFF"}


def image_bytes(ext: str = ".png", size=(12, 10), seed: int = 0, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, _FORMATS.get(ext.lower(), "PNG"))
    return buf.getvalue()


def make_tree(root, spec: dict[str, list[str]], backdate: bool = True) -> str:
    """``spec``: class -> relative file names. Image extensions get real images, others a text line.

    Directory mtimes are set 10 s into the past, as for a tree that has not changed since it was made,
    so tests see the index cache as fresh until they change the tree themselves.
    """
    root = str(root)
    for n, (cls, files) in enumerate(spec.items()):
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        for k, rel in enumerate(files):
            path = os.path.join(root, cls, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            ext = os.path.splitext(rel)[1].lower()
            data = image_bytes(ext, seed=n * 1000 + k) if ext in _FORMATS else b"not an image\n"
            with open(path, "wb") as f:
                f.write(data)
    if backdate:
        backdate_tree(root)
    return root


def backdate_tree(root, seconds: float = 10.0) -> None:
    past = time.time() - seconds
    for dirpath, _, _ in os.walk(root, followlinks=False):
        os.utime(dirpath, (past, past))


def simple_tree(root, classes=("cat", "dog", "eel"), per_class: int = 6, ext: str = ".png") -> str:
    return make_tree(root, {c: [f"{i:03d}{ext}" for i in range(per_class)] for c in classes})


def console_script(name: str) -> str:
    """The installed command ``name`` (``feedline-index``, ...) beside this interpreter."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    assert os.path.exists(path), f"{name} is not installed: run `make install` (pip install -e .)"
    return path


def write_tar(path, samples: dict[str, dict[str, bytes]]) -> str:
    """A WebDataset tar at ``path``: ``samples`` maps a key to its members' extensions and bytes, in order."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def wds_tars(directory, tars: int = 2, per_tar: int = 6, classes: int = 3, label: str = "cls") -> list[dict]:
    """``tars`` WebDataset shards ``shards-00000{k}.tar`` in ``directory``, ``per_tar`` samples each, PNG and
    JPEG images in turn, labelled by ``<key>.cls`` (class numbers) or ``<key>.json`` (``{"label": name}``,
    names ``c0``, ``c1``, ...). Returns every sample as {tar, key, image, label}, in order."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for t in range(tars):
        path, samples = os.path.join(str(directory), f"shards-{t:06d}.tar"), {}
        for i in range(per_tar):
            key, ext, c = f"{t:02d}{i:05d}", ("png", "jpg")[i % 2], (t * per_tar + i) % classes
            image = image_bytes(f".{ext}", seed=t * 1000 + i)
            tag = (
                {"cls": str(c).encode()}
                if label == "cls"
                else {"json": json.dumps({"label": f"c{c}"}).encode()}
            )
            samples[key] = {ext: image, **tag}
            written.append({"tar": path, "key": key, "image": image, "label": c})
        write_tar(path, samples)
    return written


def convert_cli(tmp_path, tree, *out: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python convert.py source=folder source.root=<tree> <out...>`` as a user runs it, in the checkout,
    with its cache and run directory under ``tmp_path``; asserts it succeeded."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [
        sys.executable,
        "convert.py",
        "source=folder",
        f"source.root={tree}",
        *out,
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'convert'}",
    ]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    # off a terminal, progress is plain lines: no bar redrawn with carriage returns (a log keeps each redraw)
    assert not re.search(r"\d%\|", done.stderr), done.stderr[-3000:]
    return done


def finish(process: subprocess.Popen, timeout: float = 600) -> subprocess.CompletedProcess:
    """What a command started with ``start_new_session=True`` printed, and its exit status, once it has
    ended; stopped (its whole session) if it runs past ``timeout`` seconds."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        stop_session(process)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def stop_session(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


@contextlib.contextmanager
def running_beside(process: subprocess.Popen):
    """``process`` (started with ``start_new_session=True``) left to run beside the commands the test runs
    meanwhile: the suite's own process mostly waits on them, so the second command takes the other core.
    Yields a function that waits for it (``finish``); it is stopped if the test ends first."""
    try:
        yield lambda: finish(process)
    finally:
        stop_session(process)


class SplitRows(Records):
    """Records of ``total`` rows holding ``subset`` (a split's row array): what ``Records.digest`` reads."""

    def __init__(self, total: int, subset):
        super().__init__(subset)
        self._total = total

    @property
    def total(self) -> int:
        return self._total

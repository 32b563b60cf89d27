"""The crop-window JPEG decoder (``transforms/_jpeg_window.c``) under AddressSanitizer, fed broken JPEGs.

A second copy of the extension is built with ``-fsanitize=address`` into the test's temporary directory, and
``tests/jpeg_fuzz_probe.py`` drives it in a subprocess (Python itself is not instrumented, so libasan is
preloaded there): truncations, corrupted headers and entropy data, edge windows at every scale, bad arguments.
A read or write past a buffer is ASan's report on stderr and a nonzero exit; any answer other than a bool or
``JpegError`` (or, for bad arguments, ValueError, TypeError, BufferError, OverflowError) is a failure the probe
names. The guard test proves that the same environment turns a heap overflow past a numpy array's data into a
failed subprocess, so a green fuzz run cannot come from ASan being silently off.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "transforms" / "_jpeg_window.c"
PROBE = Path(__file__).resolve().parent / "jpeg_fuzz_probe.py"
ASAN_OPTIONS = (
    "detect_leaks=0:abort_on_error=1"  # Python's own allocations are never freed at exit: no leak report
)
LEAST_DECODES = 10_000


def _compiler() -> list[str]:
    command = shlex.split(sysconfig.get_config_var("CC") or "") or ["cc"]
    if shutil.which(command[0]) is None:
        pytest.skip(f"no C compiler ({command[0]}) to build the AddressSanitizer copy of _jpeg_window.c")
    return command


def asan_environment(compiler: list[str]) -> dict[str, str]:
    """The environment a Python subprocess needs to load an ASan-built extension: libasan preloaded (it must come
    first), every Python allocation through malloc (so ASan knows each block's bounds), a report on stderr and
    an abort (nonzero exit) at the first error."""
    runtime = subprocess.run(
        [*compiler, "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(runtime) or not os.path.exists(runtime):
        pytest.skip(f"{compiler[0]} has no AddressSanitizer runtime (libasan.so)")
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [runtime, env.get("LD_PRELOAD", "")]))
    env["ASAN_OPTIONS"] = ASAN_OPTIONS
    env["PYTHONMALLOC"] = "malloc"
    return env


def build_with_asan(source: Path, directory: Path, compiler: list[str]) -> Path:
    """``source`` compiled with AddressSanitizer as ``directory/_jpeg_window<EXT_SUFFIX>``."""
    target = directory / f"_jpeg_window{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [
        *compiler,
        "-fsanitize=address",
        "-fno-omit-frame-pointer",
        "-g",
        "-O1",
        "-shared",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
        str(source),
        "-o",
        str(target),
        "-ljpeg",
    ]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0 and "jpeglib.h" in built.stderr:
        pytest.skip(f"no libjpeg headers (jpeglib.h) to build _jpeg_window.c against: {built.stderr.strip()}")
    assert built.returncode == 0, f"{shlex.join(command)} failed:\n{built.stderr}"
    return target


def run_probe(extension: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PROBE), str(extension)], capture_output=True, text=True, env=env, timeout=300
    )


def test_asan_catches_a_heap_overflow_past_a_numpy_array(tmp_path):
    """The environment the fuzz runs in turns a write one byte past a numpy array's data into a nonzero exit with
    ASan's report on stderr."""
    env = asan_environment(_compiler())
    overflow = (
        "import ctypes, numpy as np\n"
        "out = np.zeros(12, dtype=np.uint8)\n"
        "ctypes.memset(out.ctypes.data, 1, 13)\n"
        "print('not caught')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", overflow], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode != 0, f"ASan did not stop the overflow:\n{done.stdout}\n{done.stderr}"
    assert "heap-buffer-overflow" in done.stderr, done.stderr
    assert "not caught" not in done.stdout


def test_window_decoder_survives_broken_jpegs_under_asan(tmp_path):
    """Thousands of seeded decodes of truncated and corrupted JPEGs, edge windows at every scale and bad
    arguments: every call returns a bool or raises JpegError (ValueError and its kin for bad arguments), never
    reads or writes past a buffer, and a valid image's window holds its whole decode's pixels."""
    compiler = _compiler()
    env = asan_environment(compiler)
    extension = build_with_asan(SOURCE, tmp_path, compiler)
    done = run_probe(extension, env)
    report = f"exit status {done.returncode}\n--- stdout ---\n{done.stdout[-20000:]}\n--- stderr ---\n{done.stderr}"
    assert done.returncode == 0, report
    counted = re.search(r"^decodes: (\d+)$", done.stdout, re.MULTILINE)
    assert counted and int(counted.group(1)) >= LEAST_DECODES, report

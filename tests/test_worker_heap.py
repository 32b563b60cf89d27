"""Loader workers keep their heap (datamodules/workers.py, ``steady_heap``): the same sizes allocated and
freed for every sample reuse memory instead of faulting fresh pages in each time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT_DIR

# one encoded image, its decoded pixels and a batch slot, of varying sizes, a few alive at once: a worker's
# pattern; prints the page faults per sample after a warm-up
PATTERN = """
import random, sys
from feedline.datamodules.workers import WorkerInit
if sys.argv[1] == "worker":
    WorkerInit(rank=0)(0)  # what a DataLoader worker runs first
def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
rng, held = random.Random(0), []
for i in range(550):
    if i == 50:
        before = faults()
    held = [*held[-2:], bytearray(rng.randrange(50_000, 3_000_000))]
print((faults() - before) / 500)
"""


def faults_per_sample(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, cwd=ROOT_DIR, check=True
    )
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc: Linux")
def test_a_worker_reuses_its_heap_instead_of_faulting_pages_in_for_every_sample():
    plain, worker = faults_per_sample("plain"), faults_per_sample("worker")
    assert plain > 30  # glibc's defaults: fresh mappings, memory given back, pages faulted in again
    assert worker < 10, (plain, worker)

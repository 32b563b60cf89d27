"""benchmarks/peers.py runs whichever peer loaders are installed beside feedline and reports the ratios
(a smoke test of the harness: tiny data, one round; no figure is checked, only that every row is measured)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import ROOT_DIR


@pytest.mark.slow
def test_the_peer_benchmark_measures_every_installed_loader_against_feedline(tmp_path, capsys):
    sys.path.insert(0, str(ROOT_DIR / "benchmarks"))
    try:
        import peers
    finally:
        sys.path.remove(str(ROOT_DIR / "benchmarks"))
    args = [
        "--images",
        "60",
        "--rounds",
        "1",
        "--batch-size",
        "8",
        "--data-dir",
        str(tmp_path),
        "--batches",
        "2",
    ]
    result = peers.main(args)
    measured = {row["loader"]: row for row in result["rows"]}
    expected = {
        n for n, (_, module, _) in peers.LOADERS.items() if module is None or importlib.util.find_spec(module)
    }
    assert set(measured) == expected | {"feedline train.py"}
    assert measured.pop("feedline train.py")["first_batch_s"] > 0  # read from train.py's own summary
    for name, row in measured.items():  # tiny runs: CPU time can round to 0 at psutil's 10 ms resolution
        assert row["cpu_ms"] >= 0 and row["images_per_s"] > 0, name
        assert 0 < row["ready_s"] <= row["first_batch_s"] <= row["third_batch_s"], name  # from process start
    for ours in peers.OURS.values():
        assert measured[ours]["feedline_lead"] in (1.0, None)
    printed = capsys.readouterr().out
    assert "| feedline folder | JPEG tree |" in printed and "not run here" in printed

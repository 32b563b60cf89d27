"""lazy_folder: computed paths, a cached manifest, verify, and the layout tool."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

import feedline.datasets.folder.lazy as lazy
import feedline.writers.lazy_layout as lazy_layout
from feedline.datamodules.samples import BadSampleError, SampleDataset
from feedline.datasets.folder.lazy import LazyFolderSource
from feedline.datasets.folder.lazy_checks import LayoutError, verify_tree
from feedline.datasets.folder.source import FolderSource
from feedline.train import train
from feedline.writers.derived import LaidOutLazyFolderSource
from feedline.writers.lazy_layout import layout
from tests.conftest import FAST
from tests.helpers import backdate_tree, console_script, make_tree

NESTED = {
    "beta": ["b.png", "a/x.png", "a-b/y.png", "c.png"],
    "alpha": [f"{i:02d}.png" for i in range(7)],
    "gamma": ["only.png"],
}


def _lazy_tree(root, spec: dict[str, int], ext=".jpg"):
    return make_tree(root, {c: [f"{i}{ext}" for i in range(n)] for c, n in spec.items()})


def _content(records):
    return [(bytes(records[i][0]), records[i][1]) for i in range(len(records))]


def test_layout_round_trip_gives_the_folder_sources_samples(tmp_path):
    src = make_tree(tmp_path / "src", NESTED)
    layout(src, str(tmp_path / "dst"))
    backdate_tree(tmp_path / "dst")
    folder, lazy_source = (
        FolderSource(src, val_fraction=0.3, seed=1),
        LazyFolderSource(tmp_path / "dst", val_fraction=0.3, seed=1),
    )
    lazy_source.prepare()
    assert lazy_source.classes == folder.classes
    for split in ("train", "val"):
        assert _content(lazy_source.split(split)) == _content(folder.split(split))


def test_layout_writes_the_mapping_and_hard_links(tmp_path):
    src = make_tree(tmp_path / "src", NESTED)
    summary = layout(src, str(tmp_path / "dst"))
    lines = (tmp_path / "dst" / "mapping.tsv").read_text().splitlines()
    assert lines[0] == "new_path\toriginal_path" and len(lines) == 13
    assert (
        "beta/1.png\t" + os.path.join(src, "beta", "c.png") in lines
    )  # b, c, then a/x, a-b/y: ImageFolder order
    assert os.path.samefile(tmp_path / "dst" / "beta" / "1.png", os.path.join(src, "beta", "c.png"))
    assert "links: 12" in summary


def test_layout_copies_where_links_fail(tmp_path, monkeypatch):
    src = make_tree(tmp_path / "src", NESTED)
    monkeypatch.setattr(os, "link", lambda *a: (_ for _ in ()).throw(OSError(18, "cross-device link")))
    assert "copies: 12" in layout(src, str(tmp_path / "dst"))
    assert not os.path.samefile(tmp_path / "dst" / "gamma" / "0.png", os.path.join(src, "gamma", "only.png"))


@pytest.mark.parametrize("move", [False, True])
def test_interrupted_layout_is_completed_by_a_rerun(tmp_path, monkeypatch, move):
    src = make_tree(tmp_path / "src", NESTED)
    expected = _content(FolderSource(src, val_fraction=0, cache_dir=tmp_path / "c").split("train"))
    real_place, calls = lazy_layout._place, []

    def flaky(*args):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(1)
        return real_place(*args)

    monkeypatch.setattr(lazy_layout, "_place", flaky)
    with pytest.raises(KeyboardInterrupt):
        layout(src, str(tmp_path / "dst"), move=move)
    monkeypatch.setattr(lazy_layout, "_place", real_place)
    assert "already there: 5" in layout(src, str(tmp_path / "dst"), move=move)
    backdate_tree(tmp_path / "dst")
    got = LazyFolderSource(tmp_path / "dst", val_fraction=0, cache_dir=tmp_path / "c").split("train")
    assert _content(got) == expected
    assert not move or not any(files for _, _, files in os.walk(src))


def test_layout_refuses_a_foreign_non_empty_destination(tmp_path):
    src = make_tree(tmp_path / "src", NESTED)
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("mine")
    with pytest.raises(LayoutError, match="not empty and is not an earlier layout"):
        layout(src, str(tmp_path / "dst"))
    assert (tmp_path / "dst" / "keep.txt").read_text() == "mine"


def test_layout_cli(tmp_path):
    src = make_tree(tmp_path / "src", NESTED)
    cmd = [
        console_script("feedline-lazy-folder"),
        "layout",
        src,
        str(tmp_path / "dst"),
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "laid out 12 files" in out
    ok = subprocess.run(
        [console_script("feedline-lazy-folder"), "verify", str(tmp_path / "dst")],
        cwd=tmp_path,  # an installed command: it runs from anywhere
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "3 classes, 12 samples, 0 with defects" in ok.stdout


def test_classes_counts_and_extensions_per_class(tmp_path):
    root = _lazy_tree(tmp_path / "t", {"b": 3, "a": 2})
    make_tree(root, {"c": ["0.png", "1.png"]})
    source = LazyFolderSource(root, val_fraction=0)
    records = source.split("train")
    assert source.classes == ["a", "b", "c"] and len(records) == 7
    assert [records.locate(i) for i in (0, 2, 6)] == [
        (f"{root}/a/0.jpg", 0),
        (f"{root}/b/0.jpg", 1),
        (f"{root}/c/1.png", 2),
    ]


def test_mixed_extensions_name_the_class_and_files(tmp_path):
    root = _lazy_tree(tmp_path / "t", {"a": 3})
    make_tree(root, {"a": ["3.png"]})
    with pytest.raises(LayoutError, match=r"class 'a' mixes extensions.*a/3\.png.*source\.extension=\.jpg"):
        LazyFolderSource(root).prepare()
    assert len(LazyFolderSource(root, extension="jpg", val_fraction=0).split("train")) == 3


def test_verify_reports_gaps_duplicates_and_extras(tmp_path):
    root = _lazy_tree(tmp_path / "t", {"ok": 4, "gappy": 6, "dup": 3, "extra": 2})
    os.remove(os.path.join(root, "gappy", "2.jpg"))
    os.remove(os.path.join(root, "gappy", "4.jpg"))
    make_tree(root, {"dup": ["01.jpg", "1.png"], "extra": ["notes.txt", "cat.jpg"]})
    reports = {r.name: r for r in verify_tree(root)}
    assert reports["ok"].ok
    assert reports["gappy"].gaps == [2, 4] and reports["gappy"].count == 6
    assert reports["dup"].duplicates == ["01.jpg", "1.png"] and not reports["dup"].gaps
    assert reports["extra"].extras == ["cat.jpg", "notes.txt"]
    assert "2 missing: " + os.path.join(root, "gappy", "2.jpg") in reports["gappy"].describe()
    with pytest.raises(LayoutError, match=r"(?s)source\.verify found 3 class.*dup.*extra.*gappy"):
        LazyFolderSource(root, verify=True).prepare()


STRAY = """
import logging, sys
from feedline.datasets.folder.lazy_checks import LayoutError
from feedline.datasets.folder.lazy import LazyFolderSource
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
print("samples", len(LazyFolderSource(sys.argv[1], val_fraction=0).split("train")))
try:
    LazyFolderSource(sys.argv[1], verify=True).prepare()
except LayoutError as err:
    print("refused", err)
"""


def _limit_memory():  # 2 GiB of address space: counting up to the stray number would need about 100 GiB
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_stray_numbered_file_is_named_and_never_counted_up_to(tmp_path):
    root = _lazy_tree(tmp_path / "t", {"a": 3, "b": 2}, ext=".png")
    make_tree(root, {"a": ["1700000000.png"]})
    out = subprocess.run(
        [sys.executable, "-c", STRAY, root],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    stray = os.path.join(root, "a", "1700000000.png")
    assert f"1 out of range (numbered 8.png or above, never read): {stray}" in out.stdout  # warned
    assert "samples 5" in out.stdout  # a keeps 0..2
    assert "refused source.verify found 1 class(es)" in out.stdout and out.stdout.count(stray) == 2
    report = {r.name: r for r in verify_tree(root)}["a"]
    assert report.out_of_range == ["1700000000.png"] and report.count == 3 and not report.gaps


def test_a_class_whose_only_numbered_file_is_out_of_range_is_refused(tmp_path):
    root = _lazy_tree(tmp_path / "t", {"a": 3})
    make_tree(root, {"b": ["5.jpg"]})
    with pytest.raises(LayoutError, match=r"class 'b' does not hold 0\.jpg: 1 out of range.*b/5\.jpg"):
        LazyFolderSource(root).prepare()


def test_counts_on_the_fly_cover_gaps_with_a_warning(tmp_path, caplog):
    root = _lazy_tree(tmp_path / "t", {"a": 5})
    os.remove(os.path.join(root, "a", "1.jpg"))
    with caplog.at_level(logging.WARNING):
        records = LazyFolderSource(root, val_fraction=0).split("train")
    assert len(records) == 5 and "1 missing" in caplog.text  # index 1 stays: a bad sample, not a shift


def test_prepare_writes_a_manifest_that_later_ranks_map(tmp_path, monkeypatch):
    root = _lazy_tree(tmp_path / "t", {"a": 4, "b": 3})
    LazyFolderSource(root, cache_dir=tmp_path / "c").prepare()
    monkeypatch.setattr(
        lazy, "class_count", lambda *a, **k: pytest.fail("listed a class despite the manifest")
    )
    other_rank = LazyFolderSource(root, cache_dir=tmp_path / "c", val_fraction=0)
    assert len(other_rank.split("train")) == 7


def test_manifest_is_refreshed_when_a_class_changes(tmp_path):
    root = _lazy_tree(tmp_path / "t", {"a": 4, "b": 3})
    LazyFolderSource(root, cache_dir=tmp_path / "c").prepare()
    make_tree(root, {"b": ["3.jpg"]}, backdate=False)
    assert len(LazyFolderSource(root, cache_dir=tmp_path / "c", val_fraction=0).split("train")) == 8


def test_a_split_cached_for_other_counts_is_never_read_back_even_when_its_sizes_agree(tmp_path):
    from feedline.datasets.splits import stratified_split

    def val_rows():
        source = LazyFolderSource(root, cache_dir=tmp_path / "c", val_fraction=0.25)
        source.prepare()  # a manifest: the split is cached beside it
        return list(source.split("val").subset.array)

    root = _lazy_tree(tmp_path / "t", {"a": 4, "b": 5})
    assert val_rows() == list(stratified_split([4, 5], 0.25, 0)[1])
    os.remove(os.path.join(root, "b", "4.jpg"))
    make_tree(root, {"a": ["4.jpg"]}, backdate=False)  # 5 and 4 now: one val sample per class, as before
    assert val_rows() == list(stratified_split([5, 4], 0.25, 0)[1])


def test_corrupt_manifest_is_rebuilt(tmp_path, caplog):
    root = _lazy_tree(tmp_path / "t", {"a": 4})
    source = LazyFolderSource(root, cache_dir=tmp_path / "c", val_fraction=0)
    source.prepare()
    (source.manifest_dir / "manifest.json").write_text("{broken")
    with caplog.at_level(logging.WARNING):
        assert len(LazyFolderSource(root, cache_dir=tmp_path / "c", val_fraction=0).split("train")) == 4
    assert "unusable" in caplog.text


def test_missing_file_during_training_is_a_bad_sample(tmp_path, caplog):
    root = _lazy_tree(tmp_path / "t", {"a": 3, "b": 3}, ext=".png")
    records = LazyFolderSource(root, val_fraction=0).split("train")
    os.remove(os.path.join(root, "a", "1.png"))
    with caplog.at_level(logging.WARNING):
        SampleDataset(records, on_bad_sample="skip")[1]
    assert os.path.join(root, "a", "1.png") in caplog.text
    with pytest.raises(BadSampleError, match=r"a/1\.png.*data\.on_bad_sample"):
        SampleDataset(records, on_bad_sample="raise")[1]


def test_records_pickle_small(tmp_path):
    import pickle

    root = _lazy_tree(tmp_path / "t", {f"c{i}": 20 for i in range(10)})
    source = LazyFolderSource(root, cache_dir=tmp_path / "c")
    source.prepare()
    assert len(pickle.dumps(source.split("train"))) < 2048


def test_train_from_a_lazy_layout(make_cfg, tmp_path):
    src = make_tree(tmp_path / "src", NESTED)
    layout(src, str(tmp_path / "dst"))
    cfg = make_cfg(*FAST, "source=lazy_folder", f"source.root={tmp_path / 'dst'}", "transforms=digits")
    assert train(cfg)["metrics"]["train/loss"] > 0


def test_origin_is_laid_out_on_prepare_once(tree, tmp_path, monkeypatch):
    origin = FolderSource(tree, val_fraction=0)
    root = tmp_path / "lazy"
    source = LaidOutLazyFolderSource(root, origin, val_fraction=0)
    assert source.classes == origin.classes and not root.exists()
    source.prepare()
    assert len(source.split("train")) == len(origin.split("all"))
    monkeypatch.setattr(
        lazy_layout, "plan_layout", lambda *a, **k: pytest.fail("a complete layout was planned again")
    )
    LaidOutLazyFolderSource(root, origin, val_fraction=0).prepare()

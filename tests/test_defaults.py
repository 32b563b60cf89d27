"""Defaults that fit the user's data, and hints for what they mistype."""

from __future__ import annotations

import pytest

from feedline.cli.trainer_keys import check_trainer_keys, trainer_arguments
from feedline.train import train


def _stack(cfg) -> list[str]:
    return [t["_target_"].rsplit(".", 1)[-1] for t in cfg.transforms.train]


@pytest.mark.parametrize("source", ["folder", "lazy_folder"])
def test_a_tree_of_photos_without_transforms_gets_the_photo_stack(make_cfg, tree, source):
    cfg = make_cfg(f"source={source}", f"source.root={tree}")
    assert _stack(cfg) == ["RandomResizedCrop", "RandomHorizontalFlip"]
    assert cfg.transforms.batch[-1]["mean"] == [0.485, 0.456, 0.406]  # ImageNet's statistics, not the digits'


def test_an_hdf5_file_without_transforms_gets_the_photo_stack(make_cfg):
    assert _stack(make_cfg("source=hdf5", "source.path=/data/train.h5")) == [
        "RandomResizedCrop",
        "RandomHorizontalFlip",
    ]


def test_the_digits_preset_stays_with_the_digits_source(make_cfg):
    cfg = make_cfg()
    assert _stack(cfg) == ["Resize", "RandomAffine"] and list(cfg.transforms.train[0]["size"]) == [32, 32]


def test_a_named_stack_wins_over_the_sources_own(make_cfg, tree):
    assert _stack(make_cfg("source=folder", f"source.root={tree}", "transforms=cifar"))[0] == "RandomCrop"


def test_a_misspelt_trainer_key_gets_the_closest_one():
    trainer = {"_target_": "lightning.pytorch.Trainer", "max_epoch": 1, "devices": 1}
    with pytest.raises(
        ValueError, match=r"trainer\.max_epoch is not an argument .*did you mean trainer\.max_epochs\?"
    ):
        check_trainer_keys(trainer, trainer_arguments(trainer))
    check_trainer_keys({"_target_": "lightning.pytorch.Trainer", "max_epochs": 1}, trainer_arguments(trainer))


def test_a_trainer_that_takes_any_keyword_is_not_second_guessed():
    assert trainer_arguments({"_target_": "builtins.dict"}) is None


def test_train_refuses_a_misspelt_trainer_key_before_any_work(make_cfg, tree, monkeypatch):
    import feedline.train as entry

    monkeypatch.setattr(entry, "instantiate", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ValueError, match="did you mean trainer.max_epochs"):
        train(make_cfg("source=folder", f"source.root={tree}", "+trainer.max_epoch=1"))


def test_a_sweep_job_times_its_first_batch_from_its_own_start(monkeypatch):
    import feedline.callbacks.throughput as throughput

    monitor = throughput.ThroughputMonitor()
    monitor.started = 1000.0
    monkeypatch.setattr(throughput.time, "time", lambda: 1012.5)
    monkeypatch.setattr(throughput, "process_start", lambda: pytest.fail("a sweep job reads its own start"))
    monitor.on_train_batch_start(None, None, None, 0)
    assert monitor.first_batch_s == 12.5


def test_a_resume_with_one_batch_left_reports_no_rate_not_zero():
    """A fit resumed inside an epoch starts timing at its first batch's end (Lightning calls no epoch start):
    with one batch left nothing is timed, and the summary says n/a, not 0.0 samples/s."""
    from types import SimpleNamespace

    from feedline.callbacks.throughput import ThroughputMonitor

    monitor = ThroughputMonitor()
    monitor.on_train_batch_end(SimpleNamespace(world_size=1), None, None, ([0] * 8, [0] * 8), 0)
    assert monitor.samples == 0 and monitor.samples_per_second is None

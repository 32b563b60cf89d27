"""Mid-epoch resume: a run killed with SIGKILL mid-epoch and resumed from its last checkpoint receives, from
the checkpoint's step on, exactly the batches of an uninterrupted run with the same seed."""

from __future__ import annotations

import csv
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torchvision.transforms import v2

from feedline.datamodules.image import ImageDataModule
from feedline.datamodules.resume import EpochSampler, ResumeError
from feedline.datasets.folder import FolderSource
from feedline.transforms.collate import Uint8Collate
from feedline.transforms.stacks import TransformStacks
from tests.conftest import ROOT_DIR
from tests.helpers import simple_tree


# -- the sampler and the loader state, in process --------------------------------------------------------
@pytest.mark.parametrize("world_size, drop_last", [(1, False), (3, False), (3, True)])
def test_each_sample_is_read_once_per_epoch_across_a_cut_at_any_batch(world_size, drop_last):
    size, batch = 50, 4
    for cut in range(0, 5):
        seen = []
        for rank in range(world_size):
            whole = list(EpochSampler(size, world_size, rank, True, 7, drop_last))
            sampler = EpochSampler(size, world_size, rank, True, 7, drop_last)
            sampler.set_epoch(0)
            sampler.start = cut * batch
            assert list(sampler) == whole[cut * batch :]  # the very pairs, seeds included
            seen += [i for i, _ in whole]
        expected = size - size % world_size if drop_last else size
        assert len(set(seen)) == expected  # every sample once (padding repeats a few, as DistributedSampler)
    first, second = EpochSampler(size, 1, 0, True, 7, False), EpochSampler(size, 1, 0, True, 7, False)
    second.set_epoch(1)
    assert [i for i, _ in first] != [i for i, _ in second]  # a new order each epoch


def small_dm(tree, **options) -> ImageDataModule:
    stacks = TransformStacks(train=[lambda x: x + torch.randint(0, 2, (1,), dtype=torch.uint8)])  # random
    return ImageDataModule(
        FolderSource(tree, val_fraction=0),
        stacks,
        Uint8Collate(),
        **{"batch_size": 3, "num_workers": 2, "seed": 5, **options},
    )


def digests(loader, n=None):
    out = []
    for k, batch in enumerate(loader):
        if n is not None and k == n:
            break
        loader.position.batches += 1  # what on_after_batch_transfer counts under a Trainer
        out.append((batch.image.clone(), batch.label.clone()))
    return out


def test_a_restored_loader_continues_with_the_very_batches_augmentations_included(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=5)  # 15 samples, 5 batches of 3
    whole = digests(small_dm(tree).train_dataloader())
    first = small_dm(tree).train_dataloader()
    digests(first, 2)
    state = first.state_dict()
    assert state["batches"] == 2 and state["samples"] == 15 and state["batch_size"] == 3

    resumed = small_dm(tree).train_dataloader()
    resumed.load_state_dict(state)
    rest = digests(resumed)
    assert len(rest) == 3
    for (image, label), (again, again_label) in zip(whole[2:], rest):
        assert torch.equal(image, again) and torch.equal(label, again_label)


@pytest.mark.parametrize(
    "change, said",
    [
        ({"per_class": 6}, "training samples 15 then, 18 now"),
        ({"batch_size": 5}, "data.batch_size (per device) 3 then, 5 now"),
        ({"seed": 6}, "seed 5 then, 6 now"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_refused_or_restarts_the_epoch_when_lenient(
    change, said, tmp_path, caplog
):
    tree = simple_tree(tmp_path / "tree", per_class=5)
    first = small_dm(tree).train_dataloader()
    digests(first, 2)
    state = first.state_dict()
    other = simple_tree(tmp_path / "other", per_class=change.pop("per_class", 5))
    with pytest.raises(ResumeError, match=rf"{re.escape(said)}.*data\.resume=lenient"):
        small_dm(other, **change).train_dataloader().load_state_dict(state)
    lenient = small_dm(other, resume="lenient", **change).train_dataloader()
    with caplog.at_level(logging.WARNING):
        lenient.load_state_dict(state)
    assert said in caplog.text and "goes on after batch 2 in this run's order" in caplog.text
    assert lenient.position.batches == 2 and lenient.sampler.start == 2 * lenient.batch_size


def test_a_changed_world_size_is_named(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=5)
    loader = small_dm(tree).train_dataloader()
    state = {**loader.state_dict(), "world_size": 2, "batches": 1}
    with pytest.raises(ResumeError, match="processes \\(world size\\) 2 then, 1 now"):
        loader.load_state_dict(state)


# -- under a Trainer, in process ---------------------------------------------------------------------
class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 10 * 12, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Record(L.Callback):
    """Digests of the batches the model receives; ``save_at``: (epoch, batch_idx, hook) to write a checkpoint."""

    def __init__(self, path=None, save_at=None):
        self.seen, self.path, self.save_at = [], path, save_at

    def _maybe_save(self, trainer, where):
        if self.save_at == where:
            trainer.save_checkpoint(self.path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._maybe_save(trainer, (trainer.current_epoch, batch_idx, "inside"))  # as SLURM's SIGUSR1 handler
        x, y = batch
        self.seen.append((trainer.current_epoch, batch_idx, hash(x.numpy().tobytes() + y.numpy().tobytes())))

    def on_train_epoch_end(self, trainer, pl_module):
        self._maybe_save(trainer, (trainer.current_epoch, None, "epoch end"))


def lightning_dm(tree) -> ImageDataModule:
    stacks = TransformStacks(train=[v2.RandomHorizontalFlip()], batch=[v2.ToDtype(torch.float32, scale=True)])
    return ImageDataModule(
        FolderSource(tree, val_fraction=0), stacks, Uint8Collate(), batch_size=3, num_workers=1, seed=5
    )


def fit(dm, record, ckpt_path=None, **options):
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
        **{"max_epochs": 2, **options},
    )
    trainer.fit(Tiny(), datamodule=dm, ckpt_path=ckpt_path)
    return record.seen


@pytest.mark.parametrize(
    "save_at, options",
    [
        (
            (0, 3, "inside"),
            {},
        ),  # a checkpoint taken inside step 3: Lightning replays step 3, so must the loader
        (
            (0, None, "epoch end"),
            {"limit_train_batches": 3},
        ),  # an epoch cut short is over: the next one is whole
    ],
    ids=["inside-a-step", "epoch-end-with-limit_train_batches"],
)
def test_a_trainer_resumes_exactly_from_checkpoints_taken_anywhere(tmp_path, save_at, options):
    tree = simple_tree(tmp_path / "tree", per_class=5)  # 15 samples: 5 batches of 3
    reference = fit(lightning_dm(tree), Record(), **options)
    path = str(tmp_path / "cut.ckpt")
    fit(lightning_dm(tree), Record(path, save_at), **options)
    resumed = fit(lightning_dm(tree), Record(), ckpt_path=path, **options)
    assert resumed == reference[len(reference) - len(resumed) :] and resumed
    first = resumed[0][:2]
    assert first == ((0, 3) if save_at[2] == "inside" else (1, 0))


def test_a_second_fit_on_the_same_datamodule_starts_its_epoch_from_the_beginning(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=5)
    dm = lightning_dm(tree)
    fit(dm, Record(), max_steps=2)
    assert fit(dm, Record(), max_steps=2) == fit(lightning_dm(tree), Record(), max_steps=2)


class TinyWithVal(Tiny):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())


@pytest.mark.parametrize("every", [2, 4])  # 4 batches an epoch: 4 lands on the step validation follows
def test_last_ckpt_is_written_in_the_first_epoch_and_the_best_checkpoint_still_after_validation(
    tmp_path, every
):
    from feedline.callbacks.checkpoint import ModelCheckpoint

    tree = simple_tree(tmp_path / "tree", per_class=5)
    dm = ImageDataModule(
        FolderSource(tree, val_fraction=0.2), batch_size=3, num_workers=0
    )  # 12 train: 4 batches
    checkpoints = tmp_path / "checkpoints"
    seen = []

    class Look(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append((trainer.global_step, (checkpoints / "last.ckpt").exists()))

    callback = ModelCheckpoint(
        dirpath=checkpoints,
        filename="epoch{epoch:02d}",
        auto_insert_metric_name=False,
        monitor="val/acc",
        mode="max",
        save_last=True,
        every_n_train_steps=every,
    )
    trainer = L.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[Look(), callback]
    )
    trainer.fit(TinyWithVal(), datamodule=dm)
    assert [exists for step, exists in seen] == [step >= every for step, _ in seen]  # from step `every` on
    assert list(checkpoints.glob("epoch0*.ckpt"))  # the best checkpoint is still written after validation


def test_ckpt_path_last_takes_the_newest_of_last_and_the_slurm_requeue_checkpoint(tmp_path):
    from feedline.cli.checkpoints import resolve_ckpt_path

    assert resolve_ckpt_path("last", str(tmp_path)) is None  # nothing yet: a warning, a fresh start
    (tmp_path / "checkpoints").mkdir()
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.write_bytes(b"")
    os.utime(last, (1000, 1000))
    assert resolve_ckpt_path("last", str(tmp_path)) == str(last)
    hpc = tmp_path / "hpc_ckpt_1.ckpt"
    hpc.write_bytes(b"")
    os.utime(hpc, (2000, 2000))
    assert resolve_ckpt_path("last", str(tmp_path)) == str(hpc)
    assert (
        resolve_ckpt_path("/x/y.ckpt", str(tmp_path)) == "/x/y.ckpt" and resolve_ckpt_path(None, "") is None
    )


def test_the_csv_logger_appends_and_moves_aside_the_rows_of_steps_logged_again(tmp_path):
    from feedline.callbacks.csv_logger import CSVLogger

    first = CSVLogger(tmp_path, name="csv", version="")
    for step in range(4):
        first.log_metrics({"train/loss": float(step)}, step)
    first.finalize("success")
    second = CSVLogger(tmp_path, name="csv", version="")  # a launch resumed from a checkpoint at step 2
    second.log_metrics({"train/loss": 20.0}, 2)
    second.log_metrics({"val/acc": 0.5}, 3)
    second.finalize("success")
    rows = metric_rows(tmp_path / "csv" / "metrics.csv")
    assert rows == [
        {"step": "0", "train/loss": "0.0"},
        {"step": "1", "train/loss": "1.0"},
        {"step": "2", "train/loss": "20.0"},
        {"step": "3", "val/acc": "0.5"},
    ]
    replaced = metric_rows(tmp_path / "csv" / "metrics.replaced.csv")
    assert replaced == [{"step": "2", "train/loss": "2.0"}, {"step": "3", "train/loss": "3.0"}]


# -- kill -9 and resume, from the command line ----------------------------------------------------------
def train(
    tmp_path, run: str, record: str, *overrides: str, kill_after_step: int | None = None, logger: str = "none"
):
    probe = [
        "+callbacks.record._target_=tests.resume_probe.RecordBatches",
        f"+callbacks.record.path={tmp_path / record}",
    ]
    if kill_after_step is not None:
        probe.append(f"+callbacks.record.kill_after_step={kill_after_step}")
    args = [
        sys.executable,
        "train.py",
        f"paths.output_dir={tmp_path / run}",
        f"hydra.run.dir={tmp_path / run}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "trainer.max_epochs=2",
        "trainer.accelerator=cpu",
        f"logger={logger}",
        *probe,
        *overrides,
    ]
    # A session of its own: the probe kills the whole process group, as a scheduler's SIGKILL would.
    return subprocess.run(
        args, cwd=ROOT_DIR, capture_output=True, text=True, timeout=600, start_new_session=True
    )


def batches(path) -> dict[tuple[int, int], str]:
    """(epoch, batch_idx) -> digest; a batch recorded twice (run again after the resume) must agree."""
    seen: dict[tuple[int, int], str] = {}
    for line in Path(path).read_text().splitlines():
        epoch, index, digest = line.split()
        key = (int(epoch), int(index))
        assert seen.setdefault(key, digest) == digest, f"batch {key} differs after the resume"
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(
    "setup, every, kill, ranks",
    [
        (
            ["data.num_workers=2"],
            4,
            30,
            1,
        ),  # 23 steps an epoch: killed at epoch 1, batch 7; resumes from step 28
        (
            ["trainer=ddp_sim", "data.num_workers=1"],
            3,
            17,
            2,
        ),  # 12 steps an epoch per rank: killed at epoch 1, batch 5
    ],
    ids=["one-process-2-workers", "ddp_sim"],
)
def test_a_run_killed_mid_epoch_resumes_with_the_batches_of_an_uninterrupted_run(
    tmp_path, setup, every, kill, ranks
):
    options = [*setup, f"callbacks.model_checkpoint.every_n_train_steps={every}"]
    reference = train(tmp_path, "reference", "reference", *options)
    assert reference.returncode == 0, reference.stderr[-3000:]
    killed = train(tmp_path, "run", "run", *options, kill_after_step=kill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    resumed = train(tmp_path, "run", "run", *options, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumes epoch 1 at batch" in resumed.stderr + resumed.stdout
    assert "dataloader is not resumable" not in resumed.stderr  # Lightning sees a stateful loader
    for rank in range(ranks):
        expected = batches(tmp_path / f"reference.rank{rank}")
        assert batches(tmp_path / f"run.rank{rank}") == expected
        lines = (tmp_path / f"run.rank{rank}").read_text().splitlines()
        replayed = len(lines) - len(expected)
        assert 0 <= replayed < every  # the resume replays at most the steps after the last checkpoint


def metric_rows(path) -> list[dict]:
    """The rows, without their empty cells (the column set grows with what later launches log)."""
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v} for row in csv.DictReader(f)]


@pytest.mark.slow
def test_a_resumed_run_appends_to_the_metrics_of_the_run_it_resumes(tmp_path):
    """Killed after step 7 with last.ckpt from step 4, then resumed with ckpt_path=last into the same
    directory: metrics.csv keeps the killed launch's rows of the steps before the resume, and the rows of the
    steps the resume logs again move to metrics.replaced.csv."""
    tree = simple_tree(tmp_path / "tree", per_class=8)  # 21 train samples: 11 steps an epoch
    options = [
        "source=folder",
        f"source.root={tree}",
        "transforms=digits",
        "data.batch_size=2",
        "data.num_workers=0",
        "trainer.log_every_n_steps=1",
        "callbacks.model_checkpoint.every_n_train_steps=4",
        "ckpt_path=last",  # the SLURM requeue's command: the same for the first launch and every later one
    ]
    killed = train(tmp_path, "run", "run", *options, kill_after_step=7, logger="csv")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "save_last=True" not in killed.stderr + killed.stdout  # Lightning's hint: feedline sets it
    assert "no checkpoint yet" in killed.stderr + killed.stdout
    metrics = tmp_path / "run" / "csv" / "metrics.csv"
    before = metric_rows(metrics)
    assert {int(r["step"]) for r in before} >= {0, 1, 2, 3, 4, 5}

    resumed = train(tmp_path, "run", "run", *options, logger="csv")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "will be deleted" not in resumed.stderr + resumed.stdout
    after = metric_rows(metrics)
    replaced = metric_rows(tmp_path / "run" / "csv" / "metrics.replaced.csv")
    first = min(int(r["step"]) for r in replaced)
    assert first == 4  # last.ckpt was written after 4 steps: the resume logs step 4 on again
    assert replaced == [r for r in before if int(r["step"]) >= first]
    assert [r for r in after if int(r["step"]) < first] == [r for r in before if int(r["step"]) < first]
    assert max(int(r["step"]) for r in after) == 21 and {r["epoch"] for r in after} == {"0", "1"}
    steps = [int(r["step"]) for r in after if "train/loss" in r]
    assert steps == list(range(22))  # every training step once, in order: none lost, none twice

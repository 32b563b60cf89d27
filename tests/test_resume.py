"""Mid-epoch resume: a run killed with SIGKILL mid-epoch and resumed from its last checkpoint receives, from
the checkpoint's step on, exactly the batches of an uninterrupted run with the same seed."""

from __future__ import annotations

import collections
import csv
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from feedline.datamodules.epoch.order import ORDER_RULE
from feedline.datamodules.epoch.resume import ResumeError
from feedline.datamodules.epoch.sampler import EpochSampler
from feedline.datamodules.image import ImageDataModule
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.shards.chunks import Chunks, dataset_dirs
from feedline.transforms.collate import Uint8Collate
from feedline.transforms.stacks import TransformStacks
from tests.conftest import ROOT_DIR
from tests.helpers import finish, running_beside, simple_tree


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
            sampler.start = cut * batch * world_size  # samples of the epoch's order consumed by every rank
            assert list(sampler) == whole[cut * batch :]  # the very pairs, seeds included
            seen += [i for i, _ in whole]
        expected = size - size % world_size if drop_last else size
        assert len(set(seen)) == expected  # every sample once (padding repeats a few, as DistributedSampler)
    first, second = EpochSampler(size, 1, 0, True, 7, False), EpochSampler(size, 1, 0, True, 7, False)
    second.set_epoch(1)
    assert [i for i, _ in first] != [i for i, _ in second]  # a new order each epoch


def small_dm(tree, source=None, **options) -> ImageDataModule:
    stacks = TransformStacks(train=[lambda x: x + torch.randint(0, 2, (1,), dtype=torch.uint8)])  # random
    return ImageDataModule(
        source or FolderSource(tree, val_fraction=0),
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


def test_a_checkpoint_of_the_earlier_order_rule_is_refused_inside_an_epoch_and_lenient_goes_to_the_next(
    tmp_path, caplog
):
    tree = simple_tree(tmp_path / "tree", per_class=5)
    first = small_dm(tree, num_workers=0).train_dataloader()
    digests(first, 2)
    state = first.state_dict()
    assert state["order_rule"] == ORDER_RULE == 2
    earlier = {k: v for k, v in state.items() if k != "order_rule"}  # as an earlier feedline wrote it
    with pytest.raises(ResumeError, match=r"epoch order rule 1 .*this feedline draws rule 2.*lenient"):
        small_dm(tree, num_workers=0).train_dataloader().load_state_dict(earlier)
    lenient = small_dm(tree, resume="lenient", num_workers=0).train_dataloader()
    with caplog.at_level(logging.WARNING):
        lenient.load_state_dict(earlier)
    assert "the rest of epoch 0 is skipped, training goes on at epoch 1's start" in caplog.text
    assert digests(lenient) == [] and lenient.position.start == 15
    # at an epoch's start nothing of the earlier order was read: it resumes as it is
    at_start = {**earlier, "epoch": 1, "batches": 0, "consumed": 0, "segment": [0, 0]}
    again = small_dm(tree, num_workers=0).train_dataloader()
    again.load_state_dict(at_start)
    assert again.position.epoch == 1 and len(digests(again)) == 5


class WorldLoaders(ImageDataModule):
    """The datamodule as rank ``rank`` of ``world`` sees it, without a Trainer."""

    def __init__(self, *args, world=1, rank=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.world, self.rank = world, rank

    def _world(self):
        return self.world, self.rank, 1, False


def world_loaders(source, tree, world: int, batch_size: int) -> list:
    """The train loader of every rank of ``world``, over ``source``, with small_dm's random stack."""
    return [
        WorldLoaders(
            source,
            small_dm(tree).transforms,
            Uint8Collate(),
            batch_size=batch_size,
            num_workers=0,
            seed=5,
            world=world,
            rank=rank,
        ).train_dataloader()
        for rank in range(world)
    ]


def per_sample(batches) -> dict[int, bytes]:
    """label -> that sample's pixels, from batches of a tree of one image per class."""
    out = {}
    for image, label in batches:
        for x, y in zip(image, label.tolist()):
            assert y not in out, f"sample {y} read twice"
            out[y] = x.numpy().tobytes()
    return out


@pytest.mark.parametrize(
    ("world", "batch", "new_world", "new_batch"), [(2, 3, 1, 5), (1, 4, 2, 3), (2, 2, 4, 3)]
)
def test_a_resume_on_another_world_and_batch_size_reads_the_rest_of_the_epoch_once(
    tmp_path, caplog, world, batch, new_world, new_batch
):
    classes = [f"c{k:02d}" for k in range(24)]  # one image each: a label names its sample
    tree = simple_tree(tmp_path / "tree", classes=classes, per_class=1)

    def loaders(w, b):
        return world_loaders(FolderSource(tree, val_fraction=0, cache_dir=tmp_path / "c"), tree, w, b)

    whole = per_sample(b for loader in loaders(1, 4) for b in digests(loader))
    first = loaders(world, batch)
    before = [b for loader in first for b in digests(loader, 2)]
    state = first[0].state_dict()
    assert state["consumed"] == 2 * batch * world and all(loader.state_dict() == state for loader in first)

    second = loaders(new_world, new_batch)
    with caplog.at_level(logging.INFO, logger="feedline.datamodules.epoch.resume"):
        for loader in second:
            loader.load_state_dict(state)
    said = (  # the world and the batch size, each named as what it is
        f"on {new_world} rank(s), batches of {new_batch} per rank (the checkpoint's: {world} rank(s), "
        f"batches of {batch}), after {2 * batch * world} of its 24 samples"
    )
    assert said in caplog.text
    ranks = [digests(loader) for loader in second]
    assert len({len(batches) for batches in ranks}) == 1  # every rank the same number of batches
    after = [b for batches in ranks for b in batches]
    seen = per_sample(before + after)  # every sample once: none read twice (per_sample), none missed
    assert seen == whole  # and each with the augmentation it has in an uninterrupted epoch


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


def fit(dm, record, ckpt_path=None, model=None, **options):
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
        **{"max_epochs": 2, **options},
    )
    trainer.fit(model or Tiny(), datamodule=dm, ckpt_path=ckpt_path)
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
def start_train(
    tmp_path,
    run: str,
    record: str,
    *overrides: str,
    kill_after_step: int | None = None,
    logger: str = "none",
    cache: str = "cache",
) -> subprocess.Popen:
    """``python train.py`` with ``overrides``, started: its run directory ``tmp_path/run``, the batches it
    trains on recorded in ``tmp_path/record.rank<N>`` (``tests/resume_probe.py``)."""
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
        f"paths.cache_dir={tmp_path / cache}",
        "trainer.max_epochs=2",
        "trainer.accelerator=cpu",
        f"logger={logger}",
        *probe,
        *overrides,
    ]
    # A session of its own: the probe kills the whole process group, as a scheduler's SIGKILL would.
    return subprocess.Popen(
        args,
        cwd=ROOT_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def train(tmp_path, run: str, record: str, *overrides: str, **options) -> subprocess.CompletedProcess:
    """``start_train``, waited for."""
    return finish(start_train(tmp_path, run, record, *overrides, **options))


def reference_beside(tmp_path, *overrides: str, **options):
    """The uninterrupted reference run (``tmp_path/reference``, recorded in ``tmp_path/reference.rank<N>``,
    with an index cache of its own), started now and left to run beside the runs the test starts meanwhile
    (``running_beside``): a context whose value waits for it."""
    process = start_train(tmp_path, "reference", "reference", *overrides, cache="cache-reference", **options)
    return running_beside(process)


def batches(path) -> dict[tuple[int, int], str]:
    """(epoch, batch_idx) -> digest; a batch recorded twice (run again after the resume) must agree."""
    seen: dict[tuple[int, int], str] = {}
    for line in Path(path).read_text().splitlines():
        epoch, index, digest = line.split()
        key = (int(epoch), int(index))
        assert seen.setdefault(key, digest) == digest, f"batch {key} differs after the resume"
    return seen


def convert(tmp_path, tree, out, **options) -> None:
    """What ``convert.py source=folder source.root=<tree> out.path=<out> ...`` writes, written in this process
    (convert.py's command line is tests/test_hdf5.py's and tests/test_s3_shards.py's concern)."""
    from feedline.writers.options import WriteOptions

    if options.get("format") == "shards":
        from feedline.writers.shards import convert_source
    else:
        from feedline.writers.hdf5 import convert_source
    source = FolderSource(str(tree), val_fraction=0, cache_dir=tmp_path / "convert-cache")
    convert_source(source, WriteOptions(path=str(out), **options))


def source_options(source: str, tmp_path, tree: str, val_fraction: float) -> list[str]:
    """train.py's overrides that read ``tree`` through ``source``: ``folder``, or ``shards`` that convert.py
    writes from it, in several chunks, read in the chunk-aware order one chunk at a time (source.window=1)."""
    if source == "folder":
        return ["source=folder", f"source.root={tree}", f"source.val_fraction={val_fraction}"]
    if source == "mix":  # half the classes as a folder, half converted to HDF5, drawn 1:1: each sample once
        halves = [tmp_path / "base", tmp_path / "extra"]
        classes = sorted(p.name for p in Path(tree).iterdir())
        for k, name in enumerate(classes):
            half = halves[2 * k >= len(classes)]
            half.mkdir(exist_ok=True)
            shutil.copytree(Path(tree) / name, half / name)
        h5 = tmp_path / "extra.h5"
        convert(tmp_path, halves[1], h5, workers=1)
        return [
            "source=mix",
            "+source/parts@source.parts.base=folder",
            f"source.parts.base.source.root={halves[0]}",
            f"source.parts.base.source.val_fraction={val_fraction}",
            "+source/parts@source.parts.extra=hdf5",
            f"source.parts.extra.source.path={h5}",
            f"source.parts.extra.source.val_fraction={val_fraction}",
        ]
    out = tmp_path / "shards"
    # about four images a chunk
    convert(tmp_path, tree, out, format="shards", chunk_bytes="2KB", workers=1)
    assert len(shard_chunks(out).files) >= 8
    return ["source=shards", f"source.path={out}", "source.window=1", f"source.val_fraction={val_fraction}"]


def shard_chunks(path) -> Chunks:
    return Chunks.of(dataset_dirs(str(path)))


# The mid-epoch kill harness runs over folder; shards and mix are killed and resumed by the world-change
# harness below (2 ranks -> 1, every sample once), and S3 shards by tests/test_s3_shards.py.
SOURCES = ["folder"]


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    "setup, every, kill, ranks",
    [
        (
            ["data.num_workers=2"],
            4,
            19,
            1,
        ),  # 12 steps an epoch: killed at epoch 1, batch 6; resumes from step 16
        (
            ["trainer=ddp_sim", "data.num_workers=1"],
            3,
            10,
            2,
        ),  # 6 steps an epoch per rank: killed at epoch 1, batch 3; resumes from step 9
    ],
    ids=["one-process-2-workers", "ddp_sim"],
)
def test_a_run_killed_mid_epoch_resumes_with_the_batches_of_an_uninterrupted_run(
    tmp_path, source, setup, every, kill, ranks
):
    tree = simple_tree(tmp_path / "tree", per_class=20)  # 48 train samples, batches of 4
    data = [*source_options(source, tmp_path, tree, 0.2), "transforms=digits"]
    options = [*data, *setup, "data.batch_size=4", f"callbacks.model_checkpoint.every_n_train_steps={every}"]
    with reference_beside(tmp_path, *options) as uninterrupted:
        killed = train(tmp_path, "run", "run", *options, kill_after_step=kill)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
        resumed = train(tmp_path, "run", "run", *options, "ckpt_path=last")
        reference = uninterrupted()
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumes epoch 1 at batch" in resumed.stderr + resumed.stdout
    assert "dataloader is not resumable" not in resumed.stderr  # Lightning sees a stateful loader
    for rank in range(ranks):
        expected = batches(tmp_path / f"reference.rank{rank}")
        assert len(expected) == 2 * 12 // ranks  # two whole epochs
        assert batches(tmp_path / f"run.rank{rank}") == expected
        lines = (tmp_path / f"run.rank{rank}").read_text().splitlines()
        replayed = len(lines) - len(expected)
        assert 0 < replayed < every  # the resume replays the steps after the last checkpoint, no more


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


# -- checkpoints that do not fit, under a Trainer ---------------------------------------------------------
def labelled_dm(tree, **options) -> ImageDataModule:
    """One image per class, so a label names its sample."""
    stacks = TransformStacks(batch=[v2.ToDtype(torch.float32, scale=True)])
    source = options.pop("source", None) or FolderSource(tree, val_fraction=0)
    return ImageDataModule(
        source, stacks, Uint8Collate(), **{"batch_size": 4, "num_workers": 0, "seed": 5, **options}
    )


class Wide(Tiny):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 10 * 12, 40))


class Labels(L.Callback):
    """The labels of every training batch; ``save``: (step, path) to write a checkpoint after that step, as
    ModelCheckpoint(every_n_train_steps) does."""

    def __init__(self, save=None):
        self.seen, self.save = [], save

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen += batch.label.tolist()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.save and trainer.global_step == self.save[0]:
            trainer.save_checkpoint(self.save[1])


def fit_labels(dm, callback, ckpt_path=None, **options):
    fit(dm, callback, ckpt_path, model=Wide(), **options)
    return callback.seen


def edit_checkpoint(path, edit) -> None:
    checkpoint = torch.load(path, weights_only=False)
    edit(checkpoint)
    torch.save(checkpoint, path)


def loops_state(checkpoint) -> dict:
    return checkpoint["loops"]["fit_loop"]["state_dict"]


def forty_classes(tmp_path):
    from tests.helpers import make_tree

    return make_tree(tmp_path / "tree", {f"c{i:02d}": ["a.png"] for i in range(40)})


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda c: loops_state(c).update(combined_loader=[]), "holds no train loader state"),
        (lambda c: loops_state(c).pop("combined_loader"), "holds no train loader state"),
        (lambda c: loops_state(c).update(combined_loader=[{}]), "the train loader state is empty"),
        (
            lambda c: loops_state(c)["combined_loader"][0].update(epoch=5),
            "stands at epoch 5 after 3 batches, but Lightning's progress in the same checkpoint goes on at "
            "epoch 0 after 3 batches",
        ),
    ],
    ids=["emptied", "removed", "empty-state", "another-epoch"],
)
def test_a_loader_state_that_is_missing_or_disagrees_with_lightning_is_refused_and_lenient_follows_lightning(
    tmp_path, edit, said
):
    tree = forty_classes(tmp_path)  # 10 batches of 4
    path = str(tmp_path / "step3.ckpt")
    first = fit_labels(labelled_dm(tree), Labels(save=(3, path)), max_steps=3)[:12]
    edit_checkpoint(path, edit)
    with pytest.raises(ResumeError, match=re.escape(said) + r".*data\.resume=lenient"):
        fit_labels(labelled_dm(tree), Labels(), path, max_epochs=1)
    rest = fit_labels(labelled_dm(tree, resume="lenient"), Labels(), path, max_epochs=1)
    assert sorted(first + rest) == list(range(40))  # epoch 0: every sample once across the cut


@pytest.mark.parametrize(("saved", "new_batch"), [(8, 6), (6, 8), (5, 12)])
def test_a_resume_with_a_larger_batch_reads_the_rest_of_the_epoch_once(tmp_path, saved, new_batch):
    """``saved`` batches of 4 consumed, resumed with batches of ``new_batch``: the epoch has fewer batches
    now than Lightning has counted, and the samples left are still read, each once (Lightning ends an epoch
    when its count reaches the epoch's length, so a count moved from a clamped one ended it early)."""
    tree = forty_classes(tmp_path)
    path = str(tmp_path / "cut.ckpt")
    first = fit_labels(labelled_dm(tree), Labels(save=(saved, path)), max_steps=saved)[: 4 * saved]
    rest = fit_labels(labelled_dm(tree, batch_size=new_batch), Labels(), path, max_epochs=1)
    assert sorted(first + rest) == list(range(40))


@pytest.mark.parametrize("batches", [-3, "3", 2.5, None, True])
def test_an_unreadable_loader_state_is_refused_by_name(tmp_path, batches):
    loader = small_dm(simple_tree(tmp_path / "tree", per_class=5)).train_dataloader()
    state = {**loader.state_dict(), "batches": batches}
    with pytest.raises(ResumeError, match=rf"batches is {re.escape(repr(batches))}, not an integer >= 0"):
        loader.load_state_dict(state)
    lenient = small_dm(simple_tree(tmp_path / "tree", per_class=5), resume="lenient").train_dataloader()
    lenient.load_state_dict(state)  # warned: the epoch goes on from its start
    assert lenient.position.batches == 0 and lenient.sampler.start == 0


def test_a_loader_state_past_the_end_of_the_epoch_is_refused(tmp_path):
    loader = small_dm(simple_tree(tmp_path / "tree", per_class=5)).train_dataloader()  # 5 batches
    with pytest.raises(ResumeError, match="stands after batch 9, but an epoch has 5"):
        loader.load_state_dict({**loader.state_dict(), "batches": 9})


@pytest.mark.parametrize(
    "change, said",
    [
        ({"seed": 1}, "source.seed 0 then, 1 now"),
        ({"val_fraction": 0.21}, "source.val_fraction 0.2 then, 0.21 now"),
    ],
)
def test_another_split_with_the_same_counts_is_refused(tmp_path, change, said):
    tree = simple_tree(tmp_path / "tree", per_class=10)  # each class: 8 train, 2 val under both splits
    dm = small_dm(tree, source=FolderSource(tree, val_fraction=0.2, seed=0))
    state = dm.train_dataloader().state_dict()
    other = small_dm(tree, source=FolderSource(tree, **{"val_fraction": 0.2, "seed": 0, **change}))
    loader = other.train_dataloader()
    assert len(loader.dataset) == state["samples"] == 24
    with pytest.raises(ResumeError, match=re.escape(said)) as refused:
        loader.load_state_dict(state)
    if "seed" in change:  # other rows: the digest of the train split differs too
        assert f"train split (digest of its sample rows) '{state['split']}' then" in str(refused.value)


def test_a_split_of_the_same_rows_has_the_same_digest_in_any_source(tmp_path):
    from feedline.datasets.folder.lazy import LazyFolderSource

    tree = simple_tree(tmp_path / "tree", per_class=10)
    lazy = make_lazy(tmp_path / "lazy", per_class=10)
    digest = FolderSource(tree, val_fraction=0.2).split("train").digest()
    assert LazyFolderSource(lazy, val_fraction=0.2).split("train").digest() == digest
    assert FolderSource(tree, val_fraction=0.2, seed=1).split("train").digest() != digest


def make_lazy(root, per_class: int) -> str:
    from tests.helpers import make_tree

    return make_tree(root, {c: [f"{i}.png" for i in range(per_class)] for c in ("cat", "dog", "eel")})


def test_a_resume_at_an_epoch_boundary_checks_the_split_too(tmp_path):
    """Lightning hands the train loader no state when it resumes at an epoch's end: the datamodule's copy
    of it is checked instead, and a checkpoint with neither is refused."""
    tree = simple_tree(tmp_path / "tree", per_class=10)
    path = str(tmp_path / "epoch-end.ckpt")

    def dm(seed, **options):
        return labelled_dm(tree, source=FolderSource(tree, val_fraction=0.2, seed=seed), **options)

    fit(dm(0), Record(path, (0, None, "epoch end")), max_epochs=1)
    assert fit(dm(0), Record(), path, max_epochs=2)  # the same run: resumes at epoch 1
    with pytest.raises(ResumeError, match="source.seed 0 then, 1 now"):
        fit(dm(1), Record(), path, max_epochs=2)
    edit_checkpoint(path, lambda c: c.pop("ImageDataModule"))
    with pytest.raises(ResumeError, match="holds no train loader state"):
        fit(dm(0), Record(), path, max_epochs=2)


def test_checkpoints_record_the_seed_the_run_used_and_load_without_seed_everything(tmp_path, monkeypatch):
    tree = forty_classes(tmp_path)
    path = str(tmp_path / "step3.ckpt")
    L.seed_everything(42)
    fit_labels(labelled_dm(tree, seed=None), Labels(save=(3, path)), max_steps=3)
    assert torch.load(path, weights_only=True)["datamodule_hyper_parameters"]["seed"] == 42
    monkeypatch.delenv("PL_GLOBAL_SEED")  # a new process that never calls seed_everything
    stacks = TransformStacks(batch=[v2.ToDtype(torch.float32, scale=True)])
    dm = ImageDataModule.load_from_checkpoint(
        path, transforms=stacks
    )  # a stack built in Python: passed again
    assert dm.seed == 42
    rest = fit_labels(dm, Labels(), path, max_epochs=1)
    assert len(rest) == 28


def test_a_resume_error_prints_alone(monkeypatch, capsys):
    from feedline.cli.instantiate import short_errors

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    message = "cannot resume the train loader: ... Or set data.resume=lenient to go on"
    with pytest.raises(SystemExit), short_errors():
        raise ResumeError(message)
    assert f"Error: {message}" in capsys.readouterr().err


@pytest.mark.slow
def test_a_resume_with_another_split_of_the_same_size_stops_with_the_error_alone(tmp_path):
    tree = simple_tree(tmp_path / "tree", per_class=30)  # 81 train samples under either seed
    run = tmp_path / "run"
    args = [
        sys.executable,
        "train.py",
        "source=folder",
        f"source.root={tree}",
        "data.batch_size=16",
        "data.num_workers=0",
        f"hydra.run.dir={run}",
        f"paths.output_dir={run}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "trainer.accelerator=cpu",
        "logger=none",
    ]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}

    def train_py(*overrides):
        return subprocess.run(
            [*args, *overrides], cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=600
        )

    first = train_py("callbacks.model_checkpoint.every_n_train_steps=3", "+trainer.max_steps=3")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = train_py("ckpt_path=last", "source.seed=1")
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert "Error: cannot resume the train loader" in resumed.stderr
    assert "source.seed 0 then, 1 now" in resumed.stderr and "train split (digest" in resumed.stderr


def samples_read(record, ranks: int) -> dict[int, list[tuple[int, int, int, str]]]:
    """rank -> [(epoch, batch_idx, label, pixel digest)], as ``RecordBatches(per_sample=true)`` wrote them."""
    out = {}
    for rank in range(ranks):
        lines = Path(f"{record}.rank{rank}").read_text().splitlines()
        out[rank] = [(int(e), int(b), int(y), d) for e, b, y, d in (line.split() for line in lines)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "before", "before_ranks", "after", "after_ranks", "kill"),
    [
        # 1 rank, batches of 2, last.ckpt at step 6: Lightning's count (6) is past the 2-rank epoch's 5 batches
        ("folder", ["data.batch_size=2"], 1, ["trainer=ddp_sim", "data.batch_size=4"], 2, 7),
        ("shards", ["trainer=ddp_sim", "data.batch_size=3"], 2, ["data.batch_size=7"], 1, 4),
        ("mix", ["trainer=ddp_sim", "data.batch_size=3"], 2, ["data.batch_size=7"], 1, 4),
    ],
    ids=["1-rank-to-2", "shards-2-ranks-to-1", "mix-2-ranks-to-1"],  # 2 -> 1: over shards and a mix
)
def test_a_run_killed_on_one_world_resumes_on_another_reading_each_sample_once(
    tmp_path, source, before, before_ranks, after, after_ranks, kill
):
    """kill -9 after step ``kill`` (last.ckpt at the step of 3 before it), resumed on another number of
    processes with another batch size: the interrupted epoch reads every sample once, each with its
    uninterrupted augmentation, and the next epoch is the one a run started on the new world reads."""
    tree = simple_tree(tmp_path / "tree", classes=[f"c{k:02d}" for k in range(40)], per_class=1)
    data = [
        *source_options(source, tmp_path, tree, 0),
        "transforms=digits",
        "data.num_workers=1",
        "callbacks.model_checkpoint.every_n_train_steps=3",
        "+callbacks.record.per_sample=true",
    ]
    with reference_beside(tmp_path, *data, *after) as uninterrupted:
        killed = train(tmp_path, "run", "killed", *data, *before, kill_after_step=kill)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        resumed = train(tmp_path, "run", "resumed", *data, *after, "ckpt_path=last")
        reference = uninterrupted()
    assert reference.returncode == 0, reference.stderr[-3000:]
    saved = kill - kill % 3  # the steps last.ckpt holds (every 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "the rest is split over this world, each sample once" in resumed.stderr + resumed.stdout

    ref = samples_read(tmp_path / "reference", after_ranks)
    pixels = {label: digest for rank in ref.values() for epoch, _, label, digest in rank if epoch == 0}
    assert sorted(pixels) == list(range(40))
    consumed = [
        r for rank in samples_read(tmp_path / "killed", before_ranks).values() for r in rank if r[1] < saved
    ]
    rest = samples_read(tmp_path / "resumed", after_ranks)
    epoch0 = consumed + [r for rank in rest.values() for r in rank if r[0] == 0]
    labels = collections.Counter(label for _, _, label, _ in epoch0)
    assert labels == collections.Counter(range(40))  # every sample once: none repeated, none missed
    assert {label: digest for _, _, label, digest in epoch0} == pixels  # each augmented as uninterrupted
    assert len({sum(r[0] == 0 for r in rank) for rank in rest.values()}) == 1  # equal shares per rank
    for rank in range(after_ranks):  # the next epoch: the very batches of a run started on this world
        assert [r for r in rest[rank] if r[0] == 1] == [r for r in ref[rank] if r[0] == 1]
    if source == "shards":
        assert_read_chunk_by_chunk(tmp_path / "shards", ref[0])


def assert_read_chunk_by_chunk(shards, records) -> None:
    """The epochs of ``records`` (one rank's, of a one-image-per-class dataset read with source.window=1)
    read the shards in the chunk-aware order: each chunk's samples one after another, the chunks in another
    order each epoch. A plain permutation of the samples would hop from chunk to chunk at almost every one."""
    chunks = shard_chunks(shards)
    row_of = np.argsort(np.load(Path(shards) / "labels.npy"))  # label -> row: one sample a class
    runs = []
    for epoch in (0, 1):
        read = chunks.chunk_of(row_of[[label for e, _, label, _ in records if e == epoch]])
        starts = np.flatnonzero(np.diff(read, prepend=-1))
        assert len(starts) == len(chunks.files), f"epoch {epoch} read chunks {read.tolist()}"
        runs.append(read[starts].tolist())
    assert runs[0] != runs[1]


@pytest.mark.parametrize("consumed", [39, 4, 13])
def test_a_consumed_count_that_does_not_follow_from_the_batches_is_refused(tmp_path, consumed):
    """The samples consumed are what a resume skips: one edited to 39 after 3 batches of 4 would skip 27
    samples nobody trained on, without a word."""
    tree = forty_classes(tmp_path)
    path = str(tmp_path / "step3.ckpt")
    fit_labels(labelled_dm(tree), Labels(save=(3, path)), max_steps=3)
    edit_checkpoint(path, lambda c: loops_state(c)["combined_loader"][0].update(consumed=consumed))
    with pytest.raises(ResumeError, match=rf"consumed {consumed} samples, but 3 batches of 4 on 1 rank\(s\)"):
        fit_labels(labelled_dm(tree), Labels(), path, max_epochs=1)


DROPPED = """
import gc, sys, weakref
from tests.helpers import finish, running_beside, simple_tree
from tests.test_resume import lightning_dm

dm = lightning_dm(simple_tree(sys.argv[1]))
dm.setup("fit")
gc.collect()  # Lightning's save_hyperparameters leaves frame cycles that hold the datamodule till then
gc.disable()
loader = dm.train_dataloader()
it = iter(loader)
next(it)
gone = weakref.ref(loader)
del it, loader, dm
print("freed" if gone() is None else "left for the cycle collector")
"""


def test_a_datamodule_dropped_mid_epoch_frees_its_loader_at_once(tmp_path):
    """The datamodule holds its train loader and the loader calls back into the datamodule: held strongly,
    that cycle left the loader and its persistent workers to the cycle collector, whose shutdown of the
    iterator waited out torch's 5 s join timeout per worker (10 s each time a notebook dropped one). In a
    fresh interpreter: what earlier tests left behind must not hold the datamodule."""
    done = subprocess.run(
        [sys.executable, "-c", DROPPED, str(tmp_path / "tree")],
        cwd=ROOT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "freed", done.stdout

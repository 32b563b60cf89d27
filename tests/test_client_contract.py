"""feedline as the data layer of a project of its own: conventional batches, every split, checkpoints that
remember the data, a plain PyTorch loop, LightningCLI."""

from __future__ import annotations

import os
import warnings

import lightning as L
import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.data import extract_batch_size
from PIL import Image
from torchvision.transforms import v2

from feedline.datamodules.bad_samples import BadSampleError
from feedline.datamodules.image import ImageDataModule
from feedline.datasets.folder.source import FolderSource
from feedline.transforms.batch import Batch
from feedline.transforms.collate import PadCollate, Uint8Collate
from feedline.transforms.stacks import TransformStacks

LOADER = ["data.num_workers=0", "data.batch_size=4"]


def folder_cfg(make_cfg, tree, *overrides):
    return make_cfg("source=folder", f"source.root={tree}", "transforms=cifar", *LOADER, *overrides)


# -- batches ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("collate", ["default", "uint8", "pad"])
def test_batches_unpack_as_x_y_and_lightning_sizes_them_without_a_warning(collate, make_cfg, tree):
    dm = instantiate(folder_cfg(make_cfg, tree, f"collate={collate}").data)
    dm.prepare_data()
    batch = next(iter(dm.train_dataloader()))
    x, y = batch
    assert x is batch.image and y is batch.label and batch[0] is x and batch[1] is y
    assert x.shape[0] == y.shape[0] == 4 and y.dtype == torch.int64
    assert (batch.valid is not None) == (collate == "pad")  # an attribute, never a tuple position
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "could not infer the batch size" / "ambiguous collection"
        assert extract_batch_size(batch) == 4
    moved = move_data_to_device(batch, torch.device("cpu"))
    assert isinstance(moved, Batch) and (moved.valid is not None) == (collate == "pad")


def test_a_pad_batch_keeps_its_mask_through_the_device_transfer():
    samples = [(torch.ones(3, 2, 2, dtype=torch.uint8), 0), (torch.ones(3, 3, 1, dtype=torch.uint8), 1)]
    batch = PadCollate()(samples)
    moved = batch.to("cpu")
    assert moved.valid.tolist() == batch.valid.tolist() and moved.valid.shape == (2, 3, 2)


@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
def test_every_split_reaches_the_step_as_float_in_one_memory_format(memory_format, make_cfg):
    """The default digits run with collate=uint8: training crops and evaluation resizes lay images out
    differently in the workers; on the device every split has the configured layout."""
    cfg = make_cfg(
        "collate=uint8", *LOADER, f"data.memory_format={memory_format}", "source.test_fraction=0.1"
    )
    dm = instantiate(cfg.data)
    dm.prepare_data()
    wanted = torch.channels_last if memory_format == "channels_last" else torch.contiguous_format
    for loader, training in (
        (dm.train_dataloader, True),
        (dm.val_dataloader, False),
        (dm.test_dataloader, False),
    ):
        image = dm.device_batch(next(iter(loader())), training).image
        assert image.dtype == torch.float32
        assert image.is_contiguous(memory_format=wanted), (loader.__name__, image.stride())


def test_images_left_uint8_by_the_device_stack_are_refused_with_the_fix(tree):
    dm = ImageDataModule(FolderSource(tree), TransformStacks(), Uint8Collate(), batch_size=2, num_workers=0)
    batch = Uint8Collate()([(torch.zeros(3, 4, 4, dtype=torch.uint8), 0)] * 2)
    with pytest.raises(TypeError, match=r"end transforms\.batch with ToDtype\(float32, scale=True\)"):
        dm.device_batch(batch, training=True)


# -- predict ----------------------------------------------------------------------------------------
def solid(path, value: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.full((6, 5, 3), value, dtype=np.uint8)).save(path)


@pytest.fixture
def unlabeled(tmp_path) -> tuple[str, dict[str, int]]:
    """Images at any depth, each a solid grey whose value is known, a text file among them."""
    root = tmp_path / "incoming"
    values = {"b.png": 10, "a/z.png": 20, "a/c/d.png": 30, "a/c/e.png": 40, "c.png": 50, "0.png": 60}
    for rel, value in values.items():
        solid(str(root / rel), value)
    (root / "a" / "notes.txt").write_text("not an image")
    return str(root), {os.path.join(str(root), rel): value for rel, value in values.items()}


@pytest.mark.parametrize("collate, workers", [("default", 0), ("uint8", 1)])
def test_predict_reads_every_image_below_the_root_in_path_order_each_with_its_path(
    collate, workers, make_cfg, tree, unlabeled
):
    root, values = unlabeled
    cfg = folder_cfg(
        make_cfg, tree, f"collate={collate}", f"data.predict_root={root}", f"data.num_workers={workers}"
    )
    dm = instantiate(cfg.data)
    dm.setup("predict")
    batches = list(dm.predict_dataloader())
    paths = [p for b in batches for p in b.paths]
    assert paths == sorted(values)
    for batch in batches:  # the image at each position is the file named at that position
        x, y = batch
        assert (y == -1).all()
        assert [int(img[0, 16, 16]) for img in x] == [
            values[p] for p in batch.paths
        ]  # the centre survives the crop


def test_a_bad_file_in_predict_is_named_and_left_out_never_filed_under_another_path(tree, unlabeled, caplog):
    root, values = unlabeled
    bad = os.path.join(root, "a", "z.png")
    with open(bad, "wb") as f:
        f.write(b"not a png")
    dm = ImageDataModule(
        FolderSource(tree), batch_size=8, num_workers=0, predict_root=root, max_bad_fraction=0.5
    )
    batch = next(iter(dm.predict_dataloader()))
    assert bad not in batch.paths and sorted(batch.paths) == sorted(set(values) - {bad})  # no duplicate
    assert [int(img.float().mean()) for img in batch.image] == [values[p] for p in batch.paths]
    assert bad in caplog.text
    strict = ImageDataModule(FolderSource(tree), num_workers=0, predict_root=root, on_bad_sample="raise")
    with pytest.raises(BadSampleError, match="z.png"):
        list(strict.predict_dataloader())


class Paths(L.LightningModule):
    def predict_step(self, batch, batch_idx):
        return batch.paths


class IndicesOfEachBatch(BasePredictionWriter):
    def __init__(self):
        super().__init__("batch")
        self.written = []

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dl_idx):
        self.written.append((list(batch_indices), prediction))


@pytest.mark.parametrize("batch_size, workers", [(1, 0), (2, 0), (3, 0), (1, 2), (2, 2)])
def test_a_predict_batch_of_unreadable_files_only_is_skipped_and_every_other_file_predicted_once(
    tree, unlabeled, batch_size, workers
):
    """Sorted, the files are 0, a/c/d, a/c/e, a/z, b, c: a/c/e and a/z unreadable make a batch of their own
    at batch_size=2, two at batch_size=1, and cost two batches a file each at batch_size=3."""
    root, values = unlabeled
    bad = [os.path.join(root, "a", "c", "e.png"), os.path.join(root, "a", "z.png")]
    for path in bad:
        with open(path, "wb") as f:
            f.write(b"not a png")
    dm = ImageDataModule(
        FolderSource(tree),
        batch_size=batch_size,
        num_workers=workers,
        predict_root=root,
        max_bad_fraction=0.5,
    )
    writer = IndicesOfEachBatch()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[writer])
    predicted = [p for paths in trainer.predict(Paths(), datamodule=dm) for p in paths]
    assert predicted == sorted(set(values) - set(bad))  # each once, in path order, none lost after the bad
    files = sorted(values)
    for indices, paths in writer.written:  # a writer's indices are still each batch's own
        assert [files[i] for i in indices] == list(paths)


def test_a_held_out_share_that_rounds_to_nothing_is_named(tree):
    dm = ImageDataModule(FolderSource(tree, test_fraction=0.01), num_workers=0)
    with pytest.raises(
        ValueError, match=r"test split is empty: source\.test_fraction=0\.01 holds out no sample"
    ):
        dm.setup("test")


def test_predict_without_images_says_which_key_to_set(tree, tmp_path):
    with pytest.raises(ValueError, match=r"set data\.predict_root="):
        ImageDataModule(FolderSource(tree), num_workers=0).setup("predict")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"data\.predict_root .* holds no image"):
        ImageDataModule(FolderSource(tree), num_workers=0, predict_root=tmp_path / "empty").setup("predict")
    with pytest.raises(FileNotFoundError, match=r"data\.predict_root .* does not exist"):
        ImageDataModule(FolderSource(tree), predict_root=tmp_path / "nowhere")


def test_check_stages_fails_on_a_split_a_later_stage_lacks_before_any_work(tree):
    with pytest.raises(ValueError, match=r"no test split: set source\.test_root=.* or source\.test_fraction"):
        ImageDataModule(FolderSource(tree), num_workers=0).check_stages("fit", "test")
    with pytest.raises(ValueError, match=r"set data\.predict_root="):
        ImageDataModule(FolderSource(tree), num_workers=0).check_stages("fit", "predict")
    with pytest.raises(
        ValueError, match=r"unknown stage 'tset'; the stages are fit, validate, test, predict"
    ):
        ImageDataModule(FolderSource(tree), num_workers=0).check_stages("tset")


def test_data_stages_fails_at_the_first_setup_on_a_split_a_later_stage_lacks(tree):
    """A project that cannot call check_stages (lightning-hydra-template's train.py: fit, then test) names
    its stages in config: fit's setup builds the test split too, and fails before the first step."""
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    model = TinyClassifier()
    dm = ImageDataModule(FolderSource(tree), num_workers=0, batch_size=4, stages=["fit", "test"])
    with pytest.raises(ValueError, match=r"no test split: set source\.test_root=.* or source\.test_fraction"):
        trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 0 and "test" not in dm.datasets
    dm = ImageDataModule(
        FolderSource(tree, test_fraction=0.34), num_workers=0, batch_size=4, stages=["fit", "test"]
    )
    trainer.fit(model, datamodule=dm)
    assert sorted(dm.datasets) == ["test", "train", "val"]  # built by fit's setup, used by test's
    with pytest.raises(ValueError, match=r"data\.stages: unknown stage 'tset'"):
        ImageDataModule(FolderSource(tree), stages=["fit", "tset"])


def test_a_run_after_check_stages_uses_its_splits_and_prepares_once(tree, monkeypatch):
    source = FolderSource(tree, test_fraction=0.34)
    prepared = []
    monkeypatch.setattr(source, "prepare", lambda: prepared.append(1))
    dm = ImageDataModule(source, num_workers=0, batch_size=4)
    dm.check_stages("fit", "test")
    built = dict(dm.datasets)
    assert sorted(built) == ["test", "train", "val"] and prepared == [1]
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    model = TinyClassifier()
    trainer.fit(model, datamodule=dm)
    assert prepared == [1]  # fit's prepare_data was check_stages'
    trainer.test(model, datamodule=dm)
    assert dm.datasets == built and prepared == [1, 1]  # test's own, as without check_stages


class TinyClassifier(L.LightningModule):
    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


# -- checkpoints ----------------------------------------------------------------------------------
def fit_one_step(make_cfg, tree, tmp_path, *overrides) -> tuple[ImageDataModule, str]:
    cfg = folder_cfg(make_cfg, tree, "collate=uint8", "source.test_fraction=0.34", *overrides)
    dm = instantiate(cfg.data)
    model = instantiate(cfg.model, num_classes=dm.num_classes)
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(model, datamodule=dm)
    path = str(tmp_path / "run.ckpt")
    trainer.save_checkpoint(path)
    return dm, path


def test_a_checkpoint_holds_the_data_config_and_rebuilds_the_datamodule(make_cfg, tree, tmp_path):
    dm, path = fit_one_step(make_cfg, tree, tmp_path, "data.memory_format=channels_last")
    saved = torch.load(path, weights_only=True)["datamodule_hyper_parameters"]  # plain containers only
    assert saved["source"]["_target_"] == "feedline.datasets.FolderSource"
    assert saved["source"]["root"] == tree and saved["source"]["test_fraction"] == 0.34
    assert saved["collate"]["_target_"] == "feedline.transforms.Uint8Collate"
    assert saved["transforms"]["train"][0]["_target_"] == "torchvision.transforms.v2.RandomCrop"
    assert saved["batch_size"] == 4 and saved["memory_format"] == "channels_last"

    again = ImageDataModule.load_from_checkpoint(path)
    assert isinstance(again.source, FolderSource) and isinstance(again.collate, Uint8Collate)
    assert again.class_to_idx == dm.class_to_idx and again.memory_format == torch.channels_last
    again.setup("test")
    dm.setup("test")
    test, rebuilt = dm.datasets["test"].records, again.datasets["test"].records
    assert [test.describe(i) for i in range(len(test))] == [rebuilt.describe(i) for i in range(len(rebuilt))]


def test_parts_given_as_objects_are_rebuilt_from_their_arguments_or_named_when_they_cannot_be(tree, tmp_path):
    stacks = TransformStacks(batch=[v2.ToDtype(torch.float32, scale=True)])  # transform objects: no config
    dm = ImageDataModule(
        FolderSource(tree, test_fraction=0.34), stacks, Uint8Collate(reuse_buffers=False), batch_size=2
    )
    assert dm.hparams["source"] == {
        "_target_": "feedline.datasets.FolderSource",
        "root": tree,
        "test_fraction": 0.34,
    }
    assert dm.hparams["collate"] == {
        "_target_": "feedline.transforms.Uint8Collate",
        "reuse_buffers": False,
    }
    assert dm.hparams["transforms"].startswith("described: feedline.transforms.TransformStacks")
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(TinyClassifier(), datamodule=dm)
    path = str(tmp_path / "objects.ckpt")
    trainer.save_checkpoint(path)
    with pytest.raises(
        ValueError, match=r"data\.transforms was given as Python objects .* pass transforms=\.\.\."
    ):
        ImageDataModule.load_from_checkpoint(path)
    rebuilt = ImageDataModule.load_from_checkpoint(path, transforms=stacks)
    assert rebuilt.source.test_fraction == 0.34 and rebuilt.collate.reuse_buffers is False
    assert rebuilt.batch_size == 2 and rebuilt.classes == dm.classes


def test_a_misspelt_argument_from_lightning_cli_is_named(tree):
    wrong = {"class_path": "feedline.datasets.FolderSource", "init_args": {"rooot": tree}}
    with pytest.raises(
        ValueError, match=r"data\.source: feedline\.datasets\.FolderSource does not take \['rooot'\]"
    ):
        ImageDataModule(wrong)
    with pytest.raises(ValueError, match=r"data\.source has no _target_"):
        ImageDataModule({"root": tree})


def test_without_a_transform_stack_images_reach_the_model_as_float(tree):
    dm = ImageDataModule(FolderSource(tree), collate=Uint8Collate(), batch_size=2, num_workers=0)
    x, _ = dm.device_batch(next(iter(dm.train_dataloader())), training=True)
    assert x.dtype == torch.float32 and float(x.min()) >= 0.0 and float(x.max()) <= 1.0


# -- plain PyTorch ------------------------------------------------------------------------------------
def test_a_plain_pytorch_loop_gets_the_device_stack_and_mix_in_one_call(make_cfg, tree):
    cfg = folder_cfg(make_cfg, tree, "collate=uint8", "mix=mixup_cutmix")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    x, y = dm.device_batch(batch, training=True, device="cpu")
    assert x.dtype == torch.float32 and y.shape == (4, 3) and torch.allclose(y.sum(1), torch.ones(4))
    x_eval, y_eval = dm.device_batch(batch, training=False, device="cpu")
    expected = (
        batch.image.float() / 255 - torch.tensor([0.4914, 0.4822, 0.4465])[:, None, None]
    ) / torch.tensor([0.2470, 0.2435, 0.2616])[:, None, None]
    assert torch.allclose(x_eval, expected, atol=1e-5) and torch.equal(y_eval, batch.label)


# -- LightningCLI ----------------------------------------------------------------------------------
def test_lightning_cli_picks_the_datamodule_its_source_and_collate_from_flags(tree, tmp_path):
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    args = [
        "--data.source=feedline.datasets.FolderSource",
        f"--data.source.root={tree}",
        "--data.source.test_fraction=0.34",
        "--data.collate=feedline.transforms.Uint8Collate",
        "--data.collate.reuse_buffers=false",
        "--data.transforms=feedline.transforms.TransformStacks",
        '--data.transforms.batch=[{"class_path": "torchvision.transforms.v2.ToDtype", '
        '"init_args": {"dtype": "torch.float32", "scale": true}}]',
        "--data.batch_size=4",
        "--data.num_workers=0",
        "--trainer.accelerator=cpu",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    cli = LightningCLI(TinyClassifier, ImageDataModule, run=False, save_config_callback=None, args=args)
    dm = cli.datamodule
    assert isinstance(dm.source, FolderSource) and dm.source.root == tree and dm.source.test_fraction == 0.34
    assert isinstance(dm.collate, Uint8Collate) and dm.collate.reuse_buffers is False and dm.batch_size == 4
    (result,) = cli.trainer.test(cli.model, datamodule=dm)
    assert 0.0 <= result["test/acc"] <= 1.0

"""A checkpoint from elsewhere runs no code of its own when the datamodule is rebuilt from it: each _target_
of its recorded data config names feedline's data layer or torchvision's transforms, or a name the caller
trusts, and nothing in it is an interpolation, all checked before anything is built."""

from __future__ import annotations

import copy
import os

import lightning as L
import pytest
import torch
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

from feedline.datamodules.checkpoint.trusted import UntrustedCheckpointError, check
from feedline.datamodules.image import ImageDataModule
from feedline.datasets.folder.source import FolderSource

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
LOADER = ["data.num_workers=0", "data.batch_size=4"]
built: list[str] = []  # what this module's classes built, in order


class Brighten(torch.nn.Module):
    """A user's own transform: a class in the user's own package (here, tests/)."""

    def __init__(self, amount: int = 1):
        super().__init__()
        self.amount = amount
        built.append("Brighten")

    def forward(self, image):
        return image


class Planted(FolderSource):
    """A Source of this module's own, which only the checkpoint names."""

    def __init__(self, root: str):
        built.append("Planted")
        super().__init__(root)


def tiny_fit_checkpoint(make_cfg, tree, tmp_path, *overrides) -> tuple[ImageDataModule, str]:
    """A real checkpoint: one training step of a run composed from feedline's config."""
    cfg = make_cfg("source=folder", f"source.root={tree}", *LOADER, *overrides)
    dm = instantiate(cfg.data)
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(instantiate(cfg.model, num_classes=dm.num_classes), datamodule=dm)
    path = str(tmp_path / "run.ckpt")
    trainer.save_checkpoint(path)
    return dm, path


@pytest.fixture
def recorded(tree):
    """The data config a feedline datamodule records (folder source, cifar stacks, uint8 collate)."""
    stacks = OmegaConf.load(os.path.join(CONF, "transforms", "cifar.yaml"))
    collate = {"_target_": "feedline.transforms.collate.Uint8Collate"}
    source = {"_target_": "feedline.datasets.folder.source.FolderSource", "root": tree}
    return dict(ImageDataModule(source, stacks, collate).hparams)


def save(tmp_path, hparams: dict, name: str = "edited.ckpt") -> str:
    path = str(tmp_path / name)
    torch.save({"datamodule_hyper_parameters": hparams, "pytorch-lightning_version": L.__version__}, path)
    return path


def edited(recorded: dict, where: str, value) -> dict:
    """``recorded`` with ``value`` at ``where``: "source", "collate", or "train" (appended to its stack)."""
    hparams = copy.deepcopy(recorded)
    if where == "train":
        hparams["transforms"]["train"].append(value)
    else:
        hparams[where] = value
    return hparams


@pytest.fixture
def files(tmp_path):
    private, victim = tmp_path / "private.txt", tmp_path / "victim.txt"
    private.write_text("private")
    victim.write_text("precious")
    return private, victim, tmp_path / "stolen.txt"


# the attack report's two, and os.makedirs spelled through a feedline module that imports os (none of them is
# on Hydra's own blocklist)
ATTACKS = {
    "copyfile": ("source", "shutil.copyfile", "source._target_"),
    "open-w": ("train", "builtins.open", "transforms.train[2]._target_"),
    "makedirs-via-feedline": ("collate", "feedline.datasets.folder.source.os.makedirs", "collate._target_"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_checkpoint_naming_code_outside_the_data_layer_is_refused_by_key_and_target_and_never_runs(
    attack, recorded, files, tmp_path
):
    private, victim, stolen = files
    where, target, key = ATTACKS[attack]
    made = tmp_path / "made"
    args = {"copyfile": [str(private), str(stolen)], "open-w": [str(victim), "w"]}.get(attack, [str(made)])
    path = save(tmp_path, edited(recorded, where, {"_target_": target, "_args_": args}))
    part = key.split(".")[0].split("[")[0]
    with pytest.raises(UntrustedCheckpointError) as err:
        ImageDataModule.load_from_checkpoint(path, weights_only=True)
    said = str(err.value)
    assert f"checkpoint {path}: " in said and f"{key} is '{target}'" in said
    assert f'trusted_targets=["{target}"]' in said and f"load_from_checkpoint(path, {part}=...)" in said
    assert victim.read_text() == "precious" and not stolen.exists() and not made.exists()  # nothing ran


def test_a_target_nested_in_args_or_a_partial_or_fetched_by_get_object_is_checked_too(recorded, tmp_path):
    wrapped = {
        "_target_": "torchvision.transforms.v2.Lambda",
        "_args_": [{"_target_": "shutil.rmtree", "_partial_": True}],
    }
    hparams = edited(recorded, "train", wrapped)
    hparams["transforms"]["batch"][0]["dtype"] = {"_target_": "hydra.utils.get_object", "path": "os.system"}
    with pytest.raises(UntrustedCheckpointError) as err:
        ImageDataModule.load_from_checkpoint(save(tmp_path, hparams))
    said = str(err.value)
    assert "transforms.train[2]._args_[0]._target_ is 'shutil.rmtree'" in said
    assert "transforms.batch[0].dtype._target_ is hydra.utils.get_object of 'os.system'" in said


def test_an_interpolation_in_a_checkpoint_is_refused_before_any_resolver_runs(
    recorded, tmp_path, monkeypatch
):
    calls = []
    OmegaConf.register_new_resolver("trust_test_calls", lambda *a: calls.append(a) or "x", replace=True)
    monkeypatch.setenv("TRUST_TEST_SECRET", "hunter2")
    hparams = edited(recorded, "collate", {"_target_": "feedline.transforms.collate.Uint8Collate"})
    hparams["source"]["root"] = "/data/${oc.env:TRUST_TEST_SECRET}"
    hparams["transforms"]["train"][0]["size"] = "${trust_test_calls:1}"
    with pytest.raises(UntrustedCheckpointError) as err:
        ImageDataModule.load_from_checkpoint(save(tmp_path, hparams))
    said = str(err.value)
    assert "source.root is '/data/${oc.env:TRUST_TEST_SECRET}', an interpolation" in said
    assert "transforms.train[0].size is '${trust_test_calls:1}', an interpolation" in said
    assert "hunter2" not in said and calls == []
    assert "trusted_targets" not in said  # naming a target would not help: the part must be given again
    assert "load_from_checkpoint(path, source=..., transforms=...)" in said


def test_a_recorded_credential_may_name_only_a_variable_named_for_it():
    def shards(**options) -> dict:
        return {
            "source": {"_target_": "feedline.datasets.shards.source.ShardsSource", "storage_options": options}
        }

    for name in ("AWS_ACCESS_KEY_ID", "FEEDLINE_SECRET_SOURCE_STORAGE_OPTIONS_AWS_ACCESS_KEY_ID"):
        check(shards(aws_access_key_id=f"${{oc.env:{name}}}"), "c.ckpt")
    # a checkpoint naming another variable would have the store send it to the endpoint the checkpoint names
    with pytest.raises(UntrustedCheckpointError) as err:
        check(shards(endpoint_url="http://elsewhere", aws_access_key_id="${oc.env:GITHUB_TOKEN}"), "c.ckpt")
    said = "source.storage_options.aws_access_key_id names the environment variable GITHUB_TOKEN"
    assert said in str(err.value)
    assert "NAME ending in AWS_ACCESS_KEY_ID" in str(err.value)


def test_trusted_targets_rebuild_a_users_own_transform_and_a_part_passed_again_is_not_checked(
    recorded, tmp_path
):
    mine = f"{__name__}.Brighten"
    path = save(tmp_path, edited(recorded, "train", {"_target_": mine, "amount": 2}))
    built.clear()
    with pytest.raises(UntrustedCheckpointError, match=rf'trusted_targets=\["{mine}"\]'):
        ImageDataModule.load_from_checkpoint(path)
    assert built == []
    for trusted in ([mine], [f"{__name__.rsplit('.', 1)[0]}."]):  # by name, or all of the package
        dm = ImageDataModule.load_from_checkpoint(path, trusted_targets=trusted)
        assert isinstance(dm.transforms.train.transforms[-1], Brighten)
        assert dm.transforms.train.transforms[-1].amount == 2
    # a package trusted as a whole trusts what it defines, not what it imports
    made = tmp_path / "made"
    bad = edited(recorded, "train", {"_target_": f"{__name__}.os.makedirs", "_args_": [str(made)]})
    with pytest.raises(
        UntrustedCheckpointError, match=r"transforms.train\[2\]._target_ is '.*\.os\.makedirs'"
    ):
        ImageDataModule.load_from_checkpoint(save(tmp_path, bad, "b.ckpt"), trusted_targets=["tests."])
    assert not made.exists()
    dm = ImageDataModule.load_from_checkpoint(path, transforms=recorded["transforms"])
    assert not any(isinstance(t, Brighten) for t in dm.transforms.train.transforms)


def test_an_hparams_file_is_checked_as_the_checkpoint_is(recorded, files, tmp_path):
    _, victim, _ = files
    hparams_file = tmp_path / "hparams.yaml"
    planted = edited(recorded, "collate", {"_target_": "builtins.open", "file": str(victim), "mode": "w"})
    hparams_file.write_text(yaml.safe_dump(planted))
    with pytest.raises(
        UntrustedCheckpointError, match=rf"with hparams_file {hparams_file}\): .*collate._target_"
    ):
        ImageDataModule.load_from_checkpoint(save(tmp_path, recorded), hparams_file=str(hparams_file))
    assert victim.read_text() == "precious"


def test_a_checkpoint_cannot_hand_its_parts_to_an_instantiator_of_its_choosing(recorded, tree, tmp_path):
    """LightningCLI's instantiator (Lightning allows it) would build a class_path the checkpoint names,
    through jsonargparse; feedline's datamodule is built by its own __init__, so the check sees each part."""
    hparams = copy.deepcopy(recorded)
    hparams["_instantiator"] = "lightning.pytorch.cli.instantiate_module"
    hparams["source"] = {"class_path": f"{__name__}.Planted", "init_args": {"root": tree}}
    built.clear()
    with pytest.raises(ValueError, match=r"data\.source: .*Planted does not take"):
        ImageDataModule.load_from_checkpoint(save(tmp_path, hparams))
    assert built == []


def test_feedline_checkpoints_rebuild_unchanged(make_cfg, tree, tmp_path):
    # imagenet's stacks: feedline's own transforms, torchvision's, and get_object of a dtype
    dm, path = tiny_fit_checkpoint(make_cfg, tree, tmp_path, "transforms=imagenet", "collate=pad")
    again = ImageDataModule.load_from_checkpoint(path, weights_only=True)
    assert dict(again.hparams) == dict(dm.hparams)
    assert repr(again.transforms) == repr(dm.transforms) and again.classes == dm.classes


SHIPPED = [
    *(f"transforms={name}" for name in ("cifar", "digits", "imagenet", "none")),
    *(f"collate={name}" for name in ("default", "pad", "uint8")),
    *(f"source={name}" for name in ("digits", "folder", "hdf5", "lazy_folder", "shards", "wds")),
    "mix=mixup_cutmix",
    "experiment=mix_demo",
    "experiment=custom_stack",
]


@pytest.mark.parametrize("choice", SHIPPED)
def test_every_data_config_feedline_ships_may_be_rebuilt_from_a_checkpoint(choice, make_cfg):
    data = OmegaConf.to_container(make_cfg(choice).data, resolve=True)
    check({part: data[part] for part in ("source", "transforms", "collate")}, "feedline's own")

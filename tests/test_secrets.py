"""Secrets in storage options never reach a file a run writes (cli/secrets.py, storage/stores.py): given on the
command line they move into the environment before Hydra reads them, given by value in a config file the run
is refused before anything is written, and checkpoints record a secret by the variable that holds it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, read_write

from feedline.cli.instantiate import instantiate
from feedline.cli.secret_overrides import SecretError, env_name, secrets_to_environment
from feedline.cli.secrets import MOVES_SECRETS, SecretsGuard, from_command_line, hidden_overrides
from feedline.datamodules.checkpoint.parts import build
from feedline.datamodules.image import ImageDataModule
from feedline.storage.secrets import HIDDEN, SECRET_OPTIONS, without_secrets
from feedline.storage.stores import STORAGE_OPTIONS, S3Store, StoreError
from tests.conftest import ROOT_DIR
from tests.helpers import finish, running_beside, simple_tree
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, upload_dir

SECRETS = (SECRET_KEY.encode(), ACCESS_KEY.encode())  # the key id is a prefix of the secret: both searched
KEY = "source.storage_options.aws_secret_access_key"


def parsed(override: str):
    return OverridesParser.create().parse_override(override).value()


# -- the command line ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "key", "value"),
    [
        (f"+{KEY}=s3cr3t/x+y", KEY, "s3cr3t/x+y"),
        (f"{KEY}='with, comma='", KEY, "with, comma="),
        (
            "+source.parts.remote.source.storage_options.aws_session_token=t0k3n",
            "source.parts.remote.source.storage_options.aws_session_token",
            "t0k3n",
        ),
        ("+out.storage_options.aws_access_key_id=0123", "out.storage_options.aws_access_key_id", "0123"),
    ],
    ids=["plain", "quoted", "mix-part", "convert-out"],
)
def test_a_secret_on_the_command_line_moves_into_the_environment_leaving_a_reference(given, key, value):
    environ = {}
    (rewritten,) = secrets_to_environment([given], environ)
    assert environ == {env_name(key): value}
    assert value not in rewritten
    assert parsed(rewritten) == f"${{oc.env:{env_name(key)}}}"  # what OmegaConf resolves, Hydra writes
    assert rewritten.split("=", 1)[0] == given.split("=", 1)[0]  # +, ++ and the key as given


def test_a_secret_inside_a_dict_override_moves_and_the_rest_is_kept():
    environ = {}
    given = '+source.storage_options={endpoint_url: "http://h:1", aws_secret_access_key: s3cr3t, n: 5}'
    (rewritten,) = secrets_to_environment([given], environ)
    assert "s3cr3t" not in rewritten and environ == {env_name(KEY): "s3cr3t"}
    assert parsed(rewritten) == {
        "endpoint_url": "http://h:1",
        "aws_secret_access_key": f"${{oc.env:{env_name(KEY)}}}",
        "n": 5,
    }


@pytest.mark.parametrize(
    "name", ["aws_secret_acess_key", "aws_sceret_access_key", "secret_key", "password", "AwsAccessKeyId"]
)
def test_a_misspelt_secret_storage_option_on_the_command_line_moves_into_the_environment_too(name):
    """Hydra would write it into .hydra/ before the store refuses the unknown key (by name, without its value)."""
    environ, key = {}, f"source.parts.p.source.storage_options.{name}"
    (rewritten,) = secrets_to_environment([f"+{key}=s3cr3t"], environ)
    assert environ == {env_name(key): "s3cr3t"} and "s3cr3t" not in rewritten
    with pytest.raises(ValueError, match=rf"^source\.storage_options: unknown key\(s\) {name}; ") as err:
        S3Store("s3://b/p", {name: "s3cr3t"})
    assert "s3cr3t" not in str(err.value)


def test_other_arguments_and_references_are_left_as_they_are():
    others = [f"+source.storage_options.{name}=x" for name in STORAGE_OPTIONS if name not in SECRET_OPTIONS]
    args = [
        "-m",
        "source=shards",
        "trainer.max_epochs=2",
        f"{KEY}=${{oc.env:MINE}}",
        f"{KEY}=null",
        "+model.password=x",  # a secret's name counts as one only under storage_options
        *others,
        "--cfg",
        "job",
    ]
    environ = {}
    assert secrets_to_environment(args, environ) == args and environ == {}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (f"{KEY}=s3cr3t,t0k3n", "a sweep over secrets"),
        (f"~{KEY}=s3cr3t", f"delete a secret without its value: ~{KEY}"),
        (
            f"+{KEY}=s3=cr3t",
            f"""cannot parse this override (its value is not shown: it may be a secret): quote \
the value for Hydra, and the whole override for the shell: '+{KEY}="..."'""",
        ),
    ],
    ids=["sweep", "delete", "unparsable"],
)
def test_a_secret_that_cannot_become_a_reference_is_refused_without_echoing_it(given, said):
    with pytest.raises(SecretError, match=r"^source\.storage_options\.aws_secret_access_key: ") as err:
        secrets_to_environment([given], {})
    assert said in str(err.value)
    assert not any(value in str(err.value) for value in ("s3", "cr3t", "t0k3n"))


def test_the_hint_for_an_unparsable_secret_is_an_override_that_moves_it():
    """The shell takes the outer quotes off: Hydra sees +key="a=b", the user's own + kept."""
    environ = {}
    assert secrets_to_environment([f'+{KEY}="a=b"'], environ) == [f"+{KEY}='${{oc.env:{env_name(KEY)}}}'"]
    assert environ == {env_name(KEY): "a=b"}


def test_a_summary_records_overrides_as_written_and_hides_a_secret_given_by_value(monkeypatch):
    monkeypatch.setenv("MINE", "s3cr3t")
    task = OmegaConf.create([f"{KEY}='${{oc.env:MINE}}'", f"+{KEY}=s3cr3t", "trainer.max_epochs=2"])
    assert hidden_overrides(task) == [
        f"{KEY}='${{oc.env:MINE}}'",
        f"+{KEY}='{HIDDEN}'",
        "trainer.max_epochs=2",
    ]


# -- config files --------------------------------------------------------------------------------------------
PART = "source.parts.remote.source.storage_options"
BY_VALUE = f"{PART}.aws_secret_access_key: a secret written by value in a config file"
UNSET = f"{PART}.aws_secret_access_key refers to the environment variable NOT_SET_HERE, which this process does not"


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ("s3cr3t", BY_VALUE),
        ("${oc.env:MINE}", None),
        ("${oc.env:NOT_SET_HERE,null}", None),
        ("${vault:team/s3}", None),  # a resolver of the user's own: a reference too
        ("${oc.env:MINE,s3cr3t}", BY_VALUE),  # the default is a value written in the config
        ("${creds.secret}", BY_VALUE),  # points at a value written elsewhere in the config
        ("${oc.env:NOT_SET_HERE}", UNSET),  # a resume in a new shell: said before Hydra writes anything
        (None, None),
    ],
)
def test_a_secret_written_by_value_in_a_config_is_refused_before_the_run_starts(
    make_cfg, monkeypatch, value, refusal
):
    monkeypatch.setenv("MINE", "s3cr3t")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    cfg = make_cfg()  # the compose API: what Hydra hands on_run_start, with the user's file merged in
    OmegaConf.update(cfg, "source.parts", {"remote": {"source": {"storage_options": {}}}}, force_add=True)
    OmegaConf.update(cfg, f"{PART}.aws_secret_access_key", value, force_add=True)
    for start in (SecretsGuard().on_run_start, SecretsGuard().on_multirun_start):
        if refusal is None:
            start(cfg)
            continue
        with pytest.raises(SystemExit) as err:  # Hydra would turn any other exception into a warning
            start(cfg)
        said = str(err.value)
        assert said.startswith(f"Error: {refusal}") and "s3cr3t" not in said
        if refusal == BY_VALUE:
            assert "=${oc.env:NAME}" in said and f"{PART}.profile_name" in said


def test_a_misspelt_secret_written_by_value_in_a_config_is_refused_too(make_cfg):
    cfg = make_cfg()
    OmegaConf.update(cfg, "source.storage_options", {"aws_secret_acess_key": "s3cr3t"}, force_add=True)
    with pytest.raises(SystemExit) as err:
        SecretsGuard().on_run_start(cfg)
    said = str(err.value)
    assert said.startswith(
        "Error: source.storage_options.aws_secret_acess_key: a secret written by value in a"
    )
    assert "s3cr3t" not in said


SHARDS = ("source=shards", "source.path=s3://b/p")


@pytest.mark.parametrize("wrapped", [True, False], ids=["feedline-main", "own-main"])
def test_the_guard_tells_a_secret_given_on_the_command_line_from_one_in_a_config_file(
    make_cfg, monkeypatch, wrapped
):
    """A project of one's own may add the guard without wrapping its main in from_command_line: a secret given
    on its command line reaches the guard as it is, and is refused as given there, with the forms that work."""
    monkeypatch.setenv(MOVES_SECRETS, "")  # unset, and unset again after the test (the wrapper sets it)
    if wrapped:  # what feedline's train.py does before Hydra reads the command line
        monkeypatch.setattr(sys, "argv", ["train.py"])
        from_command_line(lambda: None)()
    guard = SecretsGuard()
    with pytest.raises(SystemExit) as err:
        guard.on_run_start(make_cfg(*SHARDS, f"+{KEY}=s3cr3t"))  # the compose API: no wrapper runs
    said = str(err.value)
    assert said.startswith(
        f"Error: {KEY}: a secret given by value on the command line, which Hydra would write"
    )
    assert f"'+{KEY}=${{oc.env:NAME}}'" in said and "config file" not in said and "s3cr3t" not in said
    cfg = make_cfg(*SHARDS)
    OmegaConf.update(cfg, KEY, "s3cr3t", force_add=True)  # as a source YAML of the user's would bring it
    with pytest.raises(SystemExit) as err:
        guard.on_run_start(cfg)
    said = str(err.value)
    assert said.startswith(f"Error: {KEY}: a secret written by value in a config file")
    assert ("on the command line a secret may also be given by value (feedline moves it" in said) == wrapped
    assert (
        "wrap the program's @hydra.main function in feedline.cli.secrets.from_command_line" in said
    ) != wrapped


ENDPOINT = "source.storage_options.endpoint_url"


def _endpoint_refusal(where: str, make_cfg, monkeypatch) -> str:
    """What each place that meets the endpoint http://admin:PW99@127.0.0.1:8333 says of it."""
    url = "http://admin:PW99@127.0.0.1:8333"
    if where == "command-line":
        with pytest.raises(SecretError) as err:
            secrets_to_environment([f"+source.storage_options={{endpoint_url: '{url}'}}"], {})
    elif where == "command-line-sweep":
        with pytest.raises(SecretError) as err:
            secrets_to_environment([f"+{ENDPOINT}=http://h:1,{url}"], {})
    elif where == "config-file":
        cfg = make_cfg()
        OmegaConf.update(cfg, ENDPOINT, url, force_add=True)
        with pytest.raises(SystemExit) as err:
            SecretsGuard().on_run_start(cfg)
    elif where == "store":
        with pytest.raises(ValueError) as err:
            S3Store("s3://b/p", {"endpoint_url": url})
    else:  # the variable boto3 reads: the store refuses its client
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        with pytest.raises(StoreError) as err:
            S3Store("s3://b/p").exists("index.json")
        said = str(err.value).removeprefix("s3://b/p: ")  # the store's errors name its URL first
        return said.replace("AWS_ENDPOINT_URL (or a profile's endpoint_url)", ENDPOINT)
    return str(err.value).removeprefix("Error: ")


@pytest.mark.parametrize(
    "where", ["command-line", "command-line-sweep", "config-file", "store", "AWS_ENDPOINT_URL"]
)
def test_an_endpoint_with_a_password_in_its_url_is_refused_without_echoing_it(make_cfg, monkeypatch, where):
    """S3 takes no credentials in the URL (boto3 sends neither), and the URL is written wherever the endpoint is."""
    said = _endpoint_refusal(where, make_cfg, monkeypatch)
    assert said.startswith(f"{ENDPOINT}: the endpoint's URL holds a user name and password (not shown)")
    assert (
        "give the endpoint as http://127.0.0.1:8333, and the credentials as source.storage_options." in said
    )
    assert "PW99" not in said and "admin" not in said


def test_the_guard_is_one_of_the_runs_hydra_callbacks(make_cfg):
    assert make_cfg().hydra.callbacks.secrets._target_ == "feedline.cli.secrets.SecretsGuard"


def test_a_multirun_job_bringing_a_secret_by_value_is_refused_with_its_hydra_files_masked(make_cfg, tmp_path):
    """A swept config group is composed per job, after Hydra wrote the job's .hydra/: masked, then refused."""
    cfg = make_cfg()
    OmegaConf.update(cfg, "source.storage_options", {"aws_secret_access_key": "s3cr3t"}, force_add=True)
    with read_write(cfg.hydra):
        cfg.hydra.runtime.output_dir = str(tmp_path / "job")
    written = tmp_path / "job" / ".hydra"
    written.mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml"):
        (written / name).write_text("storage_options: {aws_secret_access_key: s3cr3t}\n")
    with pytest.raises(SystemExit, match=r"^Error: source\.storage_options\.aws_secret_access_key: "):
        SecretsGuard().on_job_start(cfg)
    for name in ("config.yaml", "hydra.yaml"):
        assert b"s3cr3t" not in (written / name).read_bytes()
    assert OmegaConf.load(written / "config.yaml").source.storage_options.aws_secret_access_key == HIDDEN


# -- records and the store -----------------------------------------------------------------------------------
def test_a_checkpoint_records_a_secret_by_the_variable_that_holds_it_else_hidden(monkeypatch):
    monkeypatch.setenv("HOLDS_IT", "s3cr3t")
    monkeypatch.setenv(env_name("source.storage_options.aws_secret_access_key"), "s3cr3t")  # the user's first
    part = {
        "_target_": "builtins.dict",
        "storage_options": {"aws_secret_access_key": "s3cr3t", "region_name": "r"},
    }
    config = {
        "parts": {
            "a": {"source": part},
            "b": {"source": {**part, "storage_options": {"aws_session_token": "t"}}},
        }
    }
    _, recorded = build({"_target_": "builtins.dict", **config}, "source")  # what the datamodule saves
    assert recorded["parts"]["a"]["source"]["storage_options"] == {
        "aws_secret_access_key": "${oc.env:HOLDS_IT}",
        "region_name": "r",
    }
    assert recorded["parts"]["b"]["source"]["storage_options"] == {"aws_session_token": HIDDEN}
    assert without_secrets({"aws_session_token": "${oc.env:X}"}) == {"aws_session_token": "${oc.env:X}"}
    misspelt = {"storage_options": {"secret_key": "s3cr3t", "aws_secret_acess_key": "t"}}
    assert without_secrets({"parts": [misspelt]}, {"HOLDS_IT": "s3cr3t"}) == {
        "parts": [{"storage_options": {"secret_key": "${oc.env:HOLDS_IT}", "aws_secret_acess_key": HIDDEN}}]
    }


def test_building_from_the_config_leaves_the_runs_config_unresolved(monkeypatch):
    """Hydra's instantiate resolves in place the node an interpolation points at (data.source: ${source}), and
    a job returns its config when it ends (submitit pickles it into .submitit/*_result.pkl)."""
    monkeypatch.setenv("HOLDS_IT", "s3cr3t")
    secret = {"aws_secret_access_key": "${oc.env:HOLDS_IT}"}
    cfg = OmegaConf.create(
        {
            "source": {"_target_": "builtins.dict", "storage_options": secret},
            "data": {"_target_": "builtins.dict", "_recursive_": False, "source": "${source}"},
        }
    )
    built = instantiate(cfg.data, "data")
    assert built["source"]["storage_options"]["aws_secret_access_key"] == "s3cr3t"
    assert b"s3cr3t" not in pickle.dumps(cfg)


def test_a_hidden_secret_is_refused_by_key_and_a_reference_to_a_missing_variable_names_it(monkeypatch):
    with pytest.raises(ValueError, match=r"source.storage_options.aws_secret_access_key was hidden ") as err:
        S3Store("s3://b/p", {"aws_secret_access_key": HIDDEN})
    said = str(err.value)  # from Python (load_from_checkpoint), and from the command line
    assert (
        "From Python: ImageDataModule.load_from_checkpoint(path, source=config), config the recorded" in said
    )
    assert "on the command line: source.storage_options.aws_secret_access_key='${oc.env:NAME}'" in said
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    store = S3Store(
        "s3://b/p", {"aws_secret_access_key": "${oc.env:NOT_SET_HERE}", "endpoint_url": "http://h:1"}
    )
    with pytest.raises(
        StoreError, match=r"refers to the environment variable NOT_SET_HERE, .*export NOT_SET_HERE="
    ):
        store.exists("index.json")


# -- real runs against the S3 server ----------------------------------------------------------------------------
def start(tmp_path, script: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``script`` from the command line with no ``AWS_*`` variable, started: the store is reached through the
    storage options only."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    clean.update({"FEEDLINE_CACHE_DIR": str(tmp_path / "cache"), **(env or {})})
    return subprocess.Popen(
        [sys.executable, script, *args],
        cwd=ROOT_DIR,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run(tmp_path, script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``start``, waited for."""
    return finish(start(tmp_path, script, *args, env=env))


def storage_options(server, key: str, key_id: str = ACCESS_KEY, secret: str = SECRET_KEY) -> list[str]:
    return [
        f"+{key}.endpoint_url={server.endpoint}",
        f"+{key}.region_name={REGION}",
        f"+{key}.aws_access_key_id={key_id}",
        f"+{key}.aws_secret_access_key={secret}",
    ]


def written_bytes(path: Path) -> bytes:
    """A file's bytes, and for an archive (a checkpoint: torch's zip of pickles) each member's, unpacked."""
    data = path.read_bytes()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            data += b"".join(archive.read(name) for name in archive.namelist())
    return data


def assert_no_secret_under(*roots: Path) -> int:
    files = [p for root in roots for p in root.rglob("*") if p.is_file()]
    leaks = [str(p) for p in files for secret in SECRETS if secret in written_bytes(p)]
    assert not leaks, leaks
    return len(files)


def recorded_secret(checkpoint: Path, part: str | None = None) -> str:
    source = torch.load(checkpoint, weights_only=True)["datamodule_hyper_parameters"]["source"]
    source = source["parts"][part]["source"] if part else source
    return source["storage_options"]["aws_secret_access_key"]


def written_secret(run_dir: Path, key: str) -> str:
    """The value at ``key`` of the run's .hydra/config.yaml, as written (unresolved)."""
    value = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=False)
    for name in key.split("."):
        value = value[name]
    return value


def reference(key: str) -> str:
    return f"${{oc.env:{env_name(key)}}}"


def second_dataset(server, tmp_path) -> str:
    """Another small dataset (a mix refuses two parts of one dataset), written here and uploaded: its URL."""
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards import convert_source

    tree = simple_tree(tmp_path / "tree-2", per_class=5, ext=".jpg")
    source = FolderSource(tree, val_fraction=0, cache_dir=tmp_path / "index-2")
    convert_source(source, WriteOptions(path=str(tmp_path / "shards-2"), format="shards", chunk_bytes="2KB"))
    url = server.new_prefix()
    upload_dir(server, tmp_path / "shards-2", url)
    return url


@pytest.mark.slow
def test_no_file_a_run_writes_holds_a_secret_and_a_resume_still_reaches_the_store(
    s3_server, tmp_path, monkeypatch
):
    """convert.py with its output's secret on the command line; a multirun through the submitit launcher over a
    mix of two S3 parts, one with its secret on the command line and one by ${oc.env:NAME}; a single run with
    source.storage_options on the command line, resumed (ckpt_path=last) onto an empty cache. No AWS_* variable
    is set. Every file under their directories and caches (the checkpoints unpacked too) and every object of
    the converted dataset hold neither the secret nor the key id; configs and checkpoints hold references."""
    url, tree = s3_server.new_prefix(), simple_tree(tmp_path / "tree", per_class=8)
    convert = ["source=folder", f"source.root={tree}", "out.format=shards", f"out.path={url}"]
    convert += ["out.chunk_bytes=2KB", "out.workers=1", f"hydra.run.dir={tmp_path / 'convert'}"]
    done = run(tmp_path, "convert.py", *convert, *storage_options(s3_server, "out.storage_options"))
    assert done.returncode == 0, done.stderr[-3000:]
    second = second_dataset(s3_server, tmp_path)
    small = ["transforms=digits", "trainer.accelerator=cpu", "data.num_workers=0", "data.batch_size=4"]

    mix = [
        "-m",
        "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "source=mix",
        *small,
    ]
    for part, path in (("lit", url), ("ref", second)):
        mix += [f"+source/parts@source.parts.{part}=shards", f"source.parts.{part}.source.path={path}"]
        mix += [f"source.parts.{part}.source.val_fraction=0.25", "trainer.max_epochs=1"]
    lit, ref = "source.parts.lit.source.storage_options", "source.parts.ref.source.storage_options"
    mix += storage_options(s3_server, lit)
    mix += storage_options(s3_server, ref, "${oc.env:TEST_KEY_ID}", "${oc.env:TEST_SECRET}")
    # the multirun runs beside the single run and its resume below (a cache of its own, searched too)
    sweep_env = {
        "TEST_KEY_ID": ACCESS_KEY,
        "TEST_SECRET": SECRET_KEY,
        "FEEDLINE_CACHE_DIR": str(tmp_path / "cache-sweep"),
    }
    with running_beside(start(tmp_path, "train.py", *mix, env=sweep_env)) as sweep:
        key, resumed = single_run_and_resume(s3_server, tmp_path, url, small)
        swept = sweep()
    assert swept.returncode == 0, swept.stderr[-3000:]
    job = tmp_path / "sweep" / "0"
    assert (tmp_path / "sweep" / "summary.md").exists() and (job / "summary.json").exists()
    assert written_secret(job, f"{lit}.aws_secret_access_key") == reference(f"{lit}.aws_secret_access_key")
    assert written_secret(job, f"{ref}.aws_secret_access_key") == "${oc.env:TEST_SECRET}"
    held_by = {reference(f"{lit}.aws_secret_access_key"), "${oc.env:TEST_SECRET}"}  # each holds the secret
    assert {recorded_secret(job / "checkpoints" / "last.ckpt", part) for part in ("lit", "ref")} <= held_by

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert list((tmp_path / "empty-cache" / "chunks").iterdir())  # read from the store again
    epochs = {row.split(",")[0] for row in (tmp_path / "run" / "csv" / "metrics.csv").read_text().split()[1:]}
    assert epochs == {"0", "1"}  # the second epoch was trained
    assert recorded_secret(tmp_path / "run" / "checkpoints" / "last.ckpt") == reference(key)
    # the datamodule rebuilt from the checkpoint alone reaches the store where the recorded variables are set
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(env_name(key), SECRET_KEY)
    monkeypatch.setenv(env_name("source.storage_options.aws_access_key_id"), ACCESS_KEY)
    rebuilt = ImageDataModule.load_from_checkpoint(
        tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True
    )
    rebuilt.setup("fit")
    assert len(rebuilt.datasets["train"][0][0]) > 0

    roots = [tmp_path / name for name in ("convert", "sweep", "run", "cache", "cache-sweep", "empty-cache")]
    assert assert_no_secret_under(*roots) > 20
    client, (bucket, prefix) = s3_server.client(), url[len("s3://") :].split("/", 1)
    for listed in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]:
        body = client.get_object(Bucket=bucket, Key=listed["Key"])["Body"].read()
        assert not any(secret in body for secret in SECRETS), listed["Key"]


def single_run_and_resume(s3_server, tmp_path, url: str, small: list[str]):
    """The single run of the test above, one epoch on two DDP ranks, and its resume for a second epoch onto
    an empty cache: the key of its secret and the resume's CompletedProcess (checked by the caller)."""
    key = "source.storage_options.aws_secret_access_key"
    # two DDP ranks: Lightning starts the second with this process's sys.argv, which holds the reference only
    single = [
        f"hydra.run.dir={tmp_path / 'run'}",
        "source=shards",
        f"source.path={url}",
        *small,
        "trainer=ddp_sim",
    ]
    single += ["source.val_fraction=0.25", "callbacks.model_checkpoint.every_n_train_steps=2"]
    single += storage_options(s3_server, "source.storage_options")
    first = run(tmp_path, "train.py", *single, "trainer.max_epochs=1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert written_secret(tmp_path / "run", key) == reference(key)
    assert (
        tmp_path / "run" / "train_ddp_process_1.log"
    ).exists()  # the second rank ran, and reached the store
    resume = ["trainer.max_epochs=2", "ckpt_path=last", f"source.cache_dir={tmp_path / 'empty-cache'}"]
    resumed = run(tmp_path, "train.py", *single, *resume)
    return key, resumed


@pytest.mark.slow
def test_a_secret_written_by_value_in_the_users_config_file_refuses_the_run_before_any_file(tmp_path):
    conf = tmp_path / "conf" / "source"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(
        "defaults:\n  - shards\n  - _self_\npath: s3://bucket/train\n"
        f"storage_options:\n  aws_secret_access_key: {SECRET_KEY}\n"
    )
    done = run(
        tmp_path,
        "train.py",
        "--config-dir",
        str(tmp_path / "conf"),
        "source=mine",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode != 0
    assert f"{KEY}: a secret written by value in a config file" in done.stderr, done.stderr[-3000:]
    assert SECRET_KEY not in done.stderr + done.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_misspelt_secret_on_the_command_line_is_refused_by_name_and_written_nowhere(tmp_path):
    secret = "TYPOSECRET42"
    done = run(
        tmp_path,
        "train.py",
        "source=shards",
        "source.path=s3://bucket/train",
        f"+source.storage_options.aws_secret_acess_key={secret}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode != 0
    assert "source.storage_options: unknown key(s) aws_secret_acess_key; known: " in done.stderr, done.stderr[
        -3000:
    ]
    assert secret not in done.stderr + done.stdout
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert [str(p) for p in files if secret.encode() in p.read_bytes()] == []
    written = (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()  # the run got as far as its files
    assert env_name("source.storage_options.aws_secret_acess_key") in written

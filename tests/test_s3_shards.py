"""source=shards from object storage, against a real S3 server (SeaweedFS over http, tests/s3_server.py):
streaming through the chunk cache, endpoints and credentials per source, and every fault named by URL."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from feedline.datasets.shards.chunks import ChunkError
from feedline.datasets.shards.source import ShardsSource
from feedline.storage.chunk_cache import ChunkCache
from feedline.storage.stores import StoreError
from tests.conftest import ROOT_DIR
from tests.helpers import simple_tree
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, upload_dir


@pytest.fixture(scope="module")
def local_shards(tmp_path_factory):
    """A shards dataset of 30 images in many small chunks, written by feedline's writer."""
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards import convert_source

    tmp = tmp_path_factory.mktemp("shards")
    tree = simple_tree(tmp / "tree", per_class=10)
    source = FolderSource(tree, val_fraction=0, cache_dir=tmp / "c")
    convert_source(
        source, WriteOptions(path=str(tmp / "shards"), format="shards", chunk_bytes="2KB", workers=1)
    )
    return tmp / "shards"


@pytest.fixture
def remote(s3_server, local_shards):
    """The same dataset uploaded to a bucket of its own: its URL."""
    url = s3_server.new_prefix() + "/train"
    upload_dir(s3_server, local_shards, url)
    return url


def local_classes(path) -> list[str]:
    return ShardsSource(path, val_fraction=0).classes


def options(server, **changes) -> dict:
    base = {
        "endpoint_url": server.endpoint,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "region_name": REGION,
    }
    return {**base, **changes}


def remote_source(server, url, tmp_path, **kwargs) -> ShardsSource:
    kwargs.setdefault("storage_options", options(server))
    kwargs.setdefault("window", 2)
    return ShardsSource(url, val_fraction=0, cache_dir=tmp_path / "cache", **kwargs)


def test_a_url_streams_every_sample_of_the_local_dataset_and_pickles_small(
    s3_server, remote, local_shards, tmp_path
):
    source = remote_source(s3_server, remote, tmp_path, cache_limit="200KB")
    source.prepare()  # one listing: every chunk there with its size
    local = ShardsSource(local_shards, val_fraction=0, cache_dir=tmp_path / "c2").split("train")
    records = source.split("train")
    assert source.classes == local_classes(local_shards) and len(records) == len(local) == 30
    for i in range(30):
        (image, label), (expected, expected_label) = records.chunks.read(i), local.chunks.read(i)
        assert bytes(image) == bytes(expected) and label == expected_label
    assert "s3://" in records.where(3) and records.where(3).endswith("]")
    assert len(pickle.dumps(records)) < 4000  # URLs, sizes and settings: never the samples
    assert records.chunks.cache.fetched()["chunks"] == len(records.chunks.files)


def test_endpoint_and_credentials_come_from_the_environment_too(s3_server, remote, tmp_path, monkeypatch):
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    source = ShardsSource(remote, val_fraction=0, window=2, cache_dir=tmp_path / "cache")
    assert len(source.split("train")) == 30


def test_wrong_credentials_name_the_url_and_how_to_set_them(s3_server, remote, tmp_path):
    with pytest.raises(
        StoreError, match=r"s3://.*/train/index.json: .* refused the credentials .*AWS_ACCESS_KEY_ID"
    ):
        remote_source(
            s3_server, remote, tmp_path, storage_options=options(s3_server, aws_secret_access_key="x")
        )


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("s3://no-such-bucket-here/train", "bucket 'no-such-bucket-here' does not exist at http://127.0.0.1"),
        ("{parent}/elsewhere", "is not a shards dataset: no index.json"),
    ],
    ids=["bucket", "prefix"],
)
def test_a_missing_bucket_or_prefix_is_named(s3_server, remote, tmp_path, where, said):
    url = where.format(parent=remote.rsplit("/", 1)[0])
    with pytest.raises((StoreError, FileNotFoundError), match=said):
        remote_source(s3_server, url, tmp_path)


def test_an_endpoint_that_is_down_at_start_is_named_after_bounded_retries(s3_server, remote, tmp_path):
    started = time.monotonic()
    down = options(s3_server, endpoint_url="http://127.0.0.1:9")  # nothing listens on port 9
    with pytest.raises(
        StoreError, match=r"cannot reach http://127.0.0.1:9 after 5 attempts .*AWS_ENDPOINT_URL"
    ):
        remote_source(s3_server, remote, tmp_path, storage_options=down)
    assert time.monotonic() - started < 60  # never a hang


def test_a_cache_limit_below_two_windows_of_chunks_is_refused_with_the_minimum(s3_server, remote, tmp_path):
    with pytest.raises(
        ValueError, match=r"source.cache_limit=5KB .* 2 x source.window \(2\) x its largest chunk"
    ):
        remote_source(s3_server, remote, tmp_path, cache_limit="5KB")


def test_a_dataset_of_fewer_chunks_than_two_windows_needs_room_for_its_chunks_only(
    s3_server, remote, tmp_path
):
    """The order reads two windows of chunks at once, or every chunk where the dataset has fewer: the
    minimum is what it reads, not 2 x source.window chunks that do not exist."""
    sizes = (
        remote_source(s3_server, remote, tmp_path, window=1000, cache_limit="1GB")
        .split("train")
        .chunks.nbytes
    )
    least = len(sizes) * int(sizes.max())
    assert len(sizes) < 2 * 1000
    remote_source(s3_server, remote, tmp_path, window=1000, cache_limit=least)  # room for every chunk: enough
    with pytest.raises(ValueError, match=rf"all {len(sizes)} chunks x its largest chunk") as refused:
        remote_source(s3_server, remote, tmp_path, window=1000, cache_limit=least - 1)
    assert "lower source.window" not in str(refused.value)  # a smaller window would not lower it


def test_a_chunk_deleted_mid_run_is_named_with_its_url(s3_server, remote, tmp_path):
    source = remote_source(s3_server, remote, tmp_path)
    records = source.split("train")
    records.chunks.read(0)
    bucket, prefix = remote[len("s3://") :].split("/", 1)
    last = records.chunks.files[-1]  # not read yet: not in the cache
    s3_server.client().delete_object(Bucket=bucket, Key=f"{prefix}/{last}")
    with pytest.raises(ChunkError, match=rf"chunk {remote}/{last} could not be fetched: .* does not exist"):
        records.chunks.read(len(records) - 1)
    with pytest.raises(ChunkError, match=rf"chunk {remote}/{last} is missing"):
        source.prepare()
    assert not [p for p in (tmp_path / "cache").rglob("*.part")]  # nothing half-fetched left behind


def test_an_endpoint_stopped_mid_pass_is_named_and_leaves_no_partial_chunk(s3_server, remote, tmp_path):
    # two attempts, not the default five: the message is the same, without five backoffs to wait out
    # (the default's count is the endpoint-down-at-start test's)
    down_fast = options(s3_server, max_attempts=2)
    records = remote_source(s3_server, remote, tmp_path, storage_options=down_fast).split("train")
    records.chunks.read(0)
    pid = s3_server.process.pid
    s3_server.stop()  # by its process id
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, not left running
    try:
        started = time.monotonic()
        with pytest.raises(
            ChunkError,
            match=r"could not be fetched: .* cannot reach http://127.0.0.1:\d+ after.* went down since: once it "
            r"answers again, resume from the run's checkpoints/last.ckpt \(ckpt_path=PATH, or ckpt_path=last in "
            r"the same hydra.run.dir\)$",
        ):
            records.chunks.read(len(records) - 1)
        assert time.monotonic() - started < 60
    finally:
        s3_server.start()
    assert not [p for p in (tmp_path / "cache").rglob("*.part")]
    assert records.chunks.read(len(records) - 1)  # back up: the pass goes on


def test_convert_writes_straight_to_a_url_that_train_reads(s3_server, tmp_path):
    """convert.py out.path=s3://... from the command line, credentials and endpoint from the environment:
    the same dataset as a local conversion, replaced whole by a second run."""
    tree = simple_tree(tmp_path / "tree", per_class=6)
    url = s3_server.new_prefix()
    env = {**os.environ, **s3_server.env()}

    def convert(out, *extra):
        args = [
            "source=folder",
            f"source.root={tree}",
            "out.format=shards",
            f"out.path={out}",
            "out.chunk_bytes=2KB",
        ]
        command = [sys.executable, "convert.py", *args, f"hydra.run.dir={tmp_path / 'hydra'}", *extra]
        done = subprocess.run(command, cwd=ROOT_DIR, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    convert(url)
    convert(tmp_path / "local")
    ours = ShardsSource(
        url, val_fraction=0, storage_options=options(s3_server), window=1, cache_dir=tmp_path / "c"
    )
    local = ShardsSource(tmp_path / "local", val_fraction=0, cache_dir=tmp_path / "c").split("train")
    records = ours.split("train")
    assert [bytes(records.chunks.read(i)[0]) for i in range(18)] == [
        bytes(local.chunks.read(i)[0]) for i in range(18)
    ]
    convert(
        url, "out.chunk_bytes=4KB", "out.seed=1"
    )  # replaced whole: fewer chunks, no object of the first left
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=url.split("/", 3)[3] + "/")
    again = ShardsSource(
        url, val_fraction=0, storage_options=options(s3_server), window=1, cache_dir=tmp_path / "c2"
    )
    names = {o["Key"].rsplit("/", 1)[1] for o in listed["Contents"]}
    assert names == {*again.split("train").chunks.files, "index.json", "feedline.json", "labels.npy"}


def test_an_upload_killed_before_its_last_files_never_reads_as_a_dataset(
    s3_server, local_shards, monkeypatch, tmp_path
):
    from feedline.storage.stores import S3Store
    from feedline.writers import upload

    url = s3_server.new_prefix()
    store = S3Store(url, options(s3_server), "out.path")
    real = store.client().upload_file

    def dies_at_the_sidecar(path, bucket, key, **kw):
        if key.endswith("feedline.json"):
            raise KeyboardInterrupt  # killed here
        return real(path, bucket, key, **kw)

    monkeypatch.setattr(store.client(), "upload_file", dies_at_the_sidecar)
    with pytest.raises(KeyboardInterrupt):
        upload.upload(str(local_shards), store)
    with pytest.raises(FileNotFoundError, match="is not a shards dataset: no index.json and feedline.json"):
        remote_source(s3_server, url, tmp_path)
    upload.check_remote_target(store, parts=False)  # what a killed upload leaves may be written over
    monkeypatch.undo()
    upload.upload(str(local_shards), S3Store(url, options(s3_server), "out.path"))
    assert len(remote_source(s3_server, url, tmp_path).split("train")) == 30


def test_a_prefix_holding_other_objects_is_never_written_into(s3_server, tmp_path):
    from feedline.storage.stores import S3Store
    from feedline.writers.upload import check_remote_target

    url = s3_server.new_prefix()
    s3_server.client().put_object(
        Bucket=s3_server.bucket, Key=url.split("/", 3)[3] + "/notes.txt", Body=b"mine"
    )
    with pytest.raises(
        ValueError, match="holds objects that are not a whole shards dataset.s own: it is never overwritten"
    ):
        check_remote_target(S3Store(url, options(s3_server), "out.path"), parts=False)


@pytest.mark.parametrize("switch", [False, True], ids=["as-shipped", "allow_http"])
def test_litdata_reads_an_http_endpoint_only_with_its_private_allow_http_switch(
    s3_server, remote, tmp_path, switch
):
    """Pins what the benchmark's LitData anchor leans on (benchmarks/litdata_http.py): if a LitData release
    reads http:// endpoints as shipped, or drops the private switch, this fails and the workaround goes."""
    from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY

    command = [
        sys.executable,
        str(ROOT_DIR / "benchmarks" / "litdata_http.py"),
        remote,
        s3_server.endpoint,
        ACCESS_KEY,
        SECRET_KEY,
        REGION,
        str(tmp_path / "litdata-cache"),
        *(["--allow-http"] if switch else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if switch:
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split() == ["30", "30"]  # every sample, through its loader's two workers
    else:
        assert done.returncode != 0 and "BadScheme" in done.stderr + done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_a_ddp_run_from_s3_stays_under_its_cache_limit_and_resumes_after_kill_9_on_an_empty_cache(
    s3_server, tmp_path, monkeypatch
):
    """train.py from the command line on trainer=ddp_sim with 2 workers a rank, from a bucket, with a cache
    limit below the dataset's size: the cache directory, sampled every 2 ms through two passes, never holds
    more than the limit (downloads in progress included); killed with SIGKILL mid-epoch and resumed with
    another, empty cache directory, the run goes on with the very batches of an uninterrupted run. (The
    dataset is converted in this process: convert.py's command line is the test above's.)"""
    from tests.test_resume import batches, convert, reference_beside, train

    tree = simple_tree(tmp_path / "tree", per_class=20)
    url = s3_server.new_prefix()
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    convert(tmp_path, tree, url, format="shards", chunk_bytes="2KB", workers=1)
    dataset = sum(
        o["Size"]
        for o in s3_server.client().list_objects_v2(
            Bucket=s3_server.bucket, Prefix=url.split("/", 3)[3] + "/chunk-"
        )["Contents"]
    )
    limit = 12_000
    assert dataset > 2 * limit  # the cache must evict within each pass
    options = [
        f"source.path={url}",
        "source=shards",
        "source.window=1",
        f"source.cache_limit={limit}",
        "source.val_fraction=0.2",
        "transforms=digits",
        "trainer=ddp_sim",
        "data.num_workers=2",
        "data.batch_size=4",
        "callbacks.model_checkpoint.every_n_train_steps=3",
    ]
    peak, done_sampling = {}, threading.Event()

    def sample():
        while not done_sampling.is_set():
            for directory in tmp_path.glob("caches-*/chunks"):  # the node's one cache directory
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    used = sum(entry.stat().st_size for entry in os.scandir(directory))
                    peak[directory] = max(peak.get(directory, 0), used)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        cache = {run: f"source.cache_dir={tmp_path / f'caches-{run}'}" for run in "abc"}
        with reference_beside(tmp_path, *options, cache["a"]) as uninterrupted:
            killed = train(tmp_path, "run", "run", *options, cache["b"], kill_after_step=10)
            assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
            resumed = train(tmp_path, "run", "run", *options, cache["c"], "ckpt_path=last")
            reference = uninterrupted()
        assert reference.returncode == 0, reference.stderr[-3000:]
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    finally:
        done_sampling.set()
        sampler.join()
    assert "resumes epoch 1 at batch" in resumed.stderr + resumed.stdout
    for rank in range(2):
        expected = batches(tmp_path / f"reference.rank{rank}")
        assert len(expected) == 12  # two epochs of 6 batches a rank
        assert batches(tmp_path / f"run.rank{rank}") == expected
    assert len(peak) == 3 and all(0 < bytes_ <= limit for bytes_ in peak.values()), peak
    fetched = ChunkCache(tmp_path / "caches-a" / "chunks", 1).fetched()["bytes"]
    assert fetched > dataset  # two passes through a cache smaller than the data: chunks fetched again
    assert not list(tmp_path.glob("caches-*/chunks/*.part"))  # the kill left no download to be read as whole


def test_a_body_that_breaks_off_is_resumed_only_from_the_same_object(monkeypatch):
    """A chunk replaced (same size: converted again) while its body broke off: the ranged request that goes on
    from the byte reached must ask for the same object (If-Match its ETag), never splice two versions."""
    from feedline.storage.stores import S3Store

    store = S3Store("s3://bucket/prefix")
    versions, current, calls = {"v1": b"a" * 100, "v2": b"b" * 100}, ["v1"], []

    class Body:
        def __init__(self, data, breaks):
            self.data, self.breaks = data, breaks

        def iter_chunks(self, n):
            yield self.data[:50]
            if self.breaks:
                raise ConnectionResetError("connection reset by peer")
            yield self.data[50:]

    def call(method, rel, **kwargs):
        calls.append(kwargs)
        etag = current[0]
        if kwargs.get("IfMatch") not in (None, f'"{etag}"'):
            raise StoreError(f"s3://bucket/prefix/{rel}: answered PreconditionFailed")
        start = int(kwargs["Range"][len("bytes=") : -1]) if "Range" in kwargs else 0
        first = len(calls) == 1
        if first:
            current[0] = "v2"  # replaced while the first body is being read
        return {"Body": Body(versions[etag][start:], breaks=first), "ETag": f'"{etag}"'}

    monkeypatch.setattr(store, "_call", call)

    class Out:
        data = b""

        def write(self, piece):
            Out.data += piece

    try:
        store.fetch("chunk-0-0.bin")(Out())
    except StoreError:
        return  # refused: the chunk cache removes the download, the run names the chunk
    assert Out.data in (versions["v1"], versions["v2"]), Out.data


@pytest.mark.parametrize(
    "key, group", [("source.path", "source"), ("source.val_path", "source"), ("out.path", "out")]
)
def test_the_advice_names_the_storage_options_of_the_commands_own_key(key, group):
    """convert.py's output (out.path) is set through out.storage_options, not source.storage_options."""
    from botocore import exceptions as bx

    from feedline.storage.stores import S3Store

    store = S3Store("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:1"}, key)
    denied = bx.ClientError({"Error": {"Code": "SignatureDoesNotMatch"}}, "ListObjectsV2")
    for err in (
        denied,
        bx.NoCredentialsError(),
        bx.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ):
        text = str(store._error(err, "index.json"))
        assert f"{group}.storage_options." in text, text
        assert ("source.storage_options" in text) is (group == "source"), text
    with pytest.raises(ValueError, match=rf"^{group}\.storage_options: unknown key"):
        S3Store("s3://bucket/prefix", {"endpoint": "x"}, key)


def test_an_endpoint_without_its_scheme_is_told_to_add_one():
    from feedline.storage.stores import S3Store

    store = S3Store(
        "s3://bucket/prefix",
        {
            "endpoint_url": "127.0.0.1:9000",
            "aws_access_key_id": "k",
            "aws_secret_access_key": "s",
            "region_name": "us-east-1",
        },
    )
    with pytest.raises(
        StoreError, match=r"invalid endpoint .* a URL with its scheme \(https://host or http://"
    ):
        store.listing("")


def test_a_client_from_the_environment_logs_nothing_at_info(monkeypatch, caplog):
    """botocore's INFO lines (found credentials in environment variables, found endpoint) are not printed
    by every process and worker of a run; a level the user set for them is left alone."""
    import logging

    from feedline.storage.stores import S3Store

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    loggers = [logging.getLogger(name) for name in ("botocore.credentials", "botocore.configprovider")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
        caplog.set_level(logging.INFO)
        S3Store("s3://bucket/prefix").client()
        assert not [r for r in caplog.records if r.name.startswith("botocore")], caplog.text
        loggers[0].setLevel(logging.DEBUG)  # as hydra.verbose=botocore.credentials sets it
        S3Store("s3://bucket/prefix").client()
        assert "Found credentials in environment variables" in caplog.text
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def test_a_url_converted_again_is_never_read_from_the_chunks_cached_before(s3_server, local_shards, tmp_path):
    """The same URL written again in another order (out.seed): the chunks have the same names, and here the
    same sizes; a cache keyed by the URL alone served the bytes of the dataset before."""
    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards import convert_source

    source = FolderSource(
        simple_tree(tmp_path / "tree", per_class=10), val_fraction=0, cache_dir=tmp_path / "c"
    )
    again = tmp_path / "again"
    convert_source(
        source, WriteOptions(path=str(again), format="shards", chunk_bytes="2KB", workers=1, seed=1)
    )
    url = s3_server.new_prefix() + "/train"
    for local in (local_shards, again):
        upload_dir(s3_server, local, url)
        records = remote_source(s3_server, url, tmp_path, cache_limit="200KB").split("train")
        expected = ShardsSource(local, val_fraction=0, cache_dir=tmp_path / "c2").split("train")
        for i in range(len(expected)):
            assert bytes(records.chunks.read(i)[0]) == bytes(expected.chunks.read(i)[0]), i


def test_a_chunk_replaced_under_a_running_job_is_refused_by_name_not_read(s3_server, remote, tmp_path):
    """The dataset written again (here one chunk, same size, other bytes) while a job reads it: the job pinned
    each chunk's ETag when it listed them, so the new bytes are never read as the old chunk's samples."""
    source = remote_source(s3_server, remote, tmp_path)
    records = source.split("train")
    records.chunks.read(0)
    bucket, prefix = remote[len("s3://") :].split("/", 1)
    last = records.chunks.files[-1]  # not read yet: not in the cache
    client = s3_server.client()
    body = client.get_object(Bucket=bucket, Key=f"{prefix}/{last}")["Body"].read()
    flipped = body[:-9] + bytes([body[-9] ^ 0xFF]) + body[-8:]  # the last image's last byte (not its label)
    client.put_object(Bucket=bucket, Key=f"{prefix}/{last}", Body=flipped)
    with pytest.raises(ChunkError, match=rf"chunk {remote}/{last} could not be fetched: .* was replaced"):
        records.chunks.read(len(records) - 1)
    with pytest.raises(ChunkError, match=rf"chunk {remote}/{last} was replaced after this run listed it"):
        source.prepare()
    assert not list((tmp_path / "cache").rglob("*.part"))
    fresh = remote_source(s3_server, remote, tmp_path).split("train")  # a new run lists the new bytes ...
    with pytest.raises(ChunkError, match=rf"chunk {remote}/{last}: its bytes differ from what feedline.json"):
        fresh.chunks.read(len(fresh) - 1)  # ... which are not those feedline.json records a digest of


def test_two_datasets_on_one_node_share_the_cache_and_its_limit(s3_server, local_shards, tmp_path):
    """Train and val at two URLs (or two sources, or an old conversion): one cache directory, one bound for
    all of them together, not one per dataset."""
    urls = [s3_server.new_prefix() + "/train", s3_server.new_prefix() + "/train"]
    for url in urls:
        upload_dir(s3_server, local_shards, url)
    dataset = sum(p.stat().st_size for p in local_shards.rglob("*.bin"))
    sources = [remote_source(s3_server, url, tmp_path, cache_limit=dataset) for url in urls]
    splits = [s.split("train") for s in sources]
    cache = splits[0].chunks.cache
    assert cache.directory == splits[1].chunks.cache.directory
    for i in range(len(splits[0])):
        for records in splits:
            assert records.chunks.read(i)
            assert cache.usage() <= dataset  # both datasets whole would be twice that
    assert cache.fetched()["chunks"] > len(splits[0].chunks.files)  # each dataset in turn evicted the other


def test_a_mix_reads_an_s3_part_through_its_own_endpoint_beside_a_local_part_in_chunk_order(
    s3_server, remote, tmp_path
):
    """source=mix: an S3 shards part keeps its own endpoint, credentials and cache; a local folder part
    beside it; the shards part's slots follow its chunk-aware order."""

    from feedline.datasets.folder.source import FolderSource
    from feedline.datasets.mix.order import part_seed
    from feedline.datasets.mix.source import MixSource

    s3_part = {
        "_target_": "feedline.datasets.shards.source.ShardsSource",
        "path": remote,
        "val_fraction": 0,
        "window": 1,
        "cache_dir": str(tmp_path / "cache"),
        "cache_limit": "200KB",
        "storage_options": options(s3_server),
    }
    local = FolderSource(
        simple_tree(tmp_path / "tree", per_class=4), val_fraction=0, cache_dir=tmp_path / "c"
    )
    source = MixSource(
        {"remote": {"source": s3_part, "weight": 3}, "local": {"source": local}}, epoch_size=40
    )
    source.prepare()
    assert source.classes == local.classes  # the same three class names: merged
    train = pickle.loads(pickle.dumps(source.split("train")))
    order = train.epoch_order(0, 0)
    shards_rows = order[order < train.offsets[1]]
    assert len(shards_rows) == 30 and len(order) == 40
    assert shards_rows.tolist() == train.records[0].epoch_order(part_seed(0, 0), 0)[:30].tolist()
    for i in order.tolist():
        payload, label = train[i]
        assert len(payload) and 0 <= label < 3
    assert train.records[0].chunks.cache.fetched()["chunks"] == len(train.records[0].chunks.files)


@pytest.mark.parametrize("tail", ["a#b", "a?b=1"])
def test_a_prefix_with_a_hash_or_question_mark_is_read_as_written(s3_server, local_shards, tmp_path, tail):
    """'#' and '?' are characters of an S3 key: URL parsing read s3://bucket/x/a#b as s3://bucket/x/a (another
    dataset there, or a 'not a shards dataset' naming a prefix the user never wrote)."""
    url = f"{s3_server.new_prefix()}/{tail}"
    upload_dir(s3_server, local_shards, url)
    assert len(remote_source(s3_server, url, tmp_path).split("train")) == 30


def test_a_url_without_a_bucket_is_refused_by_key(tmp_path):
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards.output import output_dir

    with pytest.raises(ValueError, match=r"source.path=s3://: not a URL of the form s3://bucket/prefix"):
        ShardsSource("s3://", val_fraction=0, cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"out.path=s3:///: not a URL of the form s3://bucket/prefix"):
        output_dir(WriteOptions(path="s3:///", format="shards"))  # was written to a local folder 's3:'


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_attempts", "abc"),
        ("max_attempts", -1),
        ("max_attempts", 1.5),
        ("read_timeout", -1),
        ("connect_timeout", "5s"),
    ],
)
def test_a_retry_setting_that_is_no_number_is_refused_by_its_key(name, value):
    """They were taken as given and failed at the first request as a bare ValueError of int() or botocore's
    (or were rounded: 1.5 attempts), naming the object's URL but not the setting."""
    from feedline.storage.stores import S3Store

    with pytest.raises(ValueError, match=rf"out.storage_options.{name}={value!r} must be"):
        S3Store("s3://bucket/prefix", {name: value}, "out.path")
    assert S3Store("s3://bucket/prefix", {name: "7"})._max_attempts() in (5, 7)  # a number as text is fine


def test_a_conversion_to_a_url_killed_mid_upload_leaves_no_scratch_copy_behind(
    s3_server, tmp_path, monkeypatch
):
    """The dataset is written to a local scratch directory, then uploaded: a conversion killed (SIGKILL) during
    the upload left that whole copy in $TMPDIR for good, under a random name no later run looked for."""
    import multiprocessing
    import tempfile

    from feedline.datasets.folder.source import FolderSource
    from feedline.writers.options import WriteOptions
    from feedline.writers.shards import write as writer

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    source = FolderSource(
        simple_tree(tmp_path / "tree", per_class=3), val_fraction=0, cache_dir=tmp_path / "c"
    )
    url = s3_server.new_prefix()

    def convert():
        out = WriteOptions(
            path=url, format="shards", chunk_bytes="2KB", workers=1, storage_options=options(s3_server)
        )
        return writer.convert_source(source, out)

    def killed_mid_upload():
        monkeypatch.setattr(writer, "upload", lambda *a: os.kill(os.getpid(), signal.SIGKILL))
        convert()

    child = multiprocessing.get_context("fork").Process(target=killed_mid_upload)
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    convert()  # the next conversion to that URL
    assert not [p.name for p in scratch.iterdir() if p.is_dir()]
    assert len(remote_source(s3_server, url, tmp_path).split("train")) == 9


def test_an_upload_over_a_dataset_that_may_not_be_deleted_names_the_url(s3_server, local_shards, monkeypatch):
    """Credentials that may put but not delete (the earlier dataset's index.json goes first): a bare botocore
    ClientError, naming neither the object nor what to do."""
    from botocore.exceptions import ClientError

    from feedline.storage.stores import S3Store
    from feedline.writers import upload

    url = s3_server.new_prefix()
    upload.upload(str(local_shards), S3Store(url, options(s3_server), "out.path"))
    store = S3Store(url, options(s3_server), "out.path")

    def refused(**kwargs):
        raise ClientError(
            {"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "DeleteObject"
        )

    monkeypatch.setattr(store.client(), "delete_object", refused)
    with pytest.raises(
        StoreError, match=rf"{url}/index.json: .* refused the credentials .*AWS_ACCESS_KEY_ID"
    ):
        upload.upload(str(local_shards), store)


def test_an_index_listing_more_samples_than_a_chunk_can_hold_is_named_not_taken_for_a_small_cache(
    s3_server, local_shards, tmp_path
):
    """index.json's sample count for a chunk far above what its bytes can hold: the head read past the end of
    the cached chunk, was taken for an eviction 100 times, and blamed source.cache_limit."""
    import json
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(local_shards, copy)
    index = json.loads((copy / "index.json").read_text())
    more = 10_000 - index["chunks"][0]["chunk_size"]
    index["chunks"][0]["chunk_size"] = 10_000
    (copy / "index.json").write_text(json.dumps(index))
    labels = np.load(copy / "labels.npy")
    np.save(copy / "labels.npy", np.concatenate([labels, np.zeros(more, labels.dtype)]))  # consistent with it
    sidecar = json.loads((copy / "feedline.json").read_text())
    (copy / "feedline.json").write_text(json.dumps({**sidecar, "samples": sidecar["samples"] + more}))
    url = s3_server.new_prefix()
    upload_dir(s3_server, copy, url)
    records = remote_source(s3_server, url, tmp_path, cache_limit="200KB").split("train")
    first = records.chunks.files[0]
    with pytest.raises(
        ChunkError, match=rf"chunk {url}/{first} does not hold the 10000 samples index.json lists"
    ):
        records.chunks.read(0)


def test_a_chunk_the_local_file_refuses_is_not_fetched_again_as_a_broken_body(monkeypatch):
    """A write to the cache that fails (disk full, more bytes than index.json says) is no broken connection:
    it was requested again from the same byte, with backoff, max_attempts times, to fail the same way."""
    import errno

    from feedline.storage.stores import S3Store

    store, calls = S3Store("s3://bucket/prefix"), []

    class Body:
        def iter_chunks(self, n):
            yield b"a" * 50

    def call(method, rel, **kwargs):
        calls.append(kwargs)
        return {"Body": Body(), "ETag": '"e"'}

    class Full:
        def write(self, piece):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_call", call)
    with pytest.raises(OSError, match="No space left"):
        store.fetch("chunk-0-0.bin")(Full())
    assert len(calls) == 1

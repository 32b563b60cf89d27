"""Converting again to an output replaces only the earlier dataset's own files, on a local disk and in object
storage alike (``writers/target.py``): anything else there is refused before anything is deleted or written."""

from __future__ import annotations

import json
import shutil

import pytest

from feedline.datasets.folder.source import FolderSource
from feedline.datasets.shards.source import ShardsSource
from feedline.storage.stores import S3Store
from feedline.writers.options import WriteOptions
from feedline.writers.shards import write as writer
from feedline.writers.shards.output import check_target
from tests.helpers import simple_tree
from tests.s3_server import upload_dir
from tests.test_s3_shards import options


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("upload-trust")
    return FolderSource(simple_tree(tmp / "tree", per_class=3), val_fraction=0, cache_dir=tmp / "c")


def out(server, path, **changes) -> WriteOptions:
    remote = {"storage_options": options(server)} if str(path).startswith("s3://") else {}
    settings = {"format": "shards", "chunk_bytes": "2KB", "workers": 1, **remote, **changes}
    return WriteOptions(path=str(path), **settings)


def objects(server, url) -> dict[str, str]:
    """Every object under ``url``: its name relative to it -> its ETag."""
    bucket, prefix = url[len("s3://") :].split("/", 1)
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"][len(prefix) + 1 :]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def put(server, url, name, body=b"mine") -> None:
    bucket, prefix = url[len("s3://") :].split("/", 1)
    server.client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)


def own(server, url, tmp_path) -> set[str]:
    """What a dataset at ``url`` is made of, as its reader sees it (and nothing else may be there)."""
    chunks = ShardsSource(
        url, val_fraction=0, storage_options=options(server), cache_dir=tmp_path / "read"
    ).split("train")
    return {*chunks.chunks.files, "index.json", "feedline.json", "labels.npy"}


def test_converting_again_over_a_users_readme_and_nested_dataset_is_refused_and_deletes_nothing(
    s3_server, source
):
    url = s3_server.new_prefix()
    writer.convert_source(source, out(s3_server, url))
    put(s3_server, url, "README.txt")
    writer.convert_source(source, out(s3_server, url + "/val"))  # a held-out dataset inside it
    before = objects(s3_server, url)
    with pytest.raises(
        ValueError,
        match=rf"out.path={url} holds a shards dataset and objects of its own \(README.txt, val/chunk-0-0.bin, "
        r".* more\): converting again would delete them with the earlier dataset, so it is refused; move them out",
    ):
        writer.convert_source(source, out(s3_server, url, seed=3))
    assert objects(s3_server, url) == before  # nothing deleted, nothing written


def test_converting_again_over_only_the_datasets_own_objects_replaces_them_all(s3_server, source, tmp_path):
    url = s3_server.new_prefix()
    writer.convert_source(source, out(s3_server, url))
    put(s3_server, url, "skipped.tsv", b"path\terror\n")  # an earlier conversion's report: its own too
    writer.convert_source(source, out(s3_server, url, chunk_bytes="8KB", seed=1))
    assert set(objects(s3_server, url)) == own(s3_server, url, tmp_path)


@pytest.mark.parametrize(
    ("method", "nth"),
    [("delete_object", 3), ("upload_file", 2), ("upload_file", "feedline.json")],
    ids=["while-deleting", "mid-chunks", "at-the-sidecar"],
)
def test_an_upload_killed_anywhere_leaves_a_prefix_the_next_conversion_replaces(
    s3_server, source, tmp_path, monkeypatch, method, nth
):
    url = s3_server.new_prefix()
    writer.convert_source(source, out(s3_server, url, chunk_bytes="1KB"))
    store = S3Store(url, options(s3_server), "out.path")
    client, calls = store.client(), []
    real = getattr(client, method)

    def killed(*args, **kwargs):
        calls.append(kwargs.get("Key") or args[2])
        if nth == len(calls) or str(calls[-1]).endswith(str(nth)):
            raise KeyboardInterrupt  # killed here
        return real(*args, **kwargs)

    monkeypatch.setattr(client, method, killed)
    monkeypatch.setattr(writer, "remote_store", lambda options: store)
    with pytest.raises(KeyboardInterrupt):
        writer.convert_source(source, out(s3_server, url, chunk_bytes="4KB", seed=2))
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="is not a shards dataset"):
        own(s3_server, url, tmp_path)  # never read as a dataset meanwhile
    writer.convert_source(source, out(s3_server, url, chunk_bytes="4KB", seed=2))
    assert set(objects(s3_server, url)) == own(s3_server, url, tmp_path)


def test_a_part_keeps_the_same_rule_and_a_whole_conversion_never_replaces_parts(s3_server, source, tmp_path):
    url = s3_server.new_prefix()
    for k in (0, 1):
        writer.convert_source(source, out(s3_server, url, part=k, parts=2))
    put(s3_server, url, "README.txt")  # beside the parts: no part's
    writer.convert_source(source, out(s3_server, url, part=0, parts=2))
    put(s3_server, url, "part-00001-of-00002/notes.txt")
    before = objects(s3_server, url)
    with pytest.raises(
        ValueError, match=r"part-00001-of-00002 holds a shards dataset and objects .*notes.txt"
    ):
        writer.convert_source(source, out(s3_server, url, part=1, parts=2))
    with pytest.raises(
        ValueError, match=r"holds a dataset's parts \(part-00000-of-00002, part-00001-of-00002\)"
    ):
        writer.convert_source(source, out(s3_server, url))
    assert objects(s3_server, url) == before
    reader = ShardsSource(url, val_fraction=0, storage_options=options(s3_server), cache_dir=tmp_path / "c")
    assert len(reader.split("train")) == 9  # both parts, as they were


def _readme(d):
    (d / "README.txt").write_text("mine")


def _nested(d):
    (d / "val").mkdir()
    (d / "val" / "index.json").write_text("{}")


def _index_names_the_readme(d):
    _readme(d)
    index = json.loads((d / "index.json").read_text())
    index["chunks"].append({**index["chunks"][0], "filename": "README.txt"})
    (d / "index.json").write_text(json.dumps(index))


def _garbled_index(d):
    (d / "index.json").write_text("{not json")


def _stray_chunk(d):
    (d / "chunk-9-9.bin").write_bytes(b"\0" * 16)


def _no_sidecar(d):  # LitData's own dataset
    (d / "feedline.json").unlink()


def _no_index(d):  # what a killed upload leaves
    (d / "index.json").unlink()


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (lambda d: None, None),
        (_no_index, None),
        (_readme, "README.txt"),
        (_nested, "val/index.json"),
        (_index_names_the_readme, "README.txt"),
        (_garbled_index, "whose index.json does not read"),
        (_stray_chunk, "chunk-9-9.bin"),
        (_no_sidecar, r"not a whole shards dataset.s own: it is never overwritten \(chunk-0-0.bin"),
    ],
    ids=[
        "own",
        "unfinished",
        "readme",
        "nested",
        "index-names-readme",
        "garbled-index",
        "stray-chunk",
        "litdata",
    ],
)
def test_a_directory_and_a_prefix_holding_the_same_files_are_judged_alike(
    s3_server, source, tmp_path_factory, tmp_path, change, refused
):
    dataset = tmp_path_factory.getbasetemp() / "judged-dataset"
    if not dataset.exists():
        writer.convert_source(source, out(s3_server, dataset))
    local = tmp_path / "out"
    shutil.copytree(dataset, local)
    change(local)
    url = s3_server.new_prefix()
    upload_dir(s3_server, local, url)
    for target in (str(local), url):
        if refused is None:
            assert check_target(out(s3_server, target)) == target
        else:
            with pytest.raises(ValueError, match=rf"out.path={target} holds .*{refused}"):
                check_target(out(s3_server, target))


@pytest.mark.parametrize("how", ["overwritten-at-once", "overwritten-later", "added"])
def test_two_conversions_writing_one_prefix_at_once_publish_nothing_mixed(
    s3_server, source, tmp_path, monkeypatch, how
):
    """Two machines converting to one URL (each with its own lock): one's index.json over the other's chunks
    read as a dataset. Here the other conversion's puts come between this one's."""
    from feedline.writers.lock import OutputBusyError

    url = s3_server.new_prefix()
    store = S3Store(url, options(s3_server), "out.path")
    client, puts = store.client(), []
    real = client.upload_file
    bucket, prefix = url[len("s3://") :].split("/", 1)

    def meanwhile(path, bucket_, key, **kwargs):
        real(path, bucket_, key, **kwargs)
        puts.append(key)
        if len(puts) == 2:
            other = {
                "overwritten-at-once": puts[1],
                "overwritten-later": puts[0],
                "added": f"{prefix}/chunk-7-0.bin",
            }[how]
            s3_server.client().put_object(Bucket=bucket, Key=other, Body=b"the other conversion's")

    monkeypatch.setattr(client, "upload_file", meanwhile)
    monkeypatch.setattr(writer, "remote_store", lambda options: store)
    with pytest.raises(
        OutputBusyError, match=rf"out.path={url} changed while this conversion uploaded .*chunk-"
    ):
        writer.convert_source(source, out(s3_server, url, chunk_bytes="1KB"))
    assert "index.json" not in objects(s3_server, url)  # nothing published
    monkeypatch.undo()
    writer.convert_source(source, out(s3_server, url, chunk_bytes="1KB"))  # alone: replaced, published
    assert set(objects(s3_server, url)) == own(s3_server, url, tmp_path)


def test_a_symlink_planted_as_a_conversions_lock_file_is_never_followed(source, tmp_path):
    """<out.path>.lock beside an output in a shared folder: a link there had its target truncated and
    overwritten with the holder's name."""
    from feedline.writers.lock import OutputBusyError

    victim = tmp_path / "notes.txt"
    victim.write_text("mine")
    (tmp_path / "shards.lock").symlink_to(victim)
    with pytest.raises(OutputBusyError, match=rf"lock file {tmp_path / 'shards.lock'} of .* is a symlink"):
        writer.convert_source(source, out(None, tmp_path / "shards"))
    assert victim.read_text() == "mine" and not (tmp_path / "shards").exists()

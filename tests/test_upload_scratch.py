"""A conversion to a URL writes its dataset in a scratch folder of its own before the upload: made afresh
under the temp dir (mode 0o700), never a folder someone made there first under the name it would use,
and a killed conversion's scratch folder is removed by the next one only where it is this user's.

Another owner is real where the tests run as root (``os.lchown`` to an unused uid) and simulated otherwise."""

from __future__ import annotations

import os
import stat
import tempfile
import uuid

import pytest

from feedline.datasets.folder.source import FolderSource
from feedline.writers.lock import OutputBusyError
from feedline.writers.options import WriteOptions
from feedline.writers.shards import write as writer
from feedline.writers.shards.scratch import lock_path, locked
from tests.helpers import simple_tree
from tests.test_cache_trust import owned_by_another
from tests.test_s3_shards import options, remote_source


def test_a_scratch_folder_made_first_under_the_conversions_name_is_never_used(
    s3_server, tmp_path, monkeypatch
):
    """The name is guessable (a digest of the URL, the process id): another local user who makes it first,
    and can write to it, could change the chunks between their writing and their upload."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    url = s3_server.new_prefix()
    stem = f"{lock_path(url)}.scratch-"
    planted = temp / os.path.basename(f"{stem}{os.getpid()}")  # the name this very process would have used
    planted.mkdir()
    os.chmod(planted, 0o777)
    (planted / "theirs.txt").write_text("planted")
    dead = temp / os.path.basename(f"{stem}999999999")  # a 'killed conversion' of no live process ...
    dead.mkdir()
    (dead / "theirs.txt").write_text("kept")
    owned_by_another(dead, monkeypatch)  # ... but another user's: never removed
    used = []

    def upload(local, store):
        folder = os.path.dirname(local)
        st = os.lstat(folder)
        used.append((folder, stat.S_IMODE(st.st_mode), st.st_uid, sorted(os.listdir(folder))))
        return real_upload(local, store)

    real_upload = writer.upload
    monkeypatch.setattr(writer, "upload", upload)
    source = FolderSource(
        simple_tree(tmp_path / "tree", per_class=3), val_fraction=0, cache_dir=tmp_path / "c"
    )
    out = WriteOptions(
        path=url, format="shards", chunk_bytes="2KB", workers=1, storage_options=options(s3_server)
    )
    writer.convert_source(source, out)

    ((folder, mode, uid, listed),) = used
    assert folder not in (str(planted), str(dead)) and os.path.dirname(folder) == str(temp)
    assert os.path.basename(folder).startswith(os.path.basename(f"{stem}{os.getpid()}-"))
    assert (mode, uid, listed) == (0o700, os.geteuid(), ["dataset"])
    assert sorted(os.listdir(planted)) == ["theirs.txt"] and (planted / "theirs.txt").read_text() == "planted"
    assert (dead / "theirs.txt").read_text() == "kept"
    assert sorted(p.name for p in temp.iterdir() if p.is_dir()) == sorted([planted.name, dead.name])
    assert len(remote_source(s3_server, url, tmp_path).split("train")) == 9


def test_a_second_conversion_to_the_same_url_is_refused_naming_the_url_not_the_scratch_path():
    url = f"s3://bucket/taken-{uuid.uuid4().hex}"
    with locked(url, True), pytest.raises(OutputBusyError) as err, locked(url, True):
        pass
    said = str(err.value)
    assert (
        f"another conversion is writing {url} (pid {os.getpid()}" in said
        and f"out.path={url} is taken" in said
    )
    assert f"out.path={lock_path(url)}" not in said and f"{lock_path(url)}.lock" in said  # a detail only
    with locked(url, True):  # released: the next one goes on
        pass

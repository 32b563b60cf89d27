"""What a downloaded chunk holds is what the dataset recorded: the writer records each chunk's digest in
feedline.json, and the chunk cache hashes a download as it is written and refuses to publish one whose digest
differs (against a real S3 server). A local chunk is never hashed (size, offsets and labels check it), and a
dataset written before digests were recorded reads as before."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct

import numpy as np
import pytest

from feedline.datasets.shards.chunks import ChunkError
from feedline.datasets.shards.source import ShardsSource
from feedline.storage.stores import S3Store
from tests import test_shards_trust
from tests.s3_server import upload_dir
from tests.test_s3_shards import options
from tests.test_shards_trust import index_of, read_all, write_json

written = test_shards_trust.written  # the fixture: 12 one-image classes in chunks of one or two samples

WHERE = ["local", "s3"]


def uploaded(server, local) -> str:
    url = server.new_prefix() + "/ds"
    upload_dir(server, local, url)
    return url


def from_url(server, url, tmp_path) -> ShardsSource:
    return ShardsSource(
        url, val_fraction=0, window=2, cache_dir=tmp_path / "cache", storage_options=options(server)
    )


def other_pixels(chunk: bytes) -> bytes:
    """The chunk with every image's bytes inverted: the same size, offsets and labels, other pixels."""
    out = bytearray(chunk)
    n = struct.unpack_from("<I", chunk, 0)[0]
    offsets = struct.unpack_from(f"<{n + 1}I", chunk, 4)
    for start in offsets[:-1]:
        size = struct.unpack_from("<I", chunk, start)[0]
        body = slice(start + 8, start + 8 + size)
        out[body] = bytes(b ^ 0xFF for b in chunk[body])
    return bytes(out)


def samples(source: ShardsSource) -> list[tuple[bytes, int]]:
    records = source.split("train")
    return [(bytes(records[i][0]), records[i][1]) for i in range(len(records))]


def test_a_converted_dataset_records_the_digest_of_each_chunk(written):
    sidecar = json.loads((written / "feedline.json").read_text())
    names = [entry["filename"] for entry in index_of(written)["chunks"]]
    recorded = sidecar["chunk_digests"]
    assert recorded["algorithm"] == "sha256" and sorted(recorded["chunks"]) == sorted(names)
    for name in names:
        assert recorded["chunks"][name] == hashlib.sha256((written / name).read_bytes()).hexdigest()


def test_a_chunk_replaced_in_the_bucket_by_one_of_equal_size_and_labels_is_refused_and_never_cached(
    s3_server, written, tmp_path
):
    """Size, sample count, offsets table and every label agree with what the dataset recorded: only the bytes'
    digest tells that the pixels are not the ones converted."""
    url = uploaded(s3_server, written)
    name = index_of(written)["chunks"][1]["filename"]
    replaced = other_pixels((written / name).read_bytes())
    assert len(replaced) == (written / name).stat().st_size and replaced != (written / name).read_bytes()
    bucket, prefix = url[len("s3://") :].split("/", 1)
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=replaced)
    source = from_url(s3_server, url, tmp_path)
    source.prepare()  # every size agrees
    with pytest.raises(
        ChunkError,
        match=rf"chunk {re.escape(url)}/{name}: its bytes differ from what feedline.json records \(sha256 .*\): "
        r"it was replaced in the bucket, or damaged in transit; it was not cached",
    ):
        read_all(source)  # pickled first, as a worker reads: the digests go with the records
    cached = [p.name for p in (tmp_path / "cache" / "chunks").iterdir()]
    assert not [n for n in cached if n.endswith(f"-{name}") or n.endswith(".part")], cached


def test_a_dataset_whose_sidecar_records_no_digests_reads_as_before(s3_server, written, tmp_path):
    """Converted by an earlier feedline: its chunks read from a bucket exactly as from the disk."""
    old = shutil.copytree(written, tmp_path / "old")
    sidecar = json.loads((old / "feedline.json").read_text())
    del sidecar["chunk_digests"]
    write_json(old / "feedline.json", sidecar)
    local = samples(ShardsSource(old, val_fraction=0, cache_dir=tmp_path / "c"))
    assert samples(from_url(s3_server, uploaded(s3_server, old), tmp_path)) == local
    assert len(local) == 12


def test_a_download_resumed_after_its_body_broke_off_is_hashed_whole(
    s3_server, written, tmp_path, monkeypatch
):
    """The body of every chunk breaks off half-way the first time: the download goes on from the byte it
    reached, and the digest covers the whole file, in order, across the break."""
    real, ranged = S3Store._call, []

    class Broken:
        def __init__(self, data: bytes):
            self.data = data

        def iter_chunks(self, n):
            yield self.data[: len(self.data) // 2]
            raise ConnectionResetError("connection reset by peer")

    def call(self, method, rel, **kwargs):
        answer = real(self, method, rel, **kwargs)
        if method == "get_object" and rel.endswith(".bin"):
            if "Range" in kwargs:
                ranged.append(rel)
            else:
                answer = {**answer, "Body": Broken(answer["Body"].read())}
        return answer

    url = uploaded(s3_server, written)
    monkeypatch.setattr(S3Store, "_call", call)
    got = samples(from_url(s3_server, url, tmp_path))
    assert got == samples(ShardsSource(written, val_fraction=0, cache_dir=tmp_path / "c"))
    assert len(set(ranged)) == len(index_of(written)["chunks"])  # every chunk was resumed once


BAD_DIGESTS = [
    ("md5", None, r'chunk_digests\["algorithm"\] \'md5\' is not one of sha256, blake2b'),
    ("sha256", "0123", r"chunk_digests\[\"chunks\"\]\['chunk-0-0.bin'\] = '0123' is not a sha256 digest"),
    ("sha256", "Z" * 64, r"chunk_digests\[\"chunks\"\]\['chunk-0-0.bin'\] = 'ZZZ.*' is not a sha256 digest"),
    ("sha256", 7, r"chunk_digests\[\"chunks\"\]\['chunk-0-0.bin'\] = 7 is not a sha256 digest"),
]


@pytest.mark.parametrize(("algorithm", "digest", "said"), BAD_DIGESTS)
def test_a_mistyped_digest_is_named_with_its_file_and_chunk(written, tmp_path, algorithm, digest, said):
    copy = shutil.copytree(written, tmp_path / "ds")
    sidecar = json.loads((copy / "feedline.json").read_text())
    sidecar["chunk_digests"]["algorithm"] = algorithm
    if digest is not None:
        sidecar["chunk_digests"]["chunks"]["chunk-0-0.bin"] = digest
    write_json(copy / "feedline.json", sidecar)
    with pytest.raises(ValueError, match=rf"{copy / 'feedline.json'}: {said}.*convert it again"):
        ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")


@pytest.mark.parametrize("where", WHERE)
def test_digests_of_another_count_of_chunks_than_index_json_lists_are_refused(
    written, tmp_path, request, where
):
    copy = shutil.copytree(written, tmp_path / "ds")
    sidecar = json.loads((copy / "feedline.json").read_text())
    sidecar["chunk_digests"]["chunks"].pop(index_of(copy)["chunks"][-1]["filename"])
    write_json(copy / "feedline.json", sidecar)
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        copy = uploaded(server, copy)
        opening = lambda: from_url(server, copy, tmp_path)  # noqa: E731
    else:
        opening = lambda: ShardsSource(copy, val_fraction=0, cache_dir=tmp_path / "c")  # noqa: E731
    chunks = len(index_of(written)["chunks"])
    with pytest.raises(
        ValueError,
        match=rf"feedline.json:? records the digests of {chunks - 1} chunks, index.json lists {chunks}\b",
    ):
        opening()


def test_digests_for_chunks_index_json_does_not_list_are_refused_before_any_download(
    s3_server, written, tmp_path
):
    copy = shutil.copytree(written, tmp_path / "ds")
    sidecar = json.loads((copy / "feedline.json").read_text())
    digests = sidecar["chunk_digests"]["chunks"]
    last = index_of(copy)["chunks"][-1]["filename"]
    digests["chunk-9-999.bin"] = digests.pop(last)
    write_json(copy / "feedline.json", sidecar)
    url = uploaded(s3_server, copy)
    with pytest.raises(
        ValueError,
        match=rf"{re.escape(url)}/feedline.json: records the digests of .* \(none for {last}\): its files are not "
        r"of one conversion",
    ):
        from_url(s3_server, url, tmp_path)
    assert not list((tmp_path / "cache" / "chunks").glob("*-chunk-*"))


def test_the_labels_agree_so_only_the_digest_tells_the_replaced_chunk_apart(written):
    """The premise of the replacement above: the replaced chunk's labels are the recorded ones."""
    name = index_of(written)["chunks"][1]["filename"]
    chunk = other_pixels((written / name).read_bytes())
    n = struct.unpack_from("<I", chunk, 0)[0]
    offsets = struct.unpack_from(f"<{n + 1}I", chunk, 4)
    labels = [struct.unpack_from("<q", chunk, b - 8)[0] for b in offsets[1:]]
    first = sum(entry["chunk_size"] for entry in index_of(written)["chunks"][:1])
    assert labels == np.load(written / "labels.npy")[first : first + n].tolist()

"""The object-storage tests run against a real S3 server (SeaweedFS), never a mock: these check the server
itself does what the tests lean on (signatures checked); test_s3_shards stops and restarts it mid-pass."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError


def test_the_s3_server_stores_lists_and_checks_signatures(s3_server):
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="a/b.bin", Body=b"feedline")
    listed = client.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert [o["Key"] for o in listed["Contents"]] == ["a/b.bin"]
    assert client.get_object(Bucket=bucket, Key="a/b.bin")["Body"].read() == b"feedline"
    with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
        s3_server.client(secret="wrong").list_objects_v2(Bucket=bucket)

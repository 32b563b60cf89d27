"""The object-storage tests run against a real S3 server (SeaweedFS), never a mock: these check the server
itself does what the tests lean on (signatures checked, stopped and restarted by its process id)."""

from __future__ import annotations

import os

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError


def test_the_s3_server_stores_lists_and_checks_signatures(s3_server):
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="a/b.bin", Body=b"feedline")
    listed = client.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert [o["Key"] for o in listed["Contents"]] == ["a/b.bin"]
    assert client.get_object(Bucket=bucket, Key="a/b.bin")["Body"].read() == b"feedline"
    with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
        s3_server.client(secret="wrong").list_objects_v2(Bucket=bucket)


def test_the_s3_server_stops_by_its_process_id_and_comes_back_with_its_data(s3_server):
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="kept", Body=b"x")
    pid = s3_server.process.pid
    s3_server.stop()
    with pytest.raises(EndpointConnectionError):
        s3_server.client().list_objects_v2(Bucket=bucket)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, not left running
    s3_server.start()
    assert s3_server.client().get_object(Bucket=bucket, Key="kept")["Body"].read() == b"x"

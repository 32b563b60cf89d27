"""Making a boto3 S3 client for a store (``storage/stores.py``), and saying what its errors mean.

The client takes the store's own options (endpoint, region, credentials, profile, retries, timeouts) over the
standard places; a secret given as ``${oc.env:NAME}`` is read from the environment here, where the client is
made, and nowhere else. Every error becomes a ``StoreError`` naming the object's URL, the endpoint, and what
to set.
"""

from __future__ import annotations

import logging
import math
import os

from feedline.storage.secrets import ENV_REFERENCE, SECRET_OPTIONS, userinfo_refusal

MAX_ATTEMPTS, CONNECT_TIMEOUT, READ_TIMEOUT = 5, 5, 30


class StoreError(RuntimeError):
    """Object storage answered with an error, or could not be reached; the message names the URL and the fix."""


CREDENTIALS_HELP = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or this {owner}'s own "
    "{group}.storage_options.aws_access_key_id / aws_secret_access_key / profile_name"
)
ENDPOINT_HELP = "set AWS_ENDPOINT_URL, or this {owner}'s own {group}.storage_options.endpoint_url"


def _help(text: str, key: str) -> str:
    """``text`` for the config group that ``key`` belongs to: ``source.path`` -> source.storage_options,
    ``out.path`` (convert.py's output) -> out.storage_options."""
    group = str(key).split(".", 1)[0]
    return text.format(group=group, owner="output" if group == "out" else "source")


def quiet_botocore() -> None:
    """botocore logs at INFO where it found the credentials and the endpoint, once per client, so once per
    process and DataLoader worker under Hydra's INFO root logger; those lines say nothing wrong. Raised to
    WARNING unless the user set a level for them (``hydra.verbose=botocore`` still shows them)."""
    for name in ("botocore.credentials", "botocore.configprovider"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def _setting(name: str, value):
    """A retry setting's value as a number (attempts: a whole number >= 1; timeouts: seconds > 0), else None."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        return None
    if name == "max_attempts":
        return int(number) if 1 <= number < math.inf and number == int(number) else None
    return number if 0 < number < math.inf else None


def max_attempts(store) -> int:
    return _setting("max_attempts", store.options.get("max_attempts", MAX_ATTEMPTS))


def make_client(store):
    """A boto3 S3 client for ``store``'s options: its endpoint, region, credentials (a secret read from the
    environment here), retries and timeouts."""
    import boto3
    from botocore.config import Config

    quiet_botocore()
    o = store.options
    session = boto3.session.Session(profile_name=o.get("profile_name"))
    config = Config(
        retries={"max_attempts": max_attempts(store), "mode": "standard"},
        connect_timeout=float(o.get("connect_timeout", CONNECT_TIMEOUT)),
        read_timeout=float(o.get("read_timeout", READ_TIMEOUT)),
    )
    kwargs = {
        k: o[k]
        for k in (
            "endpoint_url",
            "region_name",
            "aws_access_key_id",
            "aws_secret_access_key",
            "aws_session_token",
            "verify",
        )
        if o.get(k) is not None
    }
    kwargs.update({k: read_secret(store, k) for k in SECRET_OPTIONS if k in kwargs})
    client = session.client("s3", config=config, **kwargs)
    # the endpoint of AWS_ENDPOINT_URL or a profile (the options' own is checked when the store is made)
    where = f"{store.key.split('.')[0]}.storage_options"
    refusal = userinfo_refusal(
        "AWS_ENDPOINT_URL (or a profile's endpoint_url)", client.meta.endpoint_url, where
    )
    if refusal:
        raise StoreError(f"{store.url}: {refusal}")
    store._client, store._pid = client, os.getpid()
    return store._client


def read_secret(store, name: str) -> str:
    """A secret option's value; ``${oc.env:NAME}`` is read from the environment here, where the client is
    made, so the value itself is never part of any config or record."""
    value = str(store.options[name])
    found = ENV_REFERENCE.fullmatch(value.strip())
    if not found:
        return value
    if found.group(1) not in os.environ:
        where = f"{store.key.split('.')[0]}.storage_options.{name}"
        raise StoreError(
            f"{store.url}: {where} refers to the environment variable {found.group(1)}, which this process "
            f"does not have: export {found.group(1)}=... before the run (or give {where} again)"
        )
    return os.environ[found.group(1)]


def store_error(store, err: Exception, rel: str) -> StoreError:
    """``err`` (boto3's) as a StoreError that names the object's URL, the endpoint and what to do."""
    from botocore import exceptions as bx

    url = store.where(rel)
    try:
        endpoint = store.endpoint
    except Exception:  # no client at all (a profile that does not exist)
        endpoint = store.options.get("endpoint_url") or "the default endpoint"
    code = ""
    if isinstance(err, bx.ClientError):
        code = str(err.response.get("Error", {}).get("Code", ""))
        status = str(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        if code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "403") or status == "403":
            text = f"{url}: {endpoint} refused the credentials ({code or status}): {_help(CREDENTIALS_HELP, store.key)}"
        elif code == "NoSuchBucket":
            text = f"{url}: bucket {store.bucket!r} does not exist at {endpoint}: check {store.key}, or {_help(ENDPOINT_HELP, store.key)}"
        elif code in ("PreconditionFailed", "412") or status == "412":
            text = (
                f"{url} was replaced at {endpoint} after this run listed it: the dataset was written again "
                f"under a running job; start the run again"
            )
        elif code in ("404", "NoSuchKey", "NotFound"):
            text = f"{url} does not exist at {endpoint}"
        else:
            text = f"{url}: {endpoint} answered {code or status}: {err}"
    elif isinstance(err, bx.NoCredentialsError | bx.PartialCredentialsError):
        text = f"{url}: no credentials found: {_help(CREDENTIALS_HELP, store.key)}"
    elif isinstance(err, bx.ProfileNotFound):
        text = f"{url}: {err}: set {store.key.split('.', 1)[0]}.storage_options.profile_name (or AWS_PROFILE) to a profile of ~/.aws/config"
    elif isinstance(err, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError):
        text = (
            f"{url}: cannot reach {endpoint} after {max_attempts(store)} attempts with backoff ({type(err).__name__}); "
            f"is it up? The endpoint: {_help(ENDPOINT_HELP, store.key)}"
        )
    elif (
        isinstance(err, bx.InvalidEndpointDiscoveryConfigurationError | ValueError)
        and "endpoint" in str(err).lower()
    ):
        text = (
            f"{url}: invalid endpoint ({err}): an endpoint is a URL with its scheme (https://host or "
            f"http://host:port); {_help(ENDPOINT_HELP, store.key)}"
        )
    else:
        text = f"{url}: {type(err).__name__}: {err}"
    out = StoreError(text)
    out.code = code
    out.unreachable = isinstance(
        err, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError
    )
    return out

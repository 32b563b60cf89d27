"""LitData's own reader against an ``http://`` S3 endpoint (SeaweedFS, MinIO, a lab's gateway).

LitData 0.2.76 downloads chunks through obstore without ``allow_http``: every chunk download from an
``http://`` endpoint fails (reqwest ``BadScheme``), and nothing in ``storage_options`` changes that. The one
switch is a private name, ``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS["allow_http"]``, set before
the loader's workers start. ``benchmarks/shards.py`` uses it for its LitData-from-S3 anchor;
``tests/test_s3_shards.py`` pins both halves (fails without it, reads with it), so a LitData release that
changes either is noticed.
"""

from __future__ import annotations


def allow_http() -> None:
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True


def without_obstore() -> None:
    """LitData's other route: boto3 downloads (its S3 client), obstore off."""
    from litdata.streaming import downloader

    downloader._OBSTORE_AVAILABLE = False


def storage_options(endpoint: str, key: str, secret: str, region: str) -> dict:
    """LitData's storage_options for an S3 endpoint: boto3 client arguments."""
    return {
        "endpoint_url": endpoint,
        "aws_access_key_id": key,
        "aws_secret_access_key": secret,
        "region_name": region,
    }


if (
    __name__ == "__main__"
):  # litdata_http.py URL ENDPOINT KEY SECRET REGION CACHE [--allow-http|--boto3] [--no-workers]
    import sys

    import litdata

    url, endpoint, key, secret, region, cache = sys.argv[1:7]
    if "--allow-http" in sys.argv:
        allow_http()
    if "--boto3" in sys.argv:
        without_obstore()
    workers = 0 if "--no-workers" in sys.argv else 2
    dataset = litdata.StreamingDataset(
        url, storage_options=storage_options(endpoint, key, secret, region), cache_dir=cache
    )
    # each batch as its count: the samples' bytes stay in the worker
    loader = litdata.StreamingDataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=len)
    print(len(dataset), sum(loader))

"""A local S3 server for the object storage tests and bench: moto in server mode, as
s3fs's own tests use, bound to 127.0.0.1 on a free port. Clients reach it through the
standard AWS_ENDPOINT_URL variable with throwaway keys, as a user's credential chain
would give them."""

import contextlib
from collections.abc import Iterator

from tests.harness.procs import free_port

BUCKET = "quotaflow-test"


def s3_env(endpoint: str) -> dict[str, str]:
    """What a process needs to reach the server: the endpoint and test credentials."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def s3_server(bucket: str = BUCKET) -> Iterator[str]:
    """A running moto S3 server with `bucket` made; its endpoint URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        env = s3_env(endpoint)
        boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]
                     ).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()

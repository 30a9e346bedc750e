"""A local S3 server for the object storage tests and bench: moto in server mode, as
s3fs's own tests use, bound to 127.0.0.1 on a free port. Clients reach it through the
standard AWS_ENDPOINT_URL variable with throwaway keys, as a user's credential chain
would give them. The tests run it on a thread of their own process (quick to start);
the benches in a process of its own (`own_process`), as a real store is: a server on
the caller's threads would spend the caller's interpreter lock on every byte."""

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from tests.harness.procs import free_port

BUCKET = "quotaflow-test"


def s3_env(endpoint: str) -> dict[str, str]:
    """What a process needs to reach the server: the endpoint and test credentials."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def s3_server(bucket: str = BUCKET, own_process: bool = False) -> Iterator[str]:
    """A running moto S3 server with `bucket` made; its endpoint URL."""
    import boto3

    port = free_port()
    with contextlib.ExitStack() as running:
        running.enter_context(_server_process(port) if own_process else _server_thread(port))
        endpoint = f"http://127.0.0.1:{port}"
        env = s3_env(endpoint)
        boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]
                     ).create_bucket(Bucket=bucket)
        yield endpoint


@contextlib.contextmanager
def _server_thread(port: int) -> Iterator[None]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield
    finally:
        server.stop()


@contextlib.contextmanager
def _server_process(port: int, start_s: float = 30.0) -> Iterator[None]:
    """moto_server in a child process, stopped by its pid on leaving."""
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + start_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not listen on {port} "
                                   f"(exit {server.returncode})")
            time.sleep(0.1)
        yield
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


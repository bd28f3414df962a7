"""moto in server mode on loopback, as the AWS tests use it: one place that starts it, points the AWS
SDK's credentials and region at it, and empties it first (moto keeps its backends per process, not
per server, so an earlier test's resources would otherwise still be there)."""
from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kit.backends.local import free_port

REGION = "us-east-1"


@contextmanager
def moto_server(env: pytest.MonkeyPatch, region: str = REGION) -> Iterator[str]:
    """A fresh moto server; yields its URL. ``env`` gets test credentials and ``region``."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=30).close()
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": region}.items():
            env.setenv(key, value)
        env.delenv("AWS_PROFILE", raising=False)
        yield url
    finally:
        server.stop()


@contextmanager
def s3_bucket(env: pytest.MonkeyPatch, bucket: str = "ckpts") -> Iterator[str]:
    """A moto server with one S3 bucket, reached by boto3 and s3fs through ``AWS_ENDPOINT_URL``; yields
    ``s3://<bucket>``. Skips the test where s3fs or moto's server is not installed."""
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    import boto3

    with moto_server(env) as endpoint:
        env.setenv("AWS_ENDPOINT_URL", endpoint)
        boto3.client("s3", region_name=REGION, endpoint_url=endpoint).create_bucket(Bucket=bucket)
        # fsspec keeps one filesystem per set of arguments: one made for an earlier test's server would
        # reach that server's port, now closed
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            yield f"s3://{bucket}"
        finally:
            s3fs.S3FileSystem.clear_instance_cache()


@contextmanager
def console_outputs(outputs: dict[str, str]) -> Iterator[dict[str, str]]:
    """moto's GetConsoleOutput answers every instance with one fixed kernel log
    (moto/ec2/responses/general.py); inside this, an instance of ``outputs`` (instance id -> text, which
    the caller may fill in as instances boot) answers its own text, base64 in ``Output`` as EC2 gives
    it. moto must run in this process (ThreadedMotoServer)."""
    from moto.core.responses import ActionResult
    from moto.core.utils import utcnow
    from moto.ec2.responses.general import General
    from moto.ec2.utils import Base64EncodedString

    original = General.get_console_output

    def get_console_output(self):
        iid = self._get_param("InstanceId")
        if iid not in outputs:
            return original(self)
        self.ec2_backend.get_instance(iid)  # an unknown id: InvalidInstanceID.NotFound, as from EC2
        return ActionResult({"InstanceId": iid, "Timestamp": utcnow(),
                             "Output": Base64EncodedString.from_raw_string(outputs[iid])})

    General.get_console_output = get_console_output  # type: ignore[method-assign]
    try:
        yield outputs
    finally:
        General.get_console_output = original  # type: ignore[method-assign]

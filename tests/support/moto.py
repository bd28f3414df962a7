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

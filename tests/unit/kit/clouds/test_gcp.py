"""kit.clouds.gcp: kit's own Compute Engine clients (the watcher's source, the host keys) reach the endpoint
Terraform's Google provider is given (``GOOGLE_COMPUTE_CUSTOM_ENDPOINT``, as "https://HOST/compute/v1/")
with Application Default Credentials. The Compute API is the loopback FAKE of tests/support/gcp_compute.py
(shaped like the documented v1 REST API), which here refuses any request without the access token its
OAuth token endpoint gave for the service-account key file (its ``token_uri``)."""

from __future__ import annotations

import pytest

pytest.importorskip("google.cloud.compute_v1")

from kit.backends.base import Node
from kit.clouds.gcp import CLOUD, COMPUTE_ENDPOINT_ENV, compute_api_endpoint
from kit.errors import KitError
from tests.support.files import switchable_spec
from tests.support.gcp_compute import FakeCompute
from tests.support.host_keys import ed25519_key

TOKEN = "ya29.unit-test-token"


@pytest.mark.parametrize(("value", "endpoint"), [
    ("", None),
    ("http://127.0.0.1:5000/compute/v1/", "http://127.0.0.1:5000"),
    ("https://compute-kit.p.googleapis.com/compute/v1/", "https://compute-kit.p.googleapis.com"),
    ("https://compute-kit.p.googleapis.com", "https://compute-kit.p.googleapis.com"),
])
def test_the_providers_compute_endpoint_is_the_clients_api_endpoint(monkeypatch, value, endpoint):
    monkeypatch.setenv(COMPUTE_ENDPOINT_ENV, value)
    assert compute_api_endpoint() == endpoint


@pytest.mark.parametrize("value", ["compute.googleapis.com", "ftp://host/compute/v1/",
                                   "https://host/compute/beta/", "https://host/compute/v1/x"])
def test_an_endpoint_that_is_no_compute_v1_url_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(COMPUTE_ENDPOINT_ENV, value)
    with pytest.raises(KitError) as raised:
        compute_api_endpoint()
    assert raised.value.where == COMPUTE_ENDPOINT_ENV and "/compute/v1/" in raised.value.fix


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake as the Compute endpoint, and a service account's key refreshed at its token endpoint."""
    with FakeCompute(project="my-gcp-project", token=TOKEN) as compute:
        adc = compute.service_account_file(tmp_path / "key.json")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
        monkeypatch.setenv(COMPUTE_ENDPOINT_ENV, f"{compute.endpoint}/compute/v1/")
        yield compute


def test_the_watcher_and_the_host_keys_read_the_endpoint_terraform_writes_to(fake, tmp_path):
    spec = switchable_spec("gcp-a3-spot")
    fake.insert("instances", spec.zone, {"name": "a3-spot-0", "labels": {"kit-cluster": spec.name},
                                         "metadata": {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]}})
    key = ed25519_key("a3-spot-0")
    fake.guest_attributes["a3-spot-0"] = {"hostkeys/ssh-ed25519": key.split()[1]}
    node = Node(name="a3-spot-0", instance_id=fake.instances[0]["id"], rank=0, zone=spec.zone)

    assert CLOUD.host_keys(spec, node) == [key]
    poll = CLOUD.event_source(spec, tmp_path).poll()
    assert [(i.instance, i.state) for i in poll.instances] == [(fake.instances[0]["id"], "running")]
    assert any("/instances?filter=" in r for r in fake.requests), fake.requests  # each with its credential

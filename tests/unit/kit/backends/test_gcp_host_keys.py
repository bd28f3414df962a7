"""kit.backends.gcp_host_keys against a FAKE Compute Engine on loopback (tests/support/gcp_compute.py),
shaped like the documented ``instances.getGuestAttributes``: a ``compute#guestAttributes`` whose
``queryValue.items`` are the entries (namespace, key, value) under ``queryPath``, as Google's guest agent
writes an instance's host keys (``hostkeys/<type>`` = the key's base64) when its metadata has
``enable-guest-attributes`` TRUE. google-cloud-compute's REST transport talks to it with AnonymousCredentials.
"""
from __future__ import annotations

import pytest

pytest.importorskip("google.cloud.compute_v1")
from google.auth.credentials import AnonymousCredentials

from kit.backends.gcp_host_keys import published_host_keys
from kit.errors import KitError
from tests.support.gcp_compute import FakeCompute
from tests.support.host_keys import ed25519_key, rsa_key

ZONE = "us-central1-a"
GUEST_ATTRIBUTES = {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]}


def keys_of(fake: FakeCompute, name: str) -> list[str]:
    return published_host_keys(fake.project, ZONE, name, credentials=AnonymousCredentials(),
                               api_endpoint=fake.endpoint)


def test_the_keys_the_guest_agent_wrote_and_nothing_before():
    ed, rsa = ed25519_key("node-0"), rsa_key("node-0")
    with FakeCompute() as fake:
        fake.insert("instances", ZONE, {"name": "node-0", "metadata": GUEST_ATTRIBUTES})
        assert keys_of(fake, "node-0") == [], "booting: the guest agent has written nothing yet"
        fake.guest_attributes["node-0"] = {f"hostkeys/{k.split()[0]}": k.split()[1] for k in (ed, rsa)}
        fake.guest_attributes["node-0"]["hostkeys/ssh-ed25519-broken"] = "AAAA"
        fake.guest_attributes["node-0"]["other/ssh-ed25519"] = ed25519_key("not a host key").split()[1]
        assert keys_of(fake, "node-0") == [ed, rsa], "only whole keys of the hostkeys/ namespace"
        assert any("getGuestAttributes?queryPath=hostkeys%2F" in r for r in fake.requests)


def test_an_instance_without_guest_attributes_publishes_none():
    with FakeCompute() as fake:
        fake.insert("instances", ZONE, {"name": "node-0"})
        fake.guest_attributes["node-0"] = {"hostkeys/ssh-ed25519": ed25519_key("x").split()[1]}
        assert keys_of(fake, "node-0") == []


def test_a_refused_request_says_which_permission():
    with FakeCompute() as fake:
        fake.insert("instances", ZONE, {"name": "node-0", "metadata": GUEST_ATTRIBUTES})
        fake.fail_with = 403
        with pytest.raises(KitError) as raised:
            keys_of(fake, "node-0")
        assert "compute.instances.getGuestAttributes" in raised.value.fix

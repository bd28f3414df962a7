"""kit.backends.gcp_firewall against a FAKE Compute Engine firewalls.list on loopback.

The fake answers one REST method shaped like the documented Compute Engine v1 API:
``firewalls.list`` (GET /compute/v1/projects/{project}/global/firewalls, a ``FirewallList`` with
``items``/``nextPageToken``; each ``Firewall`` has ``network``, ``direction``, ``disabled``,
``sourceRanges``, ``targetTags``, ``allowed[].IPProtocol/ports``). google-cloud-compute's real REST
transport talks to it through ``client_options={"api_endpoint": ...}`` with AnonymousCredentials.
It is not GCP: it proves kit reads the documented fields and pages, nothing about GCP's behaviour.
"""

from __future__ import annotations

import copy
import threading
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

pytest.importorskip("google.cloud.compute_v1")
from google.auth.credentials import AnonymousCredentials

from kit.backends.gcp_firewall import network_warnings, wider_ssh_rules
from kit.paths import EXAMPLES_DIR
from kit.spec import parse_spec
from tests.support.gcp_api import ComputeHandler

PROJECT = "my-gcp-project"
NET = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/networks"


def rule(name, network="default", ranges=("0.0.0.0/0",), allowed=({"IPProtocol": "tcp", "ports": ["22"]},), **kw):
    return {"kind": "compute#firewall", "name": name, "network": f"{NET}/{network}", "direction": "INGRESS",
            "priority": 1000, "sourceRanges": list(ranges), "allowed": list(allowed), "disabled": False,
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/firewalls/{name}", **kw}


RULES = [
    rule("default-allow-ssh"),  # GCP's default network: SSH from anywhere
    rule("default-allow-internal", ranges=("10.128.0.0/9",),
         allowed=({"IPProtocol": "tcp", "ports": ["0-65535"]}, {"IPProtocol": "udp", "ports": ["0-65535"]})),
    rule("office-ssh", ranges=("203.0.113.0/25",)),  # inside allowed_cidrs: fine
    rule("web", allowed=({"IPProtocol": "tcp", "ports": ["80", "443"]},)),  # not SSH
    rule("other-vms", target_tags=["bastion"]),  # applies to other VMs only
    rule("off", disabled=True),
    rule("egress", direction="EGRESS", destinationRanges=["0.0.0.0/0"]),
    rule("all-protocols", ranges=("198.51.100.0/24",), allowed=({"IPProtocol": "all"},)),
    rule("other-network", network="prod"),
]


@pytest.fixture
def fake():
    state = {"rules": copy.deepcopy(RULES), "requests": []}

    class Handler(ComputeHandler):
        def do_GET(self):
            url = urlparse(self.path)
            state["requests"].append(url.path)
            if url.path != f"/compute/v1/projects/{PROJECT}/global/firewalls":
                return self.error(404, f"The resource '{url.path}' was not found", "notFound")
            start = int(parse_qs(url.query).get("pageToken", ["0"])[0])
            body = {"kind": "compute#firewallList", "items": state["rules"][start:start + 3]}  # small pages
            if start + 3 < len(state["rules"]):
                body["nextPageToken"] = str(start + 3)  # the client must follow it
            return self.reply(200, body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    state["endpoint"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def test_rules_wider_than_allowed_cidrs_are_listed(fake):
    found = wider_ssh_rules(PROJECT, "default", ["203.0.113.0/24"], "kit-a3-spot",
                            credentials=AnonymousCredentials(), api_endpoint=fake["endpoint"])
    # the default network's internal rule admits SSH from the whole 10.128.0.0/9 too
    assert found == ["default-allow-ssh: SSH from 0.0.0.0/0", "default-allow-internal: SSH from 10.128.0.0/9",
                     "all-protocols: SSH from 198.51.100.0/24"]
    assert len(fake["requests"]) == 3  # every page


def test_plan_warns_only_for_an_existing_network(fake):
    data = yaml.safe_load((EXAMPLES_DIR / "gcp-a3-spot.yaml").read_text())
    own = parse_spec(data)
    assert network_warnings(own, credentials=AnonymousCredentials(), api_endpoint=fake["endpoint"]) == []
    assert fake["requests"] == [], "a network kit creates has no other rules: nothing to look up"
    existing = parse_spec({**data, "network": {"name": "default"}})
    warnings = network_warnings(existing, credentials=AnonymousCredentials(), api_endpoint=fake["endpoint"])
    assert len(warnings) == 3 and "default-allow-ssh: SSH from 0.0.0.0/0" in warnings[0]
    fake["rules"] = [r for r in fake["rules"] if r["name"] not in ("default-allow-ssh", "default-allow-internal",
                                                                     "all-protocols")]
    assert network_warnings(existing, credentials=AnonymousCredentials(), api_endpoint=fake["endpoint"]) == []


def test_a_failed_lookup_is_a_warning_not_a_failed_plan(fake):
    data = yaml.safe_load((EXAMPLES_DIR / "gcp-a3-spot.yaml").read_text())
    existing = parse_spec({**data, "network": {"name": "default"}, "project": "someone-else"})  # 404 here
    warnings = network_warnings(existing, credentials=AnonymousCredentials(), api_endpoint=fake["endpoint"])
    assert len(warnings) == 1 and "could not list the firewall rules" in warnings[0]

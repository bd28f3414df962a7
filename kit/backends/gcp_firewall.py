"""GCP: the firewall rules of an existing network that admit SSH more widely than the spec does.

A cluster on a network kit creates has one SSH rule, ``ssh.allowed_cidrs``. On an existing network
(``network.name``, an explicit opt-in) every other ingress rule of that network reaches the nodes
too; the ``default`` network's ``default-allow-ssh`` admits tcp:22 from 0.0.0.0/0. ``kit plan``
lists such rules through the Compute API (``firewalls.list``) so that the review sees them.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.clouds.gcp import GcpSpec

SSH_PORT = 22


def _covers_ssh(allowed) -> bool:
    """Whether an ``allowed`` entry of a firewall rule admits tcp:22 (no ports means every port)."""
    for entry in allowed:
        if entry.I_p_protocol not in ("tcp", "all", "6"):
            continue
        if not entry.ports:
            return True
        for spec in entry.ports:
            low, _, high = spec.partition("-")
            if int(low) <= SSH_PORT <= int(high or low):
                return True
    return False


def _within(net: ipaddress.IPv4Network | ipaddress.IPv6Network,
            allowed: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    if isinstance(net, ipaddress.IPv4Network) and isinstance(allowed, ipaddress.IPv4Network):
        return net.subnet_of(allowed)
    if isinstance(net, ipaddress.IPv6Network) and isinstance(allowed, ipaddress.IPv6Network):
        return net.subnet_of(allowed)
    return False  # another IP version


def _wider(ranges, allowed_cidrs: list[str]) -> list[str]:
    allowed = [ipaddress.ip_network(c, strict=False) for c in allowed_cidrs]
    out = []
    for cidr in ranges:
        net = ipaddress.ip_network(cidr, strict=False)
        if not any(_within(net, a) for a in allowed):
            out.append(cidr)
    return out


def wider_ssh_rules(project: str, network: str, allowed_cidrs: list[str], node_tag: str, *,
                    credentials=None, api_endpoint: str | None = None) -> list[str]:
    """``"<rule>: SSH from <cidrs>"`` for each enabled ingress rule of ``network`` that applies to the
    nodes (no target tags, or the nodes' tag) and admits tcp:22 from outside ``allowed_cidrs``."""
    from google.cloud import compute_v1

    options = {"api_endpoint": api_endpoint} if api_endpoint else None
    client = compute_v1.FirewallsClient(credentials=credentials, client_options=options)
    found = []
    for rule in client.list(project=project):
        if rule.network.rsplit("/", 1)[-1] != network or rule.disabled or rule.direction != "INGRESS":
            continue
        if (rule.target_tags and node_tag not in rule.target_tags) or rule.target_service_accounts:
            continue
        wide = _wider(rule.source_ranges, allowed_cidrs) if _covers_ssh(rule.allowed) else []
        if wide:
            found.append(f"{rule.name}: SSH from {', '.join(wide)}")
    return found


def network_warnings(spec: GcpSpec, *, credentials=None, api_endpoint: str | None = None) -> list[str]:
    """What to tell the reviewer about the spec's existing GCP network (nothing for a network kit
    creates, or on other clouds). A failed look-up is a warning too, never a failed plan."""
    network = spec.existing_network
    if network is None:
        return []
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError

    try:
        rules = wider_ssh_rules(spec.project, network, list(spec.ssh.allowed_cidrs), f"kit-{spec.name}",
                                credentials=credentials, api_endpoint=api_endpoint)
    except (gexc.GoogleAPIError, DefaultCredentialsError) as error:
        return [(f"could not list the firewall rules of network {network!r} ({type(error).__name__}): check "
                "yourself that no rule admits SSH more widely than ssh.allowed_cidrs")]
    return [f"network {network!r} admits SSH to the nodes more widely than ssh.allowed_cidrs: {rule}"
            for rule in rules]

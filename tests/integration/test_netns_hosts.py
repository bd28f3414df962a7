"""The SSH test hosts recover from a killed run: a run killed before ``stop()`` (SIGKILL, a machine restart)
leaves its namespace and its 198.18.x.1 address behind, and the next run's hosts must neither collide with
that address (their SSH port would be routed to the dead veth) nor fail to start."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support import netns_hosts

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 (network namespaces)")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _leave_behind(pid: int, subnet: int) -> str:
    """What a killed NetnsHosts leaves: a namespace and a root-side veth holding 198.18.<subnet>.1/24."""
    ns, veth = f"kit{pid}h0", f"kv{pid}x0"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns], check=True)
    subprocess.run(["ip", "addr", "add", f"198.18.{subnet}.1/24", "dev", veth], check=True)
    return ns


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_a_killed_runs_namespace_is_reaped_and_its_subnet_freed():
    taken = netns_hosts.free_subnets(1)[0]
    ns = _leave_behind(_dead_pid(), taken)
    try:
        assert taken not in netns_hosts.free_subnets(3)
        assert netns_hosts.reap_stale() == [ns]
        assert ns not in _namespaces()
        assert taken in netns_hosts.free_subnets(3)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_a_live_runs_namespace_is_kept():
    ns = _leave_behind(os.getpid(), netns_hosts.free_subnets(1)[0])
    try:
        assert netns_hosts.reap_stale() == []
        assert ns in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)

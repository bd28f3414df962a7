"""kit.remote: waiting for a fresh node's SSH port."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from kit.backends.local import free_port
from kit.errors import KitError
from kit.remote import wait_for_ssh


def test_wait_for_ssh_returns_once_every_node_listens():
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def boot_later():  # the node's sshd comes up after a second
        time.sleep(1.0)
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Thread(target=boot_later, daemon=True).start()
    t0 = time.monotonic()
    wait_for_ssh(["127.0.0.1"], port=port, timeout=20)
    assert 0.9 < time.monotonic() - t0 < 10
    server.close()


def test_wait_for_ssh_names_the_nodes_that_never_listened():
    port = free_port()  # nothing listens there
    with pytest.raises(KitError) as info:
        wait_for_ssh(["127.0.0.1"], port=port, timeout=1.5)
    assert "127.0.0.1 did not accept SSH connections" in info.value.what and info.value.fix


# --- host keys: what kit pins, and the file ssh reads ---------------------------------------------

def test_a_public_key_is_accepted_only_whole_and_of_its_own_type():
    from kit.remote import public_key_line
    from tests.support.host_keys import ed25519_key, rsa_key

    ed_type, ed_blob = ed25519_key("n0").split()
    rsa_type, rsa_blob = rsa_key("n0").split()
    assert public_key_line(ed_type, ed_blob) == f"{ed_type} {ed_blob}"
    assert public_key_line(rsa_type, rsa_blob) == f"{rsa_type} {rsa_blob}"
    assert public_key_line("ssh-rsa", ed_blob) is None, "the blob names its own type"
    assert public_key_line("ssh-dss", ed_blob) is None, "not a type kit pins"
    assert public_key_line(ed_type, ed_blob[:40]) is None, "cut short"
    assert public_key_line(ed_type, ed_blob + "cm9vdA==") is None, "run together with the next text"
    assert public_key_line(ed_type, "not base64!") is None
    # an RSA key cut right after e parses into whole fields, but too few of them
    import base64
    import struct
    head = base64.b64encode(struct.pack(">I", 7) + b"ssh-rsa" + struct.pack(">I", 3) + b"\x01\x00\x01").decode()
    assert public_key_line("ssh-rsa", head) is None


def test_ssh_pins_the_known_hosts_file_or_says_plainly_that_it_checks_nothing(tmp_path):
    from kit.remote import ssh_base

    pinned = ssh_base("198.18.0.2", "root", known_hosts=tmp_path / "known_hosts")
    options = [pinned[i + 1] for i, arg in enumerate(pinned) if arg == "-o"]
    assert "StrictHostKeyChecking=yes" in options and f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in options
    assert "GlobalKnownHostsFile=/dev/null" in options and "UpdateHostKeys=no" in options
    assert not any(o.startswith("StrictHostKeyChecking=no") for o in options)
    unverified = ssh_base("198.18.0.2", "root", known_hosts=None)
    assert "StrictHostKeyChecking=no" in unverified and "UserKnownHostsFile=/dev/null" in unverified


def test_known_hosts_asks_only_for_new_instances_and_forgets_nodes_gone(tmp_path):
    from kit.remote import KnownHosts
    from tests.support.host_keys import ed25519_key

    known, asked = KnownHosts(tmp_path / "known_hosts"), []

    def lookup(address):
        asked.append(address)
        return [ed25519_key(f"{address}-{len(asked)}")]

    known.pin({"198.18.0.2": "i-a", "198.18.0.3": "i-b"}, lookup, timeout=0, source="test")
    first = known.entries()
    assert sorted(first) == ["198.18.0.2", "198.18.0.3"] and asked == ["198.18.0.2", "198.18.0.3"]
    # i-b is gone, 198.18.0.2 came back as another instance (a replacement), i-c is new
    known.pin({"198.18.0.2": "i-z", "198.18.0.4": "i-c"}, lookup, timeout=0, source="test")
    now = known.entries()
    assert asked[2:] == ["198.18.0.2", "198.18.0.4"], "the same address as a new instance is asked again"
    assert sorted(now) == ["198.18.0.2", "198.18.0.4"] and now["198.18.0.2"][0] == "i-z"
    assert now["198.18.0.2"][1] != first["198.18.0.2"][1]
    known.pin({"198.18.0.2": "i-z"}, lookup, timeout=0, source="test")
    assert asked[4:] == [], "pinned for the same instance: not asked again"
    line = (tmp_path / "known_hosts").read_text().splitlines()[0]
    assert line.split()[0] == "198.18.0.2" and line.split()[1] == "ssh-ed25519" and line.split()[3] == "i-z"


def test_known_hosts_waits_for_a_booting_node_then_names_the_ones_that_never_published(tmp_path):
    from kit.remote import KnownHosts
    from tests.support.host_keys import ed25519_key

    calls = {"198.18.0.2": 0, "198.18.0.3": 0}

    def lookup(address):  # .2 publishes on the third look; .3 never
        calls[address] += 1
        return [ed25519_key(address)] if address == "198.18.0.2" and calls[address] >= 3 else []

    known = KnownHosts(tmp_path / "known_hosts")
    with pytest.raises(KitError) as raised:
        known.pin({"198.18.0.2": "i-a", "198.18.0.3": "i-b"}, lookup, timeout=0.5, source="the test's cloud",
                  poll_s=0.1)
    assert "198.18.0.3" in raised.value.what and "198.18.0.2" not in raised.value.what
    assert "the test's cloud" in raised.value.what and "verify_host_keys" in raised.value.fix
    assert calls["198.18.0.2"] == 3 and calls["198.18.0.3"] > 3, "asked again until the timeout"
    assert sorted(known.entries()) == ["198.18.0.2"], "what was found is pinned even so"

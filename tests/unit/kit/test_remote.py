"""kit.remote: waiting for a fresh node's SSH port, the host keys ssh accepts, reading a file on many nodes."""
from __future__ import annotations

import shutil
import socket
import subprocess
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


# --- reading a file on many nodes at once: one deadline, no process left behind ---------------------

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")


@needs_ssh
def test_the_connect_timeout_given_for_one_read_is_the_one_ssh_uses():
    from kit.remote import ssh_base, with_connect_timeout

    ssh = with_connect_timeout(ssh_base("127.0.0.1", "kit", port=2222), 3)
    assert "ConnectTimeout=20" in ssh, "ssh_base's own default stays as it is for its other callers"
    # `ssh -G` prints the configuration it would use, without connecting (ssh(1))
    shown = subprocess.run([*ssh[:-1], "-G", ssh[-1]], capture_output=True, text=True, check=True).stdout
    assert "connecttimeout 3" in shown.splitlines()


def test_a_read_of_many_nodes_ends_at_its_one_deadline_and_leaves_no_process(tmp_path):
    from kit.remote import read_files
    from tests.support.dead_nodes import fake_ssh, hanging_ssh, running_children, still_running

    pids = tmp_path / "pids"
    ssh = {"live": fake_ssh(tmp_path / "live", "echo '{\"step\": 3}'"),
           "refused": fake_ssh(tmp_path / "refused", "echo 'Permission denied' >&2; exit 255"),
           **{f"hung-{i}": hanging_ssh(tmp_path / f"hung-{i}", pids) for i in range(3)}}
    before = running_children()
    t0 = time.monotonic()
    try:
        texts = read_files(ssh, "/mnt/kit-disk/progress.json", deadline_s=1.0, workers=2)
        elapsed = time.monotonic() - t0
    finally:
        left = still_running(pids)
    assert texts == {"live": '{"step": 3}\n'}, "the hosts that failed or hung are left out"
    assert elapsed < 2.0, f"one deadline for all the hosts, not one each: {elapsed:.1f} s"
    assert left == [] and running_children() <= before, "every ssh and every child of one was killed"
    assert len(pids.read_text().split()) == 4, "two workers: the third hung host never started"


@needs_ssh
def test_a_host_that_accepts_tcp_but_never_speaks_ssh_is_given_up_on_at_the_connect_timeout():
    from kit.remote import read_files, ssh_base, with_connect_timeout
    from tests.support.dead_nodes import running_children, silent_port

    before = running_children()
    with silent_port() as port:
        ssh = with_connect_timeout(ssh_base("127.0.0.1", "kit", port=port), 1)
        t0 = time.monotonic()
        texts = read_files({"half-dead": ssh}, "/mnt/kit-disk/progress.json", deadline_s=20)
        elapsed = time.monotonic() - t0
    assert texts == {}
    assert elapsed < 5, f"ssh gave up by itself, well before the read's deadline: {elapsed:.1f} s"
    assert running_children() <= before

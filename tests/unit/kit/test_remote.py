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

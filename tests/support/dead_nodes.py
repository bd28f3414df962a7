"""Nodes that do not answer, for the tests of reads over SSH (kit.remote.read_files and the clouds'
progress pull): a listening socket on 127.0.0.1 that accepts TCP and never speaks SSH (a half-dead
host: the kernel completes the handshake from the listen backlog, listen(2), and ssh then waits for a
banner that never comes), fake ``ssh`` commands that answer, fail or hang with a child of their own
(a ProxyCommand's stand-in), and whether a process still runs (/proc/PID/stat, proc(5))."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never sends a byte."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


def fake_ssh(path: Path, body: str) -> list[str]:
    """An executable ``sh`` script at ``path`` run instead of ssh (it ignores ssh's arguments)."""
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return [str(path)]


def hanging_ssh(path: Path, pids: Path) -> list[str]:
    """A fake ssh that never ends, nor does the child it starts; both append their ids to ``pids``."""
    return fake_ssh(path, f"echo $$ >> '{pids}'\nsleep 300 &\necho $! >> '{pids}'\nwait")


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def running_children() -> set[int]:
    """This process's children that still run."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and running(int(entry.name)):
                found.add(int(entry.name))
    return found


def still_running(pids: Path, grace_s: float = 1.0) -> list[int]:
    """The processes listed in ``pids`` that still run ``grace_s`` from now, killed so that a failed test
    leaves none behind. The grace: kill(2) returns once the signal is sent, not once the process has
    ended, and one killed a moment ago (not a child of ours: never waited for) may still be exiting."""
    listed = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    end = time.monotonic() + grace_s
    while (alive := [pid for pid in listed if running(pid)]) and time.monotonic() < end:
        time.sleep(0.02)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return alive

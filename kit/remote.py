"""SSH to the nodes: wait until a fresh node accepts connections, read a file, copy a node's newest
complete checkpoint to this machine (for the final export).

Only ``ssh`` and ``tar`` are needed on either side (no rsync on minimal images). The checkpoint
directory is read, never changed: the node's disk stays the authoritative copy until the export
has been verified here, and only then may ``kit train`` delete the disks.

Host keys are pinned: every ssh kit runs, and Ansible's (kit.bootstrap), accepts only the keys the
node's cloud published for it (:class:`KnownHosts`, filled by the cloud backend from the cloud's API,
never from what a host says over the network), so a host in the path that poses as a node cannot
receive the watcher's token or the training code. A spec may opt out (``ssh.verify_host_keys: false``).
"""

from __future__ import annotations

import base64
import binascii
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from kit.errors import KitError

# Newest first, only directories whose completeness marker exists (the trainer's atomic layout:
# training/checkpoint.py); the exporter verifies checksums after the copy.
_LIST = "cd {dir} 2>/dev/null && for d in $(ls -d step-* 2>/dev/null | sort -r); do [ -f \"$d/COMPLETE\" ] && echo \"$d\"; done; true"


# `terraform apply` returns once the instances exist, before their SSH daemons listen: a fresh instance
# boots first (about a minute on EC2 and GCE; an image that installs drivers at boot takes longer).
SSH_BOOT_TIMEOUT_S = 300.0


def wait_for_ssh(hosts: list[str], port: int = 22, timeout: float = SSH_BOOT_TIMEOUT_S) -> None:
    """Until every host accepts a TCP connection on ``port``; KitError naming those that never did."""
    waiting, deadline = set(hosts), time.monotonic() + timeout
    while waiting:
        for host in sorted(waiting):
            try:
                with socket.create_connection((host, port), timeout=2):
                    waiting.discard(host)
            except OSError:
                pass
        if waiting and time.monotonic() > deadline:
            raise KitError(f"{', '.join(sorted(waiting))} did not accept SSH connections on port {port} within "
                           f"{timeout:.0f} s", where="the nodes of the last apply",
                           fix="check the instances' consoles and the firewall's SSH rule (ssh.allowed_cidrs); "
                               "kit watch retries")
        if waiting:
            time.sleep(1)


def host_key_options(known_hosts: Path | None) -> list[str]:
    """ssh's host-key options, for kit's ssh and Ansible's alike: only the keys of ``known_hosts`` (no
    system-wide file, no key a host offers later: UpdateHostKeys), or, when the spec opted out
    (``known_hosts`` None), no check and nothing remembered."""
    if known_hosts is None:
        return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no"]


# The host-key types kit pins. DSA is left out: OpenSSH 9.8 removed it (https://www.openssh.com/txt/release-9.8).
# The number of fields of each type's public key: ed25519 its key; ECDSA its curve and point; RSA e and n
# (RFC 8709 section 4, RFC 5656 section 3.1, RFC 4253 section 6.6), each after the type's name.
_KEY_FIELDS = {"ssh-ed25519": 2, "ecdsa-sha2-nistp256": 3, "ecdsa-sha2-nistp384": 3, "ecdsa-sha2-nistp521": 3,
               "ssh-rsa": 3}
HOST_KEY_TYPES = tuple(_KEY_FIELDS)
KNOWN_HOSTS_FILE = "known_hosts"  # deploy/<name>/known_hosts


def public_key_line(key_type: str, blob: str) -> str | None:
    """``"<type> <base64>"`` when ``blob`` is a well-formed public key of ``key_type``, else None. Its
    wire format is length-prefixed fields, the first the type's name: a blob cut short, run together
    with other text, or of another type does not parse."""
    if key_type not in HOST_KEY_TYPES:
        return None
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return None
    fields, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            return None
        (size,) = struct.unpack(">I", raw[at:at + 4])
        at += 4 + size
        if at > len(raw):
            return None
        fields.append(raw[at - size:at])
    whole = len(fields) == _KEY_FIELDS[key_type] and fields[0] == key_type.encode()
    return f"{key_type} {blob}" if whole else None


class KnownHosts:
    """``deploy/<name>/known_hosts``: each node's address with the host keys its cloud published for
    it, and the instance they belong to (the line's comment): an address that comes back as another
    instance (a replacement, a reused IP) is asked again, and an address no node has any more is dropped."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def entries(self) -> dict[str, tuple[str, list[str]]]:
        """address -> (instance, its keys)."""
        out: dict[str, tuple[str, list[str]]] = {}
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        for line in lines:
            parts = line.split()
            if len(parts) == 4 and public_key_line(parts[1], parts[2]):
                out.setdefault(parts[0], (parts[3], []))[1].append(f"{parts[1]} {parts[2]}")
        return out

    def pin(self, nodes: dict[str, str], lookup: Callable[[str], list[str]], *, timeout: float, source: str,
            poll_s: float = 2.0) -> None:
        """Pin ``nodes`` (address -> instance): those pinned already for the same instance stay, the
        others are looked up (``lookup(address)``: the keys the cloud published, [] while it has not
        yet; a fresh instance publishes them as it boots) until ``timeout``; then the file holds these
        nodes only. KitError naming the nodes still without keys."""
        old = self.entries()
        found = {a: old[a] for a, iid in nodes.items() if a in old and old[a][0] == iid}
        pending = sorted(set(nodes) - set(found))
        deadline = time.monotonic() + timeout
        while pending:
            for address in pending:
                keys = lookup(address)
                if keys:
                    found[address] = (nodes[address], keys)
            pending = [a for a in pending if a not in found]
            if not pending or time.monotonic() + poll_s > deadline:
                break
            time.sleep(poll_s)
        if found != old:
            self._write(found)
        if pending:
            raise KitError(f"no SSH host keys published for {', '.join(pending)} within {timeout:.0f} s "
                           f"({source})", where=str(self.path),
                           fix="use an image that publishes them, check that the instances booted, or set "
                               "ssh.verify_host_keys: false to connect without checking who answers")

    def _write(self, entries: dict[str, tuple[str, list[str]]]) -> None:
        from training.contract import write_atomic

        write_atomic(self.path, "".join(f"{address} {key} {iid}\n" for address, (iid, keys) in sorted(entries.items())
                                        for key in keys))


def ssh_base(host: str, user: str, key: str | None = None, port: int = 22, *,
             known_hosts: Path | None = None) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes", *host_key_options(known_hosts),
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20", "-p", str(port)]
    if key:
        argv += ["-i", key]
    return argv + [f"{user}@{host}"]


# One pull of the nodes' progress files (TerraformBackend.progress, on the watch loop's thread) ends
# within this, however many nodes do not answer: a preempted instance still in Terraform's outputs, or
# one behind a dropped firewall rule, would otherwise hold the loop for ssh's whole connect timeout and
# the read's, node after node. A live node's ssh handshake and `cat` take a few round trips.
PROGRESS_PULL_S = 10.0
# ssh processes at once in one such read (a bigger cluster's other nodes are read as these finish).
READ_WORKERS = 16
_Key = TypeVar("_Key")


def with_connect_timeout(ssh: list[str], seconds: float) -> list[str]:
    """``ssh`` (an :func:`ssh_base` command) that gives up connecting after ``seconds`` (whole, at least
    one) instead of ssh_base's default. ssh keeps the first value it obtains for an option ("for each
    parameter, the first obtained value will be used", ssh_config(5)), so this one goes first. It
    covers the TCP connection, the SSH handshake and the key exchange (ConnectTimeout in ssh_config(5)), so
    a host that accepts TCP and never speaks SSH is given up on too."""
    return [ssh[0], "-o", f"ConnectTimeout={max(1, int(seconds))}", *ssh[1:]]


def read_files(ssh_by_key: dict[_Key, list[str]], path: str, *, deadline_s: float,
               workers: int = READ_WORKERS) -> dict[_Key, str]:
    """``path`` on each host (``key -> ssh command``), read in parallel, at most ``workers`` ssh at
    once; the text of those read by ``deadline_s`` after the call, in ``ssh_by_key``'s order. A host
    that failed or had not answered by then is left out. No ssh outlives the call: each one's timeout
    is what is left of the deadline when it starts (:func:`read_file`), one that has not
    started by the deadline never starts, and the pool is joined before this returns."""
    if not ssh_by_key:
        return {}
    end = time.monotonic() + deadline_s

    def read(ssh: list[str]) -> str:
        left = end - time.monotonic()
        if left <= 0:
            raise KitError(f"no time left to read {path} on {ssh[-1]}", where=path)
        return read_file(ssh, path, timeout=left)

    pool = ThreadPoolExecutor(max_workers=min(len(ssh_by_key), workers), thread_name_prefix="kit-read")
    try:
        futures = {key: pool.submit(read, ssh) for key, ssh in ssh_by_key.items()}
        texts = {}
        for key, future in futures.items():
            try:
                texts[key] = future.result()
            except KitError:
                continue  # unreachable, gone, timed out, or the file is not there (yet)
        return texts
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_file(ssh: list[str], path: str, timeout: float = 30) -> str:
    """``cat`` of ``path`` over ``ssh``, its ssh in a process group of its own that is killed whole at
    ``timeout``: ssh may have started children (a ProxyCommand or ProxyJump from the user's ssh config) that
    killing ssh alone, as subprocess.run's timeout does, would leave running. The group is killed
    before ssh is waited for, so its id is still ssh's (a process that ended keeps its id until it is
    waited for: wait(2))."""
    with subprocess.Popen([*ssh, f"cat {shlex.quote(path)}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()  # ssh, reaped; its pipes are closed on the way out, whoever else holds them
            raise KitError(f"reading {path} on {ssh[-1]} timed out", where=path) from None
    if proc.returncode != 0:
        raise KitError(f"cannot read {path} on {ssh[-1]}: {err.strip() or proc.returncode}", where=path)
    return out


def complete_checkpoints(ssh: list[str], remote_dir: str, timeout: float = 60) -> list[str]:
    proc = subprocess.run([*ssh, _LIST.format(dir=shlex.quote(remote_dir))], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise KitError(f"cannot list checkpoints on {ssh[-1]}: {proc.stderr.strip() or proc.returncode}",
                       where=remote_dir, fix="check that the node is up and reachable with the spec's ssh key")
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def fetch_newest_checkpoint(ssh: list[str], remote_dir: str, dest: Path, timeout: float = 3600) -> Path:
    """Copy the newest complete ``step-N`` directory of ``remote_dir`` into ``dest``; returns ``dest``
    (a checkpoint directory with one step in it, ready for training.export)."""
    names = complete_checkpoints(ssh, remote_dir)
    if not names:
        raise KitError(f"no complete checkpoint on {ssh[-1]}", where=remote_dir,
                       fix="the trainer writes one at the end of the job; check its log on the node")
    name = names[0]
    dest = Path(dest)
    shutil.rmtree(dest / name, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    remote = [*ssh, f"tar -C {shlex.quote(remote_dir)} -cf - {shlex.quote(name)}"]
    with subprocess.Popen(remote, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as sender:
        assert sender.stdout is not None and sender.stderr is not None  # both are pipes (narrows the types)
        unpack = subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=sender.stdout, capture_output=True,
                                timeout=timeout, check=False)
        sender.stdout.close()
        err = sender.stderr.read().decode(errors="replace")
        sender.wait(timeout=60)
    if sender.returncode != 0 or unpack.returncode != 0:
        shutil.rmtree(dest / name, ignore_errors=True)
        raise KitError(f"copying {name} from {ssh[-1]} failed: {err.strip() or unpack.stderr.decode().strip()}",
                       where=remote_dir, fix="check the node and the disk space here, then `kit train` again")
    return dest

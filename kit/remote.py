"""SSH to the nodes: wait until a fresh node accepts connections, read a file, copy a node's newest
complete checkpoint to this machine (for the final export).

Only ``ssh`` and ``tar`` are needed on either side (no rsync on minimal images). The checkpoint
directory is read, never changed: the node's disk stays the authoritative copy until the export
has been verified here, and only then may ``kit train`` delete the disks.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

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


def ssh_base(host: str, user: str, key: str | None = None, port: int = 22) -> list[str]:
    # Host keys: cloud instances are new on every apply (and IPs get reused), so like the
    # bootstrap's ansible.cfg we do not pin them; the connection is authenticated by our key.
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20", "-p", str(port)]
    if key:
        argv += ["-i", key]
    return argv + [f"{user}@{host}"]


def read_file(ssh: list[str], path: str, timeout: float = 30) -> str:
    try:
        proc = subprocess.run([*ssh, f"cat {shlex.quote(path)}"], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise KitError(f"reading {path} on {ssh[-1]} timed out", where=path) from None
    if proc.returncode != 0:
        raise KitError(f"cannot read {path} on {ssh[-1]}: {proc.stderr.strip() or proc.returncode}", where=path)
    return proc.stdout


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

"""Real SSH test hosts: a Debian 12 rootfs copy per host, each in its own network, mount and PID namespace.

``rootfs_tarball()`` builds the rootfs once with debootstrap (minbase + what ansible and the roles need)
and caches it as ``~/.cache/kit-test/debian12-rootfs-v2.tar``. ``NetnsHosts(n, workdir)`` starts ``n``
hosts: veth pair ``198.18.<i>.1`` (root side) / ``198.18.<i>.2`` (host side), ``unshare -m -p -f`` +
``chroot`` + ``sshd -D``, a generated ed25519 key, a loop device per host as its data disk. systemd does
not run inside (PID 1 is sshd). Needs root.

A run that is killed (SIGKILL, a machine restart) never reaches ``stop()`` and leaves its namespaces,
veths and addresses behind. ``start()`` therefore removes the namespaces of test processes that are no
longer alive, and takes for each host a ``198.18.<i>.0/24`` that no interface on this machine holds, under
a file lock so that two test runs side by side never pick the same one.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from tests.support.host_keys import new_host_keys

CACHE = Path(os.environ.get("KIT_TEST_CACHE", Path.home() / ".cache" / "kit-test"))
TARBALL = CACHE / "debian12-rootfs-v2.tar"
MIRROR = os.environ.get("KIT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
STALE = re.compile(r"^kit(\d+)h(\d+)$")
# curl: what cloud images have and the GCE shutdown-script (terraform/modules/gcp/instances/shutdown.sh) calls
PACKAGES = "python3,python3-venv,python3-pip,python3-apt,openssh-server,e2fsprogs,util-linux,mount,curl"


def _run(cmd: list[str] | str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, shell=isinstance(cmd, str), **kw)


def rootfs_tarball() -> Path:
    """The cached rootfs tarball, built on first use. The suite's workers (pytest-xdist) may all ask for it at
    once on a fresh machine: one builds it under a file lock, the others wait and take the result."""
    if TARBALL.exists():
        return TARBALL
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap not installed (scripts/install-tools.sh)")
    with cache_lock("rootfs"):
        if not TARBALL.exists():
            _build_rootfs_tarball()
    return TARBALL


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """An exclusive lock (``CACHE/name.lock``) shared by every test process on this machine."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build_rootfs_tarball() -> None:
    build = CACHE / f"build-{os.getpid()}"
    try:
        _run(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(build), MIRROR],
             timeout=1200)
        _run(["chroot", str(build), "sh", "-c",
              "apt-get clean; rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/*"])
        tmp = TARBALL.with_suffix(".tmp")
        _run(["tar", "-C", str(build), "-cf", str(tmp), "."], timeout=600)
        tmp.replace(TARBALL)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> list[str]:
    """Delete the namespaces and veths of NetnsHosts whose test process is gone; returns their names."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    reaped = []
    for line in listing.splitlines():
        m = STALE.match(line.split(" ")[0]) if line else None
        if m is None or _alive(int(m.group(1))):
            continue
        subprocess.run(["ip", "netns", "del", m.group(0)], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", f"kv{m.group(1)}x{m.group(2)}"], check=False, capture_output=True)
        reaped.append(m.group(0))
    bridges = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True,
                             check=False).stdout
    for pid in re.findall(r"^\d+: kb(\d+):", bridges, flags=re.MULTILINE):  # tests/support/ec2_hosts.py's
        if not _alive(int(pid)):
            subprocess.run(["ip", "link", "del", f"kb{pid}"], check=False, capture_output=True)
            reaped.append(f"kb{pid}")
    return reaped


def _subnets_in_use() -> set[int]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False).stdout
    return {int(m) for m in re.findall(r"inet 198\.18\.(\d+)\.\d+/", out)}


def free_subnets(n: int) -> list[int]:
    used = _subnets_in_use()
    free = [i for i in range(1, 255) if i not in used][:n]
    if len(free) < n:
        raise RuntimeError(f"no free 198.18.x.0/24 for {n} test hosts; in use: {sorted(used)}")
    return free


def veth_into(netns: str, veth: str, ip: str) -> None:
    """A new namespace ``netns`` whose ``eth0`` (``ip``/24) is the peer of ``veth`` here; the caller
    gives ``veth`` its address or bridge."""
    _run(["ip", "netns", "add", netns])
    _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    for cmd in (["ip", "addr", "add", f"{ip}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                ["ip", "link", "set", "lo", "up"]):
        _run(["ip", "netns", "exec", netns, *cmd])


def boot(netns: str, root: Path, then: str, log: Path, *, uts: bool = False) -> subprocess.Popen:
    """A host's PID 1: in ``netns`` and a mount and PID namespace of its own (UTS too with ``uts``), the
    rootfs at ``root`` gets /proc, /dev, /sys and a tmpfs /run, then the shell command ``then`` runs
    (it ends by exec'ing chroot). Output goes to ``log``."""
    r = str(root)
    script = (f"mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev && "
              f"mount -t sysfs sysfs {r}/sys && mount -t tmpfs tmpfs {r}/run && {then}")
    with open(log, "wb") as out:
        return subprocess.Popen(["ip", "netns", "exec", netns, "unshare", "--mount", "--pid", *(["--uts"] if uts else []),
                                 "--fork", "--propagation", "private", "sh", "-c", script],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def shut_down(netns: str, veth: str, *procs: subprocess.Popen | None) -> None:
    """Kill a host's process groups (its PID 1 gone, everything in its PID namespace goes) and remove its
    network."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
    subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)
    subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)


class StartStop(ABC):
    """``with`` for a harness with ``start()`` and ``stop()``: stopped also when the start fails half-way."""

    @abstractmethod
    def start(self):
        """Bring the harness up; returns what ``with`` binds."""

    @abstractmethod
    def stop(self) -> None:
        """Tear down whatever ``start`` made, also after a failed start."""

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


class Host:
    def __init__(self, index: int, workdir: Path, tag: str, subnet: int = 0):
        self.index = index
        self.name = f"node{index}"
        self.root = workdir / self.name / "root"
        self.netns = f"kit{tag}h{index}"
        self.veth = f"kv{tag}x{index}"
        if len(self.veth) > 15:  # IFNAMSIZ - 1
            raise RuntimeError(f"interface name {self.veth!r} is longer than 15 characters")
        self.subnet = subnet
        self.disk_image = workdir / self.name / "disk.img"
        self.loop: str | None = None
        self.proc: subprocess.Popen | None = None
        self.host_keys: list[str] = []  # its sshd's public keys, new at its boot (what its cloud would publish)

    @property
    def ip(self) -> str:
        return f"198.18.{self.subnet}.2"

    @property
    def gateway(self) -> str:
        return f"198.18.{self.subnet}.1"


class NetnsHosts(StartStop):
    def __init__(self, n: int, workdir: Path, disk_mb: int = 64):
        self.workdir = Path(workdir)
        self.tag = str(os.getpid())
        self.hosts = [Host(i, self.workdir, self.tag) for i in range(n)]
        self.disk_mb = disk_mb
        self.key = self.workdir / "id_ed25519"
        self.known_hosts = self.workdir / "known_hosts"  # every host's keys, pinned as kit pins them

    def start(self) -> NetnsHosts:
        tarball = rootfs_tarball()
        self.workdir.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)])
        with cache_lock("netns"):
            reap_stale()
            for h, subnet in zip(self.hosts, free_subnets(len(self.hosts)), strict=True):
                h.subnet = subnet
                self._network(h)
        for h in self.hosts:
            self._boot(h, tarball)
        for h in self.hosts:
            self._wait_ssh(h)
        self.pin(self.known_hosts)
        return self

    def published(self, address: str) -> list[str]:
        """What the hosts' "cloud" publishes for the host at ``address`` (kit.clouds' host_keys)."""
        return next((h.host_keys for h in self.hosts if h.ip == address), [])

    def pin(self, path: Path) -> Path:
        """A known_hosts file of every host, written by kit's own KnownHosts."""
        from kit.remote import KnownHosts

        KnownHosts(path).pin({h.ip: h.name for h in self.hosts}, self.published, timeout=0, source="the test hosts")
        return path

    def _network(self, h: Host) -> None:
        veth_into(h.netns, h.veth, h.ip)
        _run(["ip", "addr", "add", f"{h.gateway}/24", "dev", h.veth])
        _run(["ip", "link", "set", h.veth, "up"])

    def _boot(self, h: Host, tarball: Path) -> None:
        h.root.mkdir(parents=True)
        _run(["tar", "-C", str(h.root), "-xf", str(tarball)], timeout=300)
        h.host_keys = new_host_keys(h.root)  # the image's keys would be every host's
        ssh_dir = h.root / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        (ssh_dir / "authorized_keys").chmod(0o600)
        (h.root / "etc" / "hostname").write_text(h.name + "\n")
        _run(["truncate", "-s", f"{self.disk_mb}M", str(h.disk_image)])
        h.loop = _run(["losetup", "-f", "--show", str(h.disk_image)]).stdout.strip()
        r = str(h.root)
        h.proc = boot(h.netns, h.root, f"mkdir -p {r}/run/sshd && exec chroot {r} /usr/sbin/sshd -D -e "
                      "-o UseDNS=no -o PermitRootLogin=prohibit-password", self.workdir / f"{h.name}.sshd.log")

    def _wait_ssh(self, h: Host, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if h.proc.poll() is not None:
                raise RuntimeError(f"{h.name}: sshd exited: {(self.workdir / f'{h.name}.sshd.log').read_text()}")
            try:
                with socket.create_connection((h.ip, 22), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{h.name}: ssh not reachable at {h.ip}:22")

    def ssh(self, h: Host, command: str, check: bool = True) -> subprocess.CompletedProcess:
        from kit.remote import host_key_options

        return subprocess.run(["ssh", "-i", str(self.key), *host_key_options(self.known_hosts), "-o", "LogLevel=ERROR",
                               f"root@{h.ip}", command], check=check, capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        for h in self.hosts:
            shut_down(h.netns, h.veth, h.proc)
            if h.loop:
                subprocess.run(["losetup", "-d", h.loop], check=False, capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

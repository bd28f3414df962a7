"""What the cloud test hosts (tests/support/ec2_hosts.py, gce_hosts.py) share: one VM's host (a Debian
rootfs of tests/support/netns_hosts.py in its own namespaces) and the image it boots, which holds
besides Debian the stand-in systemd (tests/support/fake_systemd.py) as PID 1, the login key, and a venv
at /opt/kit/venv whose packages are the controller's site-packages mounted read-only (an image with
PyTorch preinstalled, as the clouds' deep-learning images are)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sysconfig
import threading
import time
from abc import abstractmethod
from pathlib import Path

from tests.support.netns_hosts import (
    StartStop,
    _run,
    boot,
    cache_lock,
    free_subnets,
    reap_stale,
    rootfs_tarball,
    shut_down,
    veth_into,
)

FAKE_SYSTEMD = Path(__file__).with_name("fake_systemd.py")
IMAGE_PACKAGES = "/opt/image/site-packages"  # where the controller's packages appear on a host
VENV = "/opt/kit/venv"


class Vm:
    """One VM's host: its rootfs (``dir/root``), network namespace and veth, PID 1 and metadata server."""

    def __init__(self, instance_id: str, ip: str, index: int, workdir: Path, tag: str, *, name: str | None = None):
        self.id, self.ip, self.index = instance_id, ip, index
        self.dir = workdir / instance_id
        self.root = self.dir / "root"
        self.netns = f"kit{tag}h{index}"  # the names netns_hosts.reap_stale recognises
        self.veth = f"kv{tag}x{index}"
        self.notice = self.dir / "instance-action.json"
        self.name = name or f"ip-{ip.replace('.', '-')}"
        self.public: str | None = None  # an external address, where the cloud gives one
        self.proc: subprocess.Popen | None = None
        self.metadata: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        """Where kit connects: the external address if there is one (kit.backends.base.Node.address)."""
        return self.public or self.ip

    def pid1(self) -> int | None:
        """PID 1 of the host's PID namespace (the child of the ``unshare --fork`` process), seen from here."""
        if self.proc is None:
            return None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None


def unpack(vm: Vm) -> None:
    """A new boot disk: the Debian rootfs."""
    vm.root.mkdir(parents=True)
    _run(["tar", "-C", str(vm.root), "-xf", str(rootfs_tarball())], timeout=300)


def install_image(root: Path, *, hostname: str, authorized_keys: list[str], hosts: str) -> None:
    """The image's own files: the stand-in systemd, ``authorized_keys`` for root, the hostname and
    /etc/hosts (``hosts``: the lines the cloud's resolver would answer), and the venv."""
    lib = root / "usr/local/lib/fake-systemd"
    lib.mkdir(parents=True)
    shutil.copy(FAKE_SYSTEMD, lib / "systemd")
    (lib / "systemd").chmod(0o755)
    (root / "usr/local/bin/systemctl").symlink_to("/usr/local/lib/fake-systemd/systemd")
    ssh = root / "root/.ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text("".join(k.strip() + "\n" for k in authorized_keys))
    (ssh / "authorized_keys").chmod(0o600)
    (root / "etc/hostname").write_text(hostname + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{hosts}")
    _run(["chroot", str(root), "python3", "-m", "venv", VENV], timeout=120)
    purelib = next((root / VENV.lstrip("/") / "lib").glob("python3*/site-packages"))
    for path in purelib.iterdir():  # Debian's pip and setuptools would shadow the image's (newer) ones
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    (purelib / "image-packages.pth").write_text(IMAGE_PACKAGES + "\n")


def plug(vm: Vm, bridge: str, *addresses: str) -> None:
    """The VM's veth on ``bridge`` with its addresses (the first its own, any other ``/32``), and the
    metadata address on its loopback."""
    veth_into(vm.netns, vm.veth, addresses[0])
    for extra in addresses[1:]:
        _run(["ip", "netns", "exec", vm.netns, "ip", "addr", "add", f"{extra}/32", "dev", "eth0"])
    _run(["ip", "link", "set", vm.veth, "master", bridge, "up"])
    _run(["ip", "netns", "exec", vm.netns, "ip", "addr", "add", "169.254.169.254/32", "dev", "lo"])


def power_on(vm: Vm, before: str = "") -> None:
    """PID 1: the controller's packages mounted read-only where the venv finds them, then the stand-in
    systemd in the chroot. ``before``: shell commands of the VM's mount namespace to run first."""
    r, packages = str(vm.root), f"{vm.root}{IMAGE_PACKAGES}"
    vm.proc = boot(vm.netns, vm.root,
                   f"{before}hostname {vm.name} && mkdir -p {packages} && mount --bind {site_packages()} {packages} && "
                   f"mount -o remount,bind,ro {packages} && exec chroot {r} /usr/local/lib/fake-systemd/systemd",
                   vm.dir / "host.log", uts=True)


def site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


class VmHosts(StartStop):
    """A cloud's running VMs as hosts: a bridge of ``198.18.S.0/24`` (a free ``S``; the root namespace holds
    ``.1``, the gateway), and a thread that calls ``sync`` every 0.3 s to follow the cloud's API. ``hosts``:
    the running ones, by the key the cloud's harness gives them."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.tag = str(os.getpid())
        self.bridge = f"kb{self.tag}"
        self.subnet = 0
        self.hosts: dict[str, Vm] = {}
        self.errors: list[str] = []
        self._index = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    @abstractmethod
    def sync(self) -> None: ...

    @abstractmethod
    def _power_off(self, host: Vm, grace: float) -> None: ...

    def _network(self) -> None:
        """The bridge, on a subnet no other test run holds."""
        rootfs_tarball()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with cache_lock("netns"):
            reap_stale()
            (self.subnet,) = free_subnets(1)
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])

    @property
    def gateway(self) -> str:
        return f"198.18.{self.subnet}.1"

    def _halt(self) -> None:
        """The following thread stopped and every host powered off."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        for host in list(self.hosts.values()):
            self._power_off(host, grace=0)

    def _unplug(self, loops: list[str]) -> None:
        """The loop devices and the bridge gone, and the work directory."""
        for loop in loops:
            subprocess.run(["losetup", "-d", loop], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.sync()
            except Exception as error:  # noqa: BLE001 - kept for the test to report
                self.errors.append(f"{type(error).__name__}: {error}")
            self._stop.wait(0.3)

    def _shut_down(self, host: Vm, grace: float) -> None:
        """The OS shuts down: its units stopped (SIGTERM to PID 1, up to ``grace`` s), then everything killed."""
        pid1 = host.pid1()
        if grace and pid1:
            os.kill(pid1, signal.SIGTERM)
            deadline = time.time() + grace
            while time.time() < deadline and host.proc is not None and host.proc.poll() is None:
                time.sleep(0.2)
        shut_down(host.netns, host.veth, host.proc, host.metadata)

    def wait_for(self, count: int, timeout: float = 120) -> list[Vm]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                hosts = list(self.hosts.values())
            if len(hosts) >= count:
                return hosts
            time.sleep(0.2)
        raise TimeoutError(f"{count} hosts not up after {timeout} s (up: {sorted(self.hosts)}; errors: {self.errors})")

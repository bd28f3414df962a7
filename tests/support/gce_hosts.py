"""Compute Engine VMs of the loopback Compute API fake (tests/support/gcp_compute.py) that are real SSH
hosts: every RUNNING instance is a Debian 12 host (tests/support/vm_image.py) at the addresses the fake
gave its network interface, with its attached disks as block devices. What Terraform creates in the
fake is then a machine that Ansible bootstraps and torchrun trains on, and the watcher's Compute client
sees the same instances. The GCE semantics kept, each from the Compute Engine documentation:

* The network is ``198.18.S.0/24`` (a free ``S``): the root namespace holds ``198.18.S.1`` on a bridge,
  every host a veth on it with its internal address (``networkIP``) and, as a second address, its
  external one (``natIP``: GCE's one-to-one NAT delivers it to the VM, which never sees it on its own
  interfaces; here it is on the veth so the controller reaches the VM at it). Each host's /etc/hosts
  holds every instance's internal DNS name (``NAME.ZONE.c.PROJECT.internal`` and ``NAME``, "Internal DNS").
* The image: root's authorized_keys from the ``ssh-keys`` metadata (``user:key`` lines, as the guest
  agent installs them), the metadata server on 169.254.169.254 / ``metadata.google.internal``
  (tests/support/gce_metadata.py), and new host keys at the first boot, which the guest agent publishes
  as the guest attributes ``hostkeys/<type>`` of the instance ("Manage guest attributes").
* A disk is a sparse file on a loop device, linked at ``/dev/disk/by-id/google-<deviceName>`` on the VM it
  is attached to ("Persistent disk naming"): a ``/dev/disk`` of the VM's own, since every node's data
  disk has one device name.
* Stopping keeps the VM: its boot disk (rootfs, host keys, the units it enabled, its /etc/fstab), its id,
  internal address and attached disks; ``instances.start`` boots it again (with a new external address,
  the fake's doing). Deleting the instance deletes its boot disk.
* ``preempt(name)``: what GCE does to a Spot VM whose termination action is STOP ("Preemption process"):
  ``instance/preempted`` turns TRUE, the instance is STOPPING, the OS shuts down, during which the
  ``shutdown-script`` of its metadata runs (for at most ``shutdown_timeout`` s: Spot VMs get 30 s), the
  units are stopped, and the VM is TERMINATED with a ``compute.instances.preempted`` operation.

Needs root (namespaces, loop devices, chroot, nsenter) and the fake in this process.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import REPO
from tests.support.gcp_compute import FakeCompute
from tests.support.host_keys import new_host_keys
from tests.support.netns_hosts import _run
from tests.support.vm_image import Vm, VmHosts, install_image, plug, power_on, unpack

METADATA_LINE = "169.254.169.254 metadata.google.internal\n"


def metadata_items(instance: dict) -> dict[str, str]:
    return {m["key"]: m["value"] for m in (instance.get("metadata") or {}).get("items") or []}


def ssh_keys(instance: dict) -> list[str]:
    """The keys of the ``ssh-keys`` metadata (``USER:KEY`` lines); every user's key is root's here."""
    lines = metadata_items(instance).get("ssh-keys", "").splitlines()
    return [line.split(":", 1)[1] for line in lines if ":" in line]


def addresses(instance: dict) -> tuple[str, str | None]:
    nic = (instance.get("networkInterfaces") or [{}])[0]
    return nic["networkIP"], ((nic.get("accessConfigs") or [{}])[0]).get("natIP")


class GceHosts(VmHosts):
    def __init__(self, compute: FakeCompute, workdir: Path, *, shutdown_timeout: float = 30.0):
        super().__init__(workdir)
        self.compute = compute
        self.shutdown_timeout = shutdown_timeout
        self.vms: dict[str, Vm] = {}  # instance id -> its VM, running or stopped (the boot disk is kept)
        self.disks: dict[str, tuple[Path, str]] = {}  # disk name -> (file, loop device)
        self.booted: list[str] = []  # instance ids, each time a VM came up (a restart appears again)
        self.names: dict[str, str] = {}  # instance id -> name, of every VM that ever booted
        self.attachments: list[tuple[str, str]] = []  # (instance id, disk name), in the order they appeared
        self._preempting: set[str] = set()

    # ------------------------------------------------------------------ set-up and tear-down
    def start(self) -> GceHosts:
        Path("/dev/disk").mkdir(exist_ok=True)  # each VM mounts a /dev/disk of its own over it
        self._network()
        self.compute.subnet = f"198.18.{self.subnet}"
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt()
        self._unplug([loop for _, loop in self.disks.values()])

    # ------------------------------------------------------------------ following the fake
    def sync(self) -> None:
        """Hosts for the RUNNING instances, none for the others; boot disks of deleted instances gone;
        disks where they are attached; every host's view of the internal DNS names."""
        instances = {i["name"]: i for i in list(self.compute.instances)}
        for name, host in list(self.hosts.items()):
            inst = instances.get(name)
            if name not in self._preempting and (inst is None or inst["id"] != host.id or inst["status"] != "RUNNING"):
                self._power_off(host, grace=30)
        ids = {i["id"] for i in instances.values()}
        for iid in [iid for iid in self.vms if iid not in ids]:
            shutil.rmtree(self.vms.pop(iid).dir, ignore_errors=True)
        for name, inst in instances.items():
            if inst["status"] == "RUNNING" and name not in self.hosts and name not in self._preempting:
                self._boot(inst)
        self._attach(instances)
        self._resolve(instances)

    def _attach(self, instances: dict[str, dict]) -> None:
        """Each running VM's attached disks under its /dev/disk/by-id (GCE keeps a stopped VM's disks attached)."""
        for name, host in self.hosts.items():
            self._link_disks(host, instances.get(name, {}))

    def _link_disks(self, vm: Vm, inst: dict) -> None:
        by_id = vm.dir / "dev-disk" / "by-id"
        by_id.mkdir(parents=True, exist_ok=True)
        for disk in inst.get("disks") or []:
            dname = str(disk.get("source") or "").rsplit("/", 1)[-1]
            if not dname:
                continue
            if (vm.id, dname) not in self.attachments:
                self.attachments.append((vm.id, dname))
            link = by_id / f"google-{disk['deviceName']}"
            if not link.is_symlink():
                link.symlink_to(self._loop(dname))

    def _loop(self, dname: str) -> str:
        if dname not in self.disks:
            size = next((d.get("sizeGb", "10") for d in self.compute.disks if d["name"] == dname), "10")
            image = self.workdir / "disks" / f"{dname}.img"
            image.parent.mkdir(parents=True, exist_ok=True)
            _run(["truncate", "-s", f"{size}G", str(image)])
            self.disks[dname] = (image, _run(["losetup", "-f", "--show", str(image)]).stdout.strip())
        return self.disks[dname][1]

    def _resolve(self, instances: dict[str, dict]) -> None:
        """GCE's internal DNS, as each VM's /etc/hosts: every instance's zonal name and short name."""
        lines = "".join(f"{addresses(i)[0]} {n}.{i['zone'].rsplit('/', 1)[-1]}.c.{self.compute.project}.internal {n}\n"
                        for n, i in sorted(instances.items()) if i.get("networkInterfaces"))
        text = f"127.0.0.1 localhost\n{METADATA_LINE}{lines}"
        for host in self.hosts.values():
            hosts = host.root / "etc/hosts"
            if hosts.read_text() != text:
                hosts.write_text(text)

    # ------------------------------------------------------------------ one VM
    def _boot(self, inst: dict) -> None:
        ip, nat = addresses(inst)
        vm = self.vms.get(inst["id"])
        if vm is None:  # its first boot: a new boot disk from the image, and new host keys
            vm = Vm(inst["id"], ip, self._index, self.workdir, self.tag, name=inst["name"])
            self._index += 1
            unpack(vm)
            install_image(vm.root, hostname=vm.name, authorized_keys=ssh_keys(inst), hosts=METADATA_LINE)
            keys = new_host_keys(vm.root)
            self.compute.guest_attributes[vm.name] = {f"hostkeys/{k.split()[0]}": k.split()[1] for k in keys}
            self.vms[inst["id"]] = vm
        vm.public = nat
        self._link_disks(vm, inst)  # before PID 1: its boot mounts /etc/fstab's disks
        self._write_metadata(vm, inst, preempted=False)
        plug(vm, self.bridge, *([ip, nat] if nat else [ip]))
        vm.metadata = subprocess.Popen(["ip", "netns", "exec", vm.netns, sys.executable, "-m", "tests.support.gce_metadata",
                                        "--instance-file", str(vm.dir / "instance.json")], cwd=REPO,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        power_on(vm, before=f"mount --bind {vm.dir / 'dev-disk'} {vm.root}/dev/disk && ")
        self.hosts[vm.name] = vm
        self.booted.append(vm.id)
        self.names[vm.id] = vm.name

    def _write_metadata(self, vm: Vm, inst: dict, *, preempted: bool) -> None:
        data = {"id": inst["id"], "name": inst["name"], "zone": inst["zone"].rsplit("/", 1)[-1],
                "project": self.compute.project, "preempted": preempted, "attributes": metadata_items(inst)}
        tmp = vm.dir / "instance.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(vm.dir / "instance.json")

    def _power_off(self, host: Vm, grace: float) -> None:
        """The OS shuts down (its units stopped first, for up to ``grace`` s); the boot disk stays
        (``self.vms``) until the instance is deleted."""
        self._shut_down(host, grace)
        for link in (host.dir / "dev-disk" / "by-id").glob("*"):
            link.unlink()
        self.hosts.pop(host.name, None)

    # ------------------------------------------------------------------ what the tests do
    def preempt(self, name: str) -> str:
        """The Spot VM is preempted (see the module's docstring); returns the shutdown-script's output."""
        with self._lock:
            self._preempting.add(name)
            host = self.hosts[name]
            inst = next(i for i in self.compute.instances if i["name"] == name)
        try:
            self._write_metadata(host, inst, preempted=True)
            inst["status"] = "STOPPING"
            output = self._shutdown_script(host, metadata_items(inst).get("shutdown-script", ""))
            with self._lock:
                self._power_off(host, grace=30)
                self.compute.preempt(name)
        finally:
            self._preempting.discard(name)
        return output

    def _shutdown_script(self, host: Vm, script: str) -> str:
        """The metadata's shutdown-script, run as the guest agent runs it (as root, in the VM), cut off
        after ``shutdown_timeout`` s."""
        pid1 = host.pid1()
        if not script or pid1 is None:
            return ""
        try:
            proc = subprocess.run(["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w",
                                   "/bin/bash", "-c", script], capture_output=True, text=True,
                                  timeout=self.shutdown_timeout, check=False,
                                  env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
        except subprocess.TimeoutExpired as cut:
            return f"(cut off after {self.shutdown_timeout} s) {cut.stdout or ''}{cut.stderr or ''}"
        return proc.stdout + proc.stderr

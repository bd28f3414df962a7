"""EC2 instances in moto that are real SSH hosts: every running instance of one subnet is a Debian 12
host (tests/support/netns_hosts.py's rootfs, its own network, mount and PID namespace) at the
instance's private IP, with its attached EBS volumes as block devices. What Terraform creates in moto
is then a machine that Ansible bootstraps and torchrun trains on, and the watcher's boto3 sees the same
instances.

* The VPC and subnet are ``198.18.S.0/24`` (a free ``S``): the root namespace holds ``198.18.S.1`` on a
  bridge (EC2's VPC router address), every host a veth on that bridge, so the hosts reach each other
  and the controller, and nothing else.
* An instance's image: the Debian rootfs, the stand-in systemd as PID 1 (tests/support/fake_systemd.py:
  systemd cannot run in these namespaces), a venv at /opt/kit/venv whose packages are the controller's
  site-packages mounted read-only (an image with PyTorch preinstalled, as the Deep Learning AMIs are),
  and the instance metadata service on 169.254.169.254 (tests/support/imds.py).
* A volume is a sparse file on a loop device, linked where an EBS volume appears on a Nitro instance,
  ``/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_<volume id without the dash>``, while it is attached.
  Its file outlives the instance: a replacement instance gets the same filesystem back.
* An instance's host keys are new at its boot, as cloud-init makes them, and its console output
  (GetConsoleOutput: moto answers every instance with one fixed kernel log, so tests/support/moto.py's
  ``console_outputs`` is in force while the hosts run) is the block cloud-init prints them in: what
  kit pins before it connects.
* ``interrupt(instance)``: a spot interruption the AWS way: the metadata service gives the
  ``spot/instance-action`` notice, and after ``warning`` seconds moto terminates the instance with
  ``StateReason`` ``Server.SpotInstanceTermination``; the host is then shut down (its units stopped, as
  systemd does at power-off) and removed.

Needs root (namespaces, loop devices, chroot) and moto running in this process (ThreadedMotoServer): the
spot termination's state reason is set on moto's own instance object, which no EC2 API call can do.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support import REPO
from tests.support.host_keys import cloud_init_console, new_host_keys
from tests.support.moto import console_outputs
from tests.support.netns_hosts import _run
from tests.support.vm_image import Vm, VmHosts, install_image, plug, power_on, unpack

BY_ID = Path("/dev/disk/by-id")
EBS_PREFIX = "nvme-Amazon_Elastic_Block_Store_"


class Ec2Hosts(VmHosts):
    def __init__(self, endpoint: str, region: str, zone: str, workdir: Path, *, warning: float = 20.0):
        import boto3

        super().__init__(workdir)
        self.ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint)
        self.region, self.zone = region, zone
        self.warning = warning
        self.subnet_id = self.vpc_id = ""
        self.volumes: dict[str, tuple[Path, str]] = {}  # volume id -> (file, loop device)
        self.links: set[Path] = set()
        self.booted: list[str] = []  # instance ids, in the order their hosts came up
        self.attachments: list[tuple[str, str]] = []  # (instance id, volume id), in the order they appeared
        self.consoles: dict[str, str] = {}  # instance id -> its console output (GetConsoleOutput)
        self._console = contextlib.ExitStack()

    # ------------------------------------------------------------------ set-up and tear-down
    def start(self) -> Ec2Hosts:
        self._network()
        cidr = f"198.18.{self.subnet}.0/24"
        self.vpc_id = self.ec2.create_vpc(CidrBlock=cidr)["Vpc"]["VpcId"]
        self.subnet_id = self.ec2.create_subnet(VpcId=self.vpc_id, CidrBlock=cidr,
                                                AvailabilityZone=self.zone)["Subnet"]["SubnetId"]
        self._console.enter_context(console_outputs(self.consoles))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt()
        for link in self.links:
            link.unlink(missing_ok=True)
        self._unplug([loop for _, loop in self.volumes.values()])
        self._console.close()

    # ------------------------------------------------------------------ following moto
    def sync(self) -> None:
        """Hosts for the subnet's running instances, none for the others; volumes where they are attached."""
        found = self.ec2.describe_instances(Filters=[{"Name": "subnet-id", "Values": [self.subnet_id]}])
        states = {i["InstanceId"]: i for r in found["Reservations"] for i in r["Instances"]}
        for iid, host in list(self.hosts.items()):
            if states.get(iid, {}).get("State", {}).get("Name") != "running":
                self._power_off(host, grace=30)
        for iid, inst in states.items():
            if inst["State"]["Name"] == "running" and iid not in self.hosts:
                self._boot(iid, inst["PrivateIpAddress"])
        self._attach({iid: inst.get("RootDeviceName") for iid, inst in states.items()})

    def _attach(self, roots: dict[str, str | None]) -> None:
        """Loop devices for the volumes attached to running hosts (not their root volumes: the rootfs is that)."""
        attached = set()
        for vol in self.ec2.describe_volumes()["Volumes"]:
            vid = vol["VolumeId"]
            on = [a["InstanceId"] for a in vol.get("Attachments", []) if a["InstanceId"] in self.hosts
                  and a["State"] in ("attaching", "attached") and a.get("Device") != roots.get(a["InstanceId"])]
            if not on:
                continue
            if (on[0], vid) not in self.attachments:
                self.attachments.append((on[0], vid))
            if vid not in self.volumes:
                image = self.workdir / "volumes" / f"{vid}.img"
                image.parent.mkdir(parents=True, exist_ok=True)
                _run(["truncate", "-s", f"{vol['Size']}G", str(image)])
                self.volumes[vid] = (image, _run(["losetup", "-f", "--show", str(image)]).stdout.strip())
            link = BY_ID / (EBS_PREFIX + vid.replace("-", ""))
            if not link.is_symlink():
                BY_ID.mkdir(parents=True, exist_ok=True)
                link.symlink_to(self.volumes[vid][1])
                self.links.add(link)
            attached.add(link)
        for link in self.links - attached:  # detached: the device goes away, the volume's data stays
            link.unlink(missing_ok=True)
        self.links = attached

    # ------------------------------------------------------------------ one host
    def _boot(self, iid: str, ip: str) -> None:
        host = Vm(iid, ip, self._index, self.workdir, self.tag)
        self._index += 1
        unpack(host)
        self._image(host)
        self.consoles[iid] = cloud_init_console(new_host_keys(host.root), name=host.name)
        plug(host, self.bridge, ip)
        host.metadata = subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-m", "tests.support.imds",
                                          "--instance", iid, "--notice-file", str(host.notice)], cwd=REPO,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        power_on(host)
        self.hosts[iid] = host
        self.booted.append(iid)

    def _image(self, host: Vm) -> None:
        """The image with the instance's key pair for root, and EC2's hostnames (ip-a-b-c-d) of every address
        in the subnet: what the VPC's DNS resolver answers (torchrun's rendezvous advertises and looks up the
        hostname)."""
        keys = [k["PublicKey"] for k in self.ec2.describe_key_pairs(IncludePublicKey=True)["KeyPairs"] if k.get("PublicKey")]
        names = "".join(f"198.18.{self.subnet}.{i} ip-198-18-{self.subnet}-{i}\n" for i in range(2, 255))
        install_image(host.root, hostname=host.name, authorized_keys=keys, hosts=names)

    def _power_off(self, host: Vm, grace: float) -> None:
        """Shut the host down (its units stopped first, for up to ``grace`` s); a terminated instance's root
        volume goes with it."""
        self._shut_down(host, grace)
        shutil.rmtree(host.root, ignore_errors=True)
        self.hosts.pop(host.id, None)

    # ------------------------------------------------------------------ what the tests do
    def interrupt(self, instance_id: str) -> None:
        """The two-minute warning (``warning`` seconds here), then the spot termination."""
        host = self.hosts[instance_id]
        when = datetime.now(UTC) + timedelta(seconds=self.warning)
        host.notice.write_text(json.dumps({"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}))
        time.sleep(self.warning)
        terminate_for_spot(self.region, instance_id)


def terminate_for_spot(region: str, instance_id: str) -> None:
    """moto terminates the instance, with the state reason EC2 gives a spot interruption (EC2 API
    reference, StateReason: ``Server.SpotInstanceTermination``)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    backend.terminate_instances([instance_id])
    instance = backend.get_instance(instance_id)
    instance.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                        "Server.SpotInstanceTermination")
    instance._reason = f"Service initiated ({datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S')} GMT)"

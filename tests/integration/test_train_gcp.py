"""`kit train` of a GCP spec, end to end on this machine, with no path of kit's that exists only for
the test: real Terraform core plans and applies (provider emulator, tests/support/tf_emulator) into a
loopback fake of the Compute Engine API (tests/support/gcp_compute.py, shaped like the documented v1
REST API), every instance it runs is a real SSH host at its addresses (tests/support/gce_hosts.py), the
real Ansible roles bootstrap them, torchrun trains on 2 hosts over gloo, a Spot preemption is given the
GCE way (``instance/preempted`` TRUE in the metadata server, the instance STOPPING while the
``shutdown-script`` runs, then TERMINATED with a ``compute.instances.preempted`` operation), and the
watcher restarts the stopped VM (``desired_status = "RUNNING"``: same id, boot disk, data disk and internal
address, a new external address) and bootstraps it until the job finishes with the digest of an undisturbed
run; the export is verified and the disks deleted at the end.

kit reaches the fake as a user reaches a Private Service Connect endpoint: ``GOOGLE_COMPUTE_CUSTOM_ENDPOINT``
(the variable Terraform's Google provider reads) and credentials from ``GOOGLE_APPLICATION_CREDENTIALS``
(a service-account key whose ``token_uri`` is the fake's token endpoint; the fake refuses a request
without the token).

What stands in for GCP, and its limits: the fake's Compute API (a Spot VM starts at once; no capacity is
short unless a test says so); the hosts' systemd (tests/support/fake_systemd.py) and their metadata
server (tests/support/gce_metadata.py); the image's preinstalled packages are this machine's (the spec
pins the roles' versions to them, ``bootstrap.vars``, as one does for a Deep Learning VM image whose
PyTorch is kept); no checkpoint bucket (a job in one zone resumes from its data disk).
"""
from __future__ import annotations

import subprocess
import time
from functools import partial
from pathlib import Path

import pytest

from tests.support.cloud_run import (
    deploy_dir,
    head_past_a_checkpoint,
    ledger_events,
    skip_reason,
    start_kit_train,
    train_through_a_loss,
    write_spec,
)

pytestmark = [pytest.mark.slow]

PROJECT, ZONE, TOKEN = "kit-e2e-project", "us-central1-a", "ya29.kit-e2e-token"


def gcp_spec(tmp_path: Path, subnet: int) -> Path:
    """examples/gcp-a3-spot.yaml on this machine's terms (cloud_run.write_spec): nodes of one GPU each in one
    zone, the network's range the hosts' bridge, a 10 GB disk each (GCE's smallest)."""
    return write_spec(tmp_path, "gcp-a3-spot", project=PROJECT, zone=ZONE, instance_type="g2-standard-4",
                      placement="none", disk={"size_gb": 10, "type": "pd-balanced"},
                      network={"cidr": f"198.18.{subnet}.0/24"})


def cloud_env(tmp_path: Path, fake) -> dict[str, str]:
    """The fake as the endpoint of Terraform's provider (the emulator's variable) and of kit's own clients
    (the provider's), and a service account's key for both."""
    from kit.clouds.gcp import COMPUTE_ENDPOINT_ENV
    from tests.support.tf_emulator.gcp_compute import ENDPOINT_ENV

    key = fake.service_account_file(tmp_path / "service-account.json")
    return {ENDPOINT_ENV: fake.endpoint, COMPUTE_ENDPOINT_ENV: f"{fake.endpoint}/compute/v1/",
            "GOOGLE_APPLICATION_CREDENTIALS": str(key)}


def preempt_after_a_checkpoint(tmp_path: Path, kit: subprocess.Popen, hosts):
    """Once the job is past its first checkpoint, the head (rank 0) is preempted; returns its VM, the
    external address it had, and the shutdown-script's output."""
    victim = head_past_a_checkpoint(tmp_path, kit, hosts)
    address = victim.public
    return victim, address, hosts.preempt(victim.name)


def assert_recovered_the_gcp_way(tmp_path: Path, hosts, victim, old_address: str, script_output: str,
                                 report: dict) -> None:
    """The agent saw ``instance/preempted`` before the operation said so; the shutdown-script's hook saw the
    save through in GCE's 30 s; the same VM (id, disk) came back, at a new external address, with the
    host keys of its boot disk, and the trainer lost no step."""
    events, done = ledger_events(deploy_dir(tmp_path))
    assert not [e for e in events if e["source"] == "agent" and e["kind"] == "shutdown" and e["time"] < done], events
    notice = next(e for e in events if e["source"] == "agent" and e["kind"] == "preemption")
    loss = next(e for e in events if e["source"] == "gcp" and e["kind"] == "preemption")
    assert notice["instance"] == loss["instance"] == victim.id and notice["time"] < loss["time"], events
    assert "cut off" not in script_output, script_output
    assert hosts.booted.count(victim.id) == 2 and len(hosts.booted) == 3, hosts.booted
    assert len(hosts.attachments) == 2 and report["steps_lost"] == 0, (hosts.attachments, report)
    assert_pinned_the_published_keys(deploy_dir(tmp_path) / "known_hosts", hosts, victim, old_address)


def assert_pinned_the_published_keys(path: Path, hosts, victim, old_address: str) -> None:
    """kit's known_hosts holds both VMs at their external addresses now (the victim's new one), each with
    the keys its guest agent published."""
    from kit.remote import KnownHosts

    pinned = KnownHosts(path).entries()
    assert sorted(iid for iid, _ in pinned.values()) == sorted(set(hosts.booted)), (pinned, hosts.booted)
    for address, (iid, keys) in pinned.items():
        published = sorted(f"{k.split('/', 1)[1]} {v}" for k, v in hosts.compute.guest_attributes[hosts.names[iid]].items())
        assert sorted(keys) == published and keys, (address, iid)
    # the address it had before its stop is gone, the one it has now is there
    assert victim.public != old_address and victim.public in pinned and old_address not in pinned, pinned


@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
def test_kit_train_gcp_end_to_end_with_a_spot_preemption(tmp_path):
    from tests.support.gce_hosts import GceHosts
    from tests.support.gcp_compute import FakeCompute

    t0 = time.time()
    with FakeCompute(PROJECT, token=TOKEN) as fake, GceHosts(fake, tmp_path / "hosts", shutdown_timeout=30) as hosts:
        spec = gcp_spec(tmp_path, hosts.subnet)
        start = partial(start_kit_train, tmp_path, spec, hosts, cloud_env(tmp_path, fake))
        report, (victim, old_address, script_output) = train_through_a_loss(
            tmp_path, hosts, start, lambda kit: preempt_after_a_checkpoint(tmp_path, kit, hosts))
        assert_recovered_the_gcp_way(tmp_path, hosts, victim, old_address, script_output, report)
        assert not fake.disks and not [i for i in fake.instances if i["status"] == "RUNNING"], (fake.disks, fake.instances)
        print(f"kit train gcp: {time.time() - t0:.0f} s in all")

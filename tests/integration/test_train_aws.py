"""`kit train` of an AWS spec, end to end on this machine, with no path of kit's that exists only for
the test: real Terraform core plans and applies (provider emulator, tests/support/tf_emulator) into moto,
every instance moto runs is a real SSH host at its private IP (tests/support/ec2_hosts.py), the real
Ansible roles bootstrap them, torchrun trains on 2 hosts over gloo, a spot interruption is given the
AWS way (the instance-action notice in the metadata service, then moto terminates the instance with
``Server.SpotInstanceTermination``), and the watcher re-applies and bootstraps until the job finishes
from the reused volumes with the digest of an undisturbed run; the export is verified and the volumes
deleted at the end.

What stands in for AWS, and its limits: moto's EC2 (a spot instance launches at once; no capacity is
ever short); the hosts' systemd (tests/support/fake_systemd.py) and their metadata service
(tests/support/imds.py); the image's preinstalled packages are this machine's (the spec pins the roles'
versions to them, ``bootstrap.vars``, as one does for a Deep Learning AMI whose PyTorch is kept).
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
from tests.support.tf_emulator.aws_moto import ENDPOINT_ENV

pytestmark = [pytest.mark.slow]


def aws_spec(tmp_path: Path, subnet_id: str) -> Path:
    """examples/aws-g5-spot.yaml on this machine's terms (cloud_run.write_spec), in the test's subnet, a 1 GB
    volume each."""
    return write_spec(tmp_path, "aws-g5-spot", disk={"size_gb": 1, "type": "gp3"}, network={"subnet_id": subnet_id})


def interrupt_after_a_checkpoint(tmp_path: Path, kit: subprocess.Popen, hosts):
    """Once the job is past its first checkpoint, the head (rank 0) gets the spot interruption: its
    replacement has a new address, so the survivor's train.env changes and its trainer is restarted
    while it waits in the rendezvous (the harder of the two recoveries)."""
    victim = head_past_a_checkpoint(tmp_path, kit, hosts)
    hosts.interrupt(victim.id)
    return victim


def assert_recovered_the_aws_way(tmp_path: Path, hosts, victim, report: dict) -> None:
    """The agent saw the notice before EC2 said the instance was gone; one new instance took the victim's
    volume (the same filesystem: the trainer resumed from it and lost no step)."""
    events, done = ledger_events(deploy_dir(tmp_path))
    # the bootstraps restarted no agent (nor trainer) they had just started: no agent stopped before the end
    assert not [e for e in events if e["source"] == "agent" and e["kind"] == "shutdown" and e["time"] < done], events
    notice = next(e for e in events if e["source"] == "agent" and e["kind"] == "preemption")
    loss = next(e for e in events if e["source"] == "aws" and e["kind"] == "preemption")
    assert notice["instance"] == loss["instance"] == victim.id and notice["time"] < loss["time"], events
    assert loss["detail"]["reason"] == "Server.SpotInstanceTermination"
    (volume,) = [v for i, v in hosts.attachments if i == victim.id]
    assert [i for i, v in hosts.attachments if v == volume] == [victim.id, hosts.booted[2]], hosts.attachments
    assert len(hosts.booted) == 3 and report["steps_lost"] == 0, (hosts.booted, report)
    assert_pinned_the_published_keys(deploy_dir(tmp_path) / "known_hosts", hosts,
                                     [i for i in hosts.booted if i != victim.id])


def assert_pinned_the_published_keys(path: Path, hosts, last: list[str]) -> None:
    """kit's known_hosts holds the ``last`` nodes, the replacement among them, each with the keys its
    console output printed."""
    from kit.backends.aws_host_keys import console_host_keys
    from kit.remote import KnownHosts

    pinned = KnownHosts(path).entries()
    assert sorted(iid for iid, _ in pinned.values()) == sorted(last), (pinned, hosts.booted)
    for address, (iid, keys) in pinned.items():
        assert keys == console_host_keys(hosts.consoles[iid]) and keys, (address, iid)


@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
def test_kit_train_aws_end_to_end_with_a_spot_interruption(tmp_path, monkeypatch):
    import boto3

    from tests.support.ec2_hosts import Ec2Hosts
    from tests.support.moto import moto_server

    t0 = time.time()
    with moto_server(monkeypatch) as url, Ec2Hosts(url, "us-east-1", "us-east-1a", tmp_path / "hosts",
                                                      warning=5) as hosts:
        spec = aws_spec(tmp_path, hosts.subnet_id)
        # moto as the endpoint of Terraform's provider and of the watcher's boto3
        start = partial(start_kit_train, tmp_path, spec, hosts, {ENDPOINT_ENV: url, "AWS_ENDPOINT_URL": url})
        report, victim = train_through_a_loss(tmp_path, hosts, start,
                                              lambda kit: interrupt_after_a_checkpoint(tmp_path, kit, hosts))
        assert_recovered_the_aws_way(tmp_path, hosts, victim, report)
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
        assert not ec2.describe_volumes(Filters=[{"Name": "tag:kit:role", "Values": ["data-disk"]}])["Volumes"]
        assert not [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                    if i["State"]["Name"] == "running"]
        print(f"kit train aws: {time.time() - t0:.0f} s in all")

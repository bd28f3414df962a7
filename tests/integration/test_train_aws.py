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

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow]

NEEDS = ("debootstrap", "ip", "unshare", "losetup", "ssh", "ssh-keygen", "mkfs.ext4")
STEPS, CKPT_EVERY = 120, 30
TRAINING = {"model": "vit_tiny_patch16_224", "image_size": 32, "num_classes": 10, "batch_size": 8, "steps": STEPS,
            "warmup_steps": 10, "ckpt_every": CKPT_EVERY, "keep": 2, "log_every": 5, "device": "cpu",
            "deterministic": True}


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, loop devices, chroot)"
    missing = [t for t in NEEDS if shutil.which(t) is None]
    return f"missing tools {missing}: run scripts/install-tools.sh" if missing else None


def image_versions() -> dict[str, str]:
    """The roles' package pins set to what the image (this machine's packages) has: found present, not installed."""
    v = importlib.metadata.version
    return {"python_env_torch_version": v("torch"), "python_env_torchvision_version": v("torchvision"),
            "python_env_timm_version": v("timm"), "python_env_pydantic_version": v("pydantic"),
            "python_env_apt_update": False,  # the hosts have no Debian mirror (their packages are installed)
            # one thread per rank, as the undisturbed reference (torchrun sets it there): CPU kernels split their
            # reductions by thread count, so a run on 2 threads has other digests
            "trainer_extra_env": {"OMP_NUM_THREADS": 1}}


def write_spec(tmp_path: Path, subnet_id: str) -> Path:
    """examples/aws-g5-spot.yaml on this machine's terms: 2 nodes in the test's subnet, a 1 GB volume each,
    SSH as root with a key of its own, local state, the tiny model for some hundred steps on the CPU."""
    from tests.support import REPO
    from tests.support.files import one_place

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    spec = one_place(yaml.safe_load((REPO / "examples" / "aws-g5-spot.yaml").read_text()))
    spec.update(name="e2e", nodes=2, disk={"size_gb": 1, "type": "gp3"}, network={"subnet_id": subnet_id},
                ssh={"user": "root", "public_key": str(tmp_path / "key.pub"), "allowed_cidrs": ["198.18.0.0/15"]},
                backend={"type": "local"}, training=TRAINING, bootstrap={"vars": image_versions()})
    spec["policy"]["deadline_hours"] = 48
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def undisturbed_digest(tmp_path: Path) -> str:
    """The same training flags on 2 ranks here, never stopped."""
    from kit.spec import load_spec, training_args
    from tests.support.trainer import Run, command, digest

    spec = load_spec(tmp_path / "cluster.yaml")
    args = training_args(spec)
    args[args.index("--ckpt-dir") + 1] = str(tmp_path / "reference-ckpt")
    run = Run(command(2, args))
    assert run.finish(600) == 0, run.output
    return digest(run.output)


def progress_step(hosts, key: Path, known_hosts: Path) -> int:
    """The trainer's step, read on the first host that answers (the progress file on its data disk), with
    the host keys kit pinned (kit pins them before it bootstraps: no trainer runs before they exist)."""
    from kit.remote import host_key_options

    for host in list(hosts.hosts.values()):
        proc = subprocess.run(["ssh", "-i", str(key), *host_key_options(known_hosts),
                               "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=2", f"root@{host.ip}",
                               "cat /mnt/kit-disk/progress.json"], capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode == 0:
            try:
                return int(json.loads(proc.stdout).get("step") or 0)
            except ValueError:
                continue
    return 0


def ledger_events(deploy_dir: Path) -> tuple[list[dict], float]:
    """The ledger's events, and when the trainer first reported the last step."""
    from tests.support.watch import ledger_of

    with ledger_of(deploy_dir) as ledger:
        return ledger.events(), min(t for t, step in ledger.progress_history() if step == STEPS)


def head_instance(deploy_dir: Path) -> str:
    """The instance of rank 0: the rendezvous endpoint, whose loss changes every node's train.env."""
    from tests.support.watch import ledger_of

    with ledger_of(deploy_dir) as ledger:
        return next(n.instance_id for n in ledger.all_nodes() if n.rank == 0)


def start_kit_train(tmp_path: Path, spec: Path, url: str, hosts) -> subprocess.Popen:
    """`kit train SPEC` as a user runs it, with the emulator's mirror and moto as the AWS endpoint (what
    Terraform's provider and the watcher's boto3 reach); the agents post to the bridge's address."""
    from kit.backends.local import free_port
    from tests.support.tf_emulator import write_cli_config
    from tests.support.tf_emulator.aws_moto import ENDPOINT_ENV

    env = {**os.environ, ENDPOINT_ENV: url, "AWS_ENDPOINT_URL": url,
           "TF_CLI_CONFIG_FILE": str(write_cli_config(tmp_path / "emulator")), "KIT_DEPLOY_ROOT": str(tmp_path / "deploy")}
    with open(tmp_path / "kit-train.log", "w") as log:
        return subprocess.Popen([str(Path(sys.executable).with_name("kit")), "train", str(spec),
                                 "--listen", f"{hosts.gateway}:{free_port()}", "--json-report", str(tmp_path / "report.json"),
                                 "--interval", "5"],  # polls every 5 s, not 15: the same path, sooner
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def interrupt_after_a_checkpoint(tmp_path: Path, kit: subprocess.Popen, hosts):
    """Once the job is past its first checkpoint, the head (rank 0) gets the spot interruption: its
    replacement has a new address, so the survivor's train.env changes and its trainer is restarted
    while it waits in the rendezvous (the harder of the two recoveries)."""
    hosts.wait_for(2, timeout=300)
    deadline = time.time() + 600
    while progress_step(hosts, tmp_path / "key", tmp_path / "deploy" / "e2e" / "known_hosts") < CKPT_EVERY + 10:
        assert kit.poll() is None and time.time() < deadline, (tmp_path / "kit-train.log").read_text()
        time.sleep(2)
    victim = hosts.hosts[head_instance(tmp_path / "deploy" / "e2e")]
    hosts.interrupt(victim.id)
    return victim


def assert_recovered_the_aws_way(tmp_path: Path, hosts, victim, report: dict) -> None:
    """The agent saw the notice before EC2 said the instance was gone; one new instance took the victim's
    volume (the same filesystem: the trainer resumed from it and lost no step)."""
    events, done = ledger_events(tmp_path / "deploy" / "e2e")
    # the bootstraps restarted no agent (nor trainer) they had just started: no agent stopped before the end
    assert not [e for e in events if e["source"] == "agent" and e["kind"] == "shutdown" and e["time"] < done], events
    notice = next(e for e in events if e["source"] == "agent" and e["kind"] == "preemption")
    loss = next(e for e in events if e["source"] == "aws" and e["kind"] == "preemption")
    assert notice["instance"] == loss["instance"] == victim.id and notice["time"] < loss["time"], events
    assert loss["detail"]["reason"] == "Server.SpotInstanceTermination"
    (volume,) = [v for i, v in hosts.attachments if i == victim.id]
    assert [i for i, v in hosts.attachments if v == volume] == [victim.id, hosts.booted[2]], hosts.attachments
    assert len(hosts.booted) == 3 and report["steps_lost"] == 0, (hosts.booted, report)
    assert_pinned_the_published_keys(tmp_path / "deploy" / "e2e" / "known_hosts", hosts,
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


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_kit_train_aws_end_to_end_with_a_spot_interruption(tmp_path, monkeypatch):
    import boto3

    from tests.support.ec2_hosts import Ec2Hosts
    from tests.support.moto import moto_server

    t0 = time.time()
    with moto_server(monkeypatch) as url, Ec2Hosts(url, "us-east-1", "us-east-1a", tmp_path / "hosts",
                                                      warning=5) as hosts:
        spec = write_spec(tmp_path, hosts.subnet_id)
        # the undisturbed reference runs while kit applies and bootstraps (mostly waiting on the hosts)
        reference: dict[str, str] = {}
        ref = threading.Thread(target=lambda: reference.update(sha=undisturbed_digest(tmp_path)), daemon=True)
        ref.start()
        kit = start_kit_train(tmp_path, spec, url, hosts)
        try:
            victim = interrupt_after_a_checkpoint(tmp_path, kit, hosts)
            rc = kit.wait(timeout=900)
        finally:
            if kit.poll() is None:
                kit.kill()
        output = (tmp_path / "kit-train.log").read_text()
        assert rc == 0 and not hosts.errors, (output, hosts.errors)
        report = json.loads((tmp_path / "report.json").read_text())
        ref.join(600)
        assert report["params_sha256"] == reference["sha"], output
        assert report["preemptions"] >= 1 and report["steps"] == STEPS, report
        assert report["export"] and report["disks"] == "deleted", report
        assert_recovered_the_aws_way(tmp_path, hosts, victim, report)
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
        assert not ec2.describe_volumes(Filters=[{"Name": "tag:kit:role", "Values": ["data-disk"]}])["Volumes"]
        assert not [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                    if i["State"]["Name"] == "running"]
        print(f"kit train aws: {time.time() - t0:.0f} s in all")

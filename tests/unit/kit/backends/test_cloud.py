"""TerraformBackend's use of kit.render / kit.terraform / kit.bootstrap (replaced by recorders here)."""

from __future__ import annotations

import json
import shutil
import sys
import time
import types

import pytest

import kit
from kit import clouds
from kit.backends.base import CapacityError, rendezvous_endpoint
from kit.backends.cloud import TerraformBackend
from kit.errors import KitError
from kit.spec import parse_spec
from tests.support.host_keys import ed25519_key
from tests.support.watch import cloud_spec

NODES = [{"name": "demo-0", "instance_id": "i-a", "private_ip": "10.0.0.5", "public_ip": "1.2.3.4",
          "disk_id": "vol-0", "zone": "us-east-1a", "market": "on-demand"},
         {"name": "demo-1", "instance_id": "i-b", "private_ip": "10.0.0.6", "public_ip": None,
          "disk_id": "vol-1", "zone": "us-east-1a", "market": "on-demand"}]


@pytest.fixture
def parts(monkeypatch):
    calls = []
    render = types.ModuleType("kit.render")
    render.render = lambda spec, out=None, market=None: calls.append(("render", spec.market, market, out))
    render.roots = lambda spec: ("disks", "cluster")
    terraform = types.ModuleType("kit.terraform")
    terraform.failure = None

    def apply(deploy_dir, parallelism=10, roots=("disks", "cluster")):
        calls.append(("apply", deploy_dir, parallelism))
        if terraform.failure:
            raise KitError(terraform.failure)

    def plan(deploy_dir, roots=("disks", "cluster")):
        from kit.plan_summary import PlanSummary

        calls.append(("plan", deploy_dir))
        return PlanSummary()

    terraform.plan = plan
    terraform.apply = apply
    terraform.elsewhere = None  # the region whose instances the cluster root's state holds, when not the spec's
    terraform.applied_elsewhere = lambda deploy_dir, region: terraform.elsewhere
    terraform.output = lambda deploy_dir: {"nodes": NODES, "zone": "us-east-1a", "market": "on-demand"}
    terraform.destroy = lambda deploy_dir, with_disks=False, roots=("disks", "cluster"): calls.append(
        ("destroy", with_disks))
    bootstrap = types.ModuleType("kit.bootstrap")
    bootstrap.inventory_from_spec = lambda spec, outputs, role_vars=None, *, known_hosts: {"all": {
        "hosts": {n["name"]: {"ansible_host": n["private_ip"], "instance_id": n["instance_id"]} for n in outputs["nodes"]},
        "vars": {**role_vars, "known_hosts": known_hosts}}}
    bootstrap.bootstrap_nodes = lambda inventory: (calls.append(("bootstrap", inventory)),
                                                   types.SimpleNamespace(ok=True, failures={}))[1]
    from kit import remote
    from kit import spec as kit_spec

    monkeypatch.setattr(kit_spec, "check_ssh_key", lambda spec: calls.append(("check_ssh_key", spec.cloud)))
    monkeypatch.setattr(remote, "wait_for_ssh", lambda hosts: calls.append(("wait_for_ssh", sorted(hosts))))
    published = {n["instance_id"]: [ed25519_key(n["instance_id"])] for n in NODES}  # what the cloud's API says
    for cloud in ("aws", "gcp"):
        monkeypatch.setattr(type(clouds.get(cloud)), "host_keys",
                            lambda self, spec, node: published.get(node.instance_id, []))
    terraform.published = published
    for name, module in (("render", render), ("terraform", terraform), ("bootstrap", bootstrap)):
        monkeypatch.setitem(sys.modules, f"kit.{name}", module)
        monkeypatch.setattr(kit, name, module, raising=False)
    return calls, terraform


def test_apply_rerenders_with_the_market_plans_fresh_then_applies(parts, tmp_path):
    calls, _ = parts
    backend = TerraformBackend(cloud_spec("aws"), tmp_path, watcher_url="http://w:8787", watcher_token="t")
    nodes = backend.apply(cloud_spec("aws").with_market("on-demand"), "on-demand")
    assert calls == [("check_ssh_key", "aws"), ("render", "on-demand", "on-demand", tmp_path), ("plan", tmp_path),
                     ("apply", tmp_path, 2)], "the key is checked first; parallelism >= the node count"
    assert [(n.rank, n.instance_id, n.market) for n in nodes] == [(0, "i-a", "on-demand"), (1, "i-b", "on-demand")]
    assert rendezvous_endpoint(nodes) == "10.0.0.5:29500"
    backend.bootstrap(nodes)
    assert calls[-2] == ("wait_for_ssh", sorted(n["private_ip"] for n in NODES)), "Ansible only once SSH answers"
    inventory = calls[-1][1]["all"]["vars"]
    assert inventory["preemption_agent_watcher_url"] == "http://w:8787"
    assert inventory["known_hosts"] == tmp_path / "known_hosts"
    backend.destroy()
    assert calls[-1] == ("destroy", False)  # keep_disks=True never destroys the disks root


def test_bootstrap_gives_each_host_its_own_watcher_token_and_none_the_cluster_s(parts, tmp_path):
    """A host's token reports as that host's instance only (kit.watch.server.node_token); as a host var it
    wins over any group value. The cluster token, from which every node's token follows, stays here."""
    from kit.watch.server import node_token

    calls, _ = parts
    secret = "cluster-secret-" + "x" * 30
    backend = TerraformBackend(cloud_spec("aws"), tmp_path, watcher_url="http://w:8787", watcher_token=secret)
    backend.bootstrap(backend.nodes())
    inventory = calls[-1][1]["all"]
    assert {name: host["preemption_agent_watcher_token"] for name, host in inventory["hosts"].items()} == {
        n["name"]: node_token(secret, n["instance_id"]) for n in NODES}
    assert "preemption_agent_watcher_token" not in inventory["vars"]
    assert secret not in repr(inventory), "no host is handed the cluster token"


def test_bootstrap_pins_the_keys_the_cloud_published_before_ansible_connects(parts, tmp_path):
    calls, _ = parts
    backend = TerraformBackend(cloud_spec("aws"), tmp_path)
    backend.bootstrap(backend.nodes())
    lines = sorted((tmp_path / "known_hosts").read_text().splitlines())
    assert lines == sorted(f"{n['public_ip'] or n['private_ip']} {ed25519_key(n['instance_id'])} {n['instance_id']}"
                           for n in NODES), "each node's address (the one ssh dials) with its instance's keys"
    assert calls[-1][1]["all"]["vars"]["known_hosts"] == tmp_path / "known_hosts"


def test_a_node_whose_keys_never_appear_is_not_bootstrapped(parts, tmp_path, monkeypatch):
    from kit import remote

    calls, terraform = parts
    del terraform.published["i-b"]
    monkeypatch.setattr(remote, "SSH_BOOT_TIMEOUT_S", 0.2)
    backend = TerraformBackend(cloud_spec("aws"), tmp_path)
    with pytest.raises(KitError) as raised:
        backend.bootstrap(backend.nodes())
    assert "10.0.0.6" in raised.value.what and "GetConsoleOutput" in raised.value.what
    assert not [c for c in calls if c[0] in ("wait_for_ssh", "bootstrap")], "Ansible never connects unverified"


def test_a_spec_that_opts_out_checks_no_host_key(parts, tmp_path):
    calls, _ = parts
    spec = cloud_spec("gcp")
    spec = spec.model_copy(update={"ssh": spec.ssh.model_copy(update={"verify_host_keys": False})})
    backend = TerraformBackend(spec, tmp_path)
    backend.bootstrap(backend.nodes())
    assert calls[-1][1]["all"]["vars"]["known_hosts"] is None and not (tmp_path / "known_hosts").exists()


@pytest.mark.parametrize("message, capacity", [
    ("Error: creating EC2 Instance: InsufficientInstanceCapacity: We currently do not have sufficient p4d capacity", True),
    ("Error: waiting for instance: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", True),
    ("The zone 'us-central1-a' does not have enough resources available to fulfill the request", True),
    ("Error: UnauthorizedOperation: You are not authorized", False),
])
def test_capacity_errors_are_told_apart(parts, tmp_path, message, capacity):
    _, terraform = parts
    terraform.failure = message
    cloud = "gcp" if "zone" in message.lower() else "aws"
    backend = TerraformBackend(cloud_spec(cloud), tmp_path)
    with pytest.raises(KitError) as raised:
        backend.apply(cloud_spec(cloud), "spot")
    assert isinstance(raised.value, CapacityError) == capacity
    assert clouds.get(cloud).is_capacity_error(message) == capacity


SPOT_QUOTA = ("terraform apply failed: Error: creating EC2 Instance: MaxSpotInstanceCountExceeded: Max spot "
              "instance count exceeded")


def test_the_spot_quota_error_names_the_quota_to_raise(parts, tmp_path):
    """MaxSpotInstanceCountExceeded is the account's Spot vCPU quota, not a stockout: still a capacity error (the
    capacity search tries another offer), but EC2's text names no quota; the error the ledger and the user see
    says which one to raise, and where."""
    _, terraform = parts
    terraform.failure = SPOT_QUOTA
    spec = cloud_spec("aws")
    with pytest.raises(CapacityError) as raised:
        TerraformBackend(spec, tmp_path).apply(spec, "spot")
    what = raised.value.what
    assert '"All G and VT Spot Instance Requests" for us-east-1' in what and "Service Quotas" in what
    assert "using-spot-limits.html" in what and what.endswith(SPOT_QUOTA), "Terraform's message follows it"
    p5 = clouds.get("aws").capacity_hint(cloud_spec("aws", instance_type="p5.48xlarge"), SPOT_QUOTA)
    assert p5 and '"All P5 Spot Instance Requests"' in p5
    terraform.failure = "Error: creating EC2 Instance: InsufficientInstanceCapacity: no g5 capacity"
    with pytest.raises(CapacityError) as raised:
        TerraformBackend(spec, tmp_path).apply(spec, "spot")
    assert "quota" not in raised.value.what, "a stockout is no quota"
    assert clouds.get("gcp").capacity_hint(cloud_spec("gcp"), SPOT_QUOTA) is None


def test_a_move_to_another_region_destroys_what_the_state_holds_even_without_outputs(parts, tmp_path):
    """An apply that failed half way in the old region (2 of 4 spot instances made) leaves no outputs: the move
    read "nothing runs" from them, rendered the new region over the root, and orphaned the instances."""
    calls, terraform = parts
    terraform.output = lambda deploy_dir: {}
    terraform.elsewhere = "us-east-1"
    spec = parse_spec({"name": "far", "cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a", "us-west-2a"],
                       "instance_type": "g5.4xlarge", "nodes": 2, "ssh": {"allowed_cidrs": ["203.0.113.0/24"]},
                       "backend": {"type": "s3", "bucket": "kit-state"}, "checkpoint_bucket": "s3://kit-ckpt"})
    west = next(o for o in spec.offers() if o.zone == "us-west-2a" and o.market == "spot")
    TerraformBackend(spec, tmp_path).apply(spec.with_offer(west), "spot")
    kinds = [c[0] for c in calls]
    assert "destroy" in kinds and kinds.index("destroy") < kinds.index("render"), kinds


# --- the progress pull: one deadline for all the nodes, whatever the dead ones do ------------------

@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_a_pull_reads_the_live_node_within_its_deadline_while_three_do_not_answer(parts, tmp_path, monkeypatch):
    """Node 0 answers; nodes 1 and 2 accept TCP and never speak SSH (a real ssh to a silent port on 127.0.0.1),
    node 3's ssh hangs with a child of its own. Read one after another, they held the watch loop for ssh's
    connect timeout twice and the read's timeout once; read together, the pull ends at its deadline."""
    from kit import remote
    from tests.support.dead_nodes import fake_ssh, hanging_ssh, running_children, silent_port, still_running

    _, terraform = parts
    nodes = [{"name": f"demo-{i}", "instance_id": f"i-{i}", "private_ip": f"10.0.0.{10 + i}", "public_ip": None,
              "zone": "us-east-1a", "market": "spot"} for i in range(4)]
    terraform.output = lambda deploy_dir: {"nodes": nodes}
    terraform.published.update({f"i-{i}": [ed25519_key(f"i-{i}")] for i in range(4)})
    monkeypatch.setattr(kit.bootstrap, "ssh_private_key", lambda spec: None, raising=False)
    monkeypatch.setattr(remote, "PROGRESS_PULL_S", 2.0)
    record = {"step": 7, "total_steps": 10, "time": 5.0, "state": "running"}
    (tmp_path / "progress.json").write_text(json.dumps(record))
    pids, real_ssh_base = tmp_path / "pids", remote.ssh_base
    before = running_children()
    with silent_port() as silent:
        fakes = {"10.0.0.10": fake_ssh(tmp_path / "live", f"cat '{tmp_path / 'progress.json'}'"),
                 "10.0.0.13": hanging_ssh(tmp_path / "hung", pids)}

        def ssh_base(host, user, key=None, port=22, *, known_hosts=None):  # only 127.0.0.1 is dialled
            return fakes.get(host) or real_ssh_base("127.0.0.1", user, key, silent, known_hosts=known_hosts)

        monkeypatch.setattr(remote, "ssh_base", ssh_base)
        read, real_read_files = [], remote.read_files

        def read_files(ssh, *args, **kwargs):  # the commands the pull runs, recorded, then run
            read.append(ssh)
            return real_read_files(ssh, *args, **kwargs)

        monkeypatch.setattr(remote, "read_files", read_files)
        t0 = time.monotonic()
        try:
            data = TerraformBackend(cloud_spec("aws", nodes=4), tmp_path).progress()
            elapsed = time.monotonic() - t0
        finally:
            left = still_running(pids)
    assert data == record
    assert left == [] and running_children() <= before, "no ssh, nor a child of one, outlives the pull"
    assert elapsed < 2 * remote.PROGRESS_PULL_S, f"the pull took {elapsed:.1f} s"
    assert all(ssh[1:3] == ["-o", "ConnectTimeout=1"] for ssh in read[0].values()), "half the deadline to connect"

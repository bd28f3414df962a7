"""`kit plan` / `kit apply` of the GCP example, as a user runs them, with real Terraform core and the
provider emulator installed from a filesystem mirror (tests/support/tf_emulator). The plans are
core's; the emulator answers as the provider does (docs/infrastructure.md, "Real plans")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.tf_emulator import write_cli_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def example(name: str, tmp_path: Path, monkeypatch, *, moving: bool = False) -> Path:
    """An example with a local state backend and a key of its own, and the emulator's mirror; on its
    one zone and shape unless ``moving`` (tests/support/files.one_place)."""
    import yaml

    from tests.support.files import one_place

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    data = yaml.safe_load((ROOT / "examples" / name).read_text())
    data = data if moving else one_place(data)
    data["ssh"]["public_key"] = str(tmp_path / "key.pub")
    data["backend"] = {"type": "local"}
    spec = tmp_path / "cluster.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(write_cli_config(tmp_path / "emulator")))
    monkeypatch.chdir(tmp_path)
    return spec


@pytest.fixture
def gcp(tmp_path, monkeypatch):
    return example("gcp-a3-spot.yaml", tmp_path, monkeypatch)


@contextmanager
def compute_api(spec, monkeypatch):
    """The loopback Compute API fake the emulator creates the spec's VMs and disks in, and kit's watcher
    source over every zone of the spec, reading it."""
    from google.auth.credentials import AnonymousCredentials

    from kit.watch.sources.gcp import GcpSource
    from tests.support.gcp_compute import FakeCompute
    from tests.support.tf_emulator.gcp_compute import ENDPOINT_ENV

    with FakeCompute(project=spec.project) as fake:
        monkeypatch.setenv(ENDPOINT_ENV, fake.endpoint)
        yield fake, GcpSource(spec.name, spec.project, spec.zone_list, credentials=AnonymousCredentials(),
                              api_endpoint=fake.endpoint)


@pytest.fixture
def gce(gcp, monkeypatch):
    """The Compute API fake of the GCP example (its project), and a function that polls it with kit's
    watcher source."""
    from kit.spec import load_spec

    with compute_api(load_spec(gcp), monkeypatch) as (fake, source):
        fake.watch = source.poll
        yield fake


@pytest.fixture
def aws(tmp_path, monkeypatch):
    return example("aws-g5-spot.yaml", tmp_path, monkeypatch)


def kit(*args: str, ok: bool = True) -> str:
    proc = subprocess.run([str(Path(sys.executable).with_name("kit")), *args], capture_output=True, text=True,
                          timeout=600, check=False)
    if ok:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def changes(out: str) -> list[str]:
    """The per-resource lines of `kit plan` (symbol, root, address)."""
    return [" ".join(line.split()) for line in out.splitlines() if re.match(r"^\s*[-+~/]+\s+(disks|cluster)\s", line)]


def set_spec(spec: Path, **fields: str) -> None:
    text = spec.read_text()
    for key, value in fields.items():
        text = re.sub(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.MULTILINE)
    spec.write_text(text)


def test_first_deployment_then_no_changes_then_one_node_lost(gcp, gce):
    """The GCP example applied by real core into the Compute API fake: kit's watcher source sees four
    Spot VMs; one preempted (stopped, as GCP stops a Spot VM whose termination action is STOP) is started
    again by an in-place update of desired_status alone; one deleted is created again alone."""
    first = changes(kit("plan", str(gcp)))
    assert len(first) == 15 and all(c.startswith("+ ") for c in first)
    assert sum("google_compute_disk.this" in c for c in first) == 4
    assert sum("google_compute_instance.node" in c for c in first) == 4
    assert any("google_compute_resource_policy" in c for c in first)
    kit("apply", str(gcp))
    assert "Plan: 0 to add, 0 to change, 0 to destroy." in kit("plan", str(gcp))
    seen = gce.watch()
    assert sorted((s.market, s.state) for s in seen.instances) == [("spot", "running")] * 4
    assert len(gce.disks) == 4 and all(i["scheduling"]["instanceTerminationAction"] == "STOP" for i in gce.instances)
    ids = {i["name"]: i["id"] for i in gce.instances}
    gce.preempt("a3-spot-node-2")
    lost = [s for s in gce.watch().instances if s.preempted]
    assert [(s.instance, s.state) for s in lost] == [(ids["a3-spot-node-2"], "stopped")]  # TERMINATED = stopped
    assert changes(kit("plan", str(gcp))) == ["~ cluster module.instances.google_compute_instance.node[2]"]
    kit("apply", str(gcp))
    assert {i["name"]: (i["id"], i["status"]) for i in gce.instances}["a3-spot-node-2"] == (ids["a3-spot-node-2"], "RUNNING")
    # a VM deleted outright: only it is created again, under the same policy, with a new id
    gce.instances.remove(next(i for i in gce.instances if i["name"] == "a3-spot-node-3"))
    assert changes(kit("plan", str(gcp))) == ["+ cluster module.instances.google_compute_instance.node[3]"]


def test_a_restarted_spot_vm_is_reached_at_the_external_address_it_has_now(gcp, gce, tmp_path):
    """The nodes' addresses are the API's: an ephemeral external address is released when a VM stops and a
    new one given at its start (VPC docs, "IP addresses"), its internal one kept; after the preempted VM's
    restart, kit's nodes output names the new external address (the provider reads the instance back after
    ``instances.start``), so kit connects there and not to the address the VM had."""
    from kit import terraform
    from kit.backends.cloud import output_nodes

    gce.subnet = "198.18.250"
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    deploy = tmp_path / "deploy" / "a3-spot"
    before = {n.name: (n.private_ip, n.public_ip) for n in output_nodes(terraform.output(deploy))}
    api = {i["name"]: (i["networkInterfaces"][0]["networkIP"], i["networkInterfaces"][0]["accessConfigs"][0]["natIP"])
           for i in gce.instances}
    assert before == api and len(set(before.values())) == 4
    gce.preempt("a3-spot-node-2")
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    after = {n.name: (n.private_ip, n.public_ip) for n in output_nodes(terraform.output(deploy))}
    restarted = next(i for i in gce.instances if i["name"] == "a3-spot-node-2")["networkInterfaces"][0]
    assert after["a3-spot-node-2"] == (before["a3-spot-node-2"][0], restarted["accessConfigs"][0]["natIP"])
    assert after["a3-spot-node-2"][1] not in {b for _, b in before.values()}
    assert {k: v for k, v in after.items() if k != "a3-spot-node-2"} == \
        {k: v for k, v in before.items() if k != "a3-spot-node-2"}


DISK_LOSING_CHANGES = [
    ("nodes: 4", "nodes: 2", ["this[2]", "this[3]"]),  # fewer nodes: two disks destroyed
    ("  type: pd-balanced", "  type: pd-ssd", ["this[0]", "this[3]"]),  # another disk type: all replaced
    ("  size_gb: 500", "  size_gb: 100", ["this[0]", "this[3]"]),  # a smaller disk: replaced (disks only grow)
]


def test_a_spec_change_that_would_lose_data_disks_is_refused_on_a_real_plan(gcp):
    """Each change is refused on one applied deployment, and leaves nothing behind: with the spec as it was,
    the plan is empty again (one deployment for the three changes: a plan and an apply cost seconds each)."""
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    text = gcp.read_text()
    for old, new, disks in DISK_LOSING_CHANGES:
        assert f"\n{old}\n" in text
        gcp.write_text(text.replace(f"\n{old}\n", f"\n{new}\n"))
        out = kit("plan", str(gcp), ok=False)
        assert "prevent_destroy" in out and all(f"google_compute_disk.{d}" in out for d in disks), (new, out)
    gcp.write_text(text)
    assert "Plan: 0 to add, 0 to change, 0 to destroy." in kit("plan", str(gcp))


def test_market_switch_replaces_the_instances_and_touches_no_disk(gcp, gce):
    set_spec(gcp, instance_type="a3-highgpu-8g", market="spot", nodes="2", placement="none")
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    disks = sorted(d["id"] for d in gce.disks)
    for market in ("on-demand", "spot"):
        before = {i["id"] for i in gce.instances}
        set_spec(gcp, market=market)
        lines = changes(kit("plan", str(gcp)))
        replaced = [c for c in lines if "google_compute_instance.node" in c]
        assert len(replaced) == 2 and all(c.startswith(("-/+", "+/-")) for c in replaced), lines
        assert not [c for c in lines if "google_compute_disk" in c], lines
        kit("apply", str(gcp))
        # the watcher sees two new VMs on the new market; the disks are the same ones
        seen = gce.watch().instances
        assert sorted(s.market for s in seen) == [market] * 2 and not {s.instance for s in seen} & before
        assert sorted(d["id"] for d in gce.disks) == disks


def test_aws_first_deployment_and_market_switch_both_ways(aws):
    out = kit("plan", str(aws))
    first = changes(out)
    assert len(first) == 20 and all(c.startswith("+ ") for c in first)
    # the instances are shown before the disks they attach exist; apply plans them again, then applies
    assert "cluster: planned before the disks it attaches exist (their ids show as pending)" in out, out
    assert "Plan: 20 to add, 0 to change, 0 to destroy." in out, out
    out = kit("apply", str(aws))
    assert out.count("(spot)") == 4, out  # the market each instance really runs on (instance_lifecycle)
    for market in ("on-demand", "spot"):
        set_spec(aws, market=market)
        lines = changes(kit("plan", str(aws)))
        replaced = [c for c in lines if "aws_instance.node" in c]
        assert len(replaced) == 4 and all(c.startswith("-/+") for c in replaced), lines
        assert not [c for c in lines if "aws_ebs_volume" in c], lines
        out = kit("apply", str(aws))
        assert out.count(f"({market})") == 4, out


def test_destroy_keeps_the_disks_unless_with_disks(gcp, gce, tmp_path):
    """`kit destroy` removes the cluster only; `--with-disks` goes through the disks' prevent_destroy
    (lifted for that run by an override file, which is gone afterwards) and removes them too."""
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    kit("destroy", str(gcp))
    assert not gce.instances and len(gce.disks) == 4  # in the Compute API too
    state = json.loads(terraform_state(tmp_path, "disks"))
    assert sum(r["type"] == "google_compute_disk" for r in state.get("resources", [])) == 1  # counted resource
    assert not json.loads(terraform_state(tmp_path, "cluster")).get("resources")
    kit("destroy", str(gcp), "--with-disks")
    assert not json.loads(terraform_state(tmp_path, "disks")).get("resources")
    assert not gce.disks
    assert not list((tmp_path / "deploy").rglob("*_override.tf"))


def terraform_state(tmp_path: Path, root: str) -> str:
    return next((tmp_path / "deploy").glob(f"*/{root}/terraform.tfstate")).read_text()


def _disk_count(tmp_path: Path, root: str) -> int:
    state = json.loads(terraform_state(tmp_path, root))
    return sum(len(r.get("instances", [])) for r in state.get("resources", []) if r["type"] == "google_compute_disk")


def test_a_move_and_a_shape_switch_get_disks_of_their_own_and_touch_no_other(tmp_path, monkeypatch, caplog):
    """The GCP example as it is (two zones; 8 x a3-highgpu-1g spot, 1 x a3-highgpu-8g on-demand), applied
    through the backend the watcher acts with into the Compute API fake: a move to the other zone replaces
    every instance and creates that zone's disks, and the watcher's source (every zone of the spec) sees
    the nodes running there; a shape switch there creates the 8g's one disk; no plan deletes a disk (the
    guard would refuse it), every set keeps its disks, and only the end deletes them all."""
    from kit import terraform
    from kit.backends.cloud import TerraformBackend
    from kit.render import deployment_dir
    from kit.spec import load_spec
    from kit.watch.sources.base import loss_events

    spec = load_spec(example("gcp-a3-spot.yaml", tmp_path, monkeypatch, moving=True))
    offers = {o.name: o for o in spec.offers()}
    backend = TerraformBackend(spec, deployment_dir(spec))
    with compute_api(spec, monkeypatch) as (gce, source):
        first = backend.apply(spec, "spot")
        assert len(first) == 8 and {(n.zone, n.market) for n in first} == {("us-central1-a", "spot")}
        moved = backend.apply(spec.with_offer(offers["us-central1-c/8xa3-highgpu-1g/spot"]), "spot")
        assert {n.zone for n in moved} == {"us-central1-c"} and not {n.instance_id for n in moved} & {
            n.instance_id for n in first}
        assert {i["zone"].rsplit("/", 1)[-1] for i in gce.instances} == {"us-central1-c"}
        assert sorted(d["zone"].rsplit("/", 1)[-1] for d in gce.disks) == ["us-central1-a"] * 8 + ["us-central1-c"] * 8
        poll = source.poll()
        assert sorted((s.market, s.state) for s in poll.instances) == [("spot", "running")] * 8
        assert loss_events(poll, {n.instance_id: n.rank for n in moved}, "gcp", 0.0) == []
        assert ("moving from us-central1-a to us-central1-c: 8 nodes replaced, 8 disks created, checkpoint restored "
                "from bucket") in caplog.text
        reshaped = backend.apply(spec.with_offer(offers["us-central1-c/1xa3-highgpu-8g/on-demand"]), "on-demand")
        assert [(n.zone, n.market) for n in reshaped] == [("us-central1-c", "on-demand")]
        roots = terraform.disk_roots(deployment_dir(spec))
        assert roots == ["disks-us-central1-a-8xa3-highgpu-1g", "disks-us-central1-c-1xa3-highgpu-8g",
                         "disks-us-central1-c-8xa3-highgpu-1g"]
        assert [_disk_count(tmp_path, r) for r in roots] == [8, 1, 8]  # nothing lost on the way
        backend.destroy(keep_disks=False)  # the job is done: every set goes
        assert [_disk_count(tmp_path, r) for r in roots] == [0, 0, 0]
        assert not json.loads(terraform_state(tmp_path, "cluster")).get("resources")
        assert not gce.instances and not gce.disks  # in the Compute API too


def test_the_markdown_summary_of_a_real_plan_lists_every_address_and_replacement(aws):
    kit("plan", str(aws))
    kit("apply", str(aws))
    set_spec(aws, market="on-demand")
    text = kit("plan", str(aws))
    for i in range(4):
        assert f"-/+ cluster  module.instances.aws_instance.node[{i}]  (forced by lifecycle.replace_triggered_by)" in text
        assert f"-/+ cluster  module.instances.aws_volume_attachment.data[{i}]  (forced by instance_id)" in text
    assert "4 instance(s) replaced" in text and "Plan: 8 to add, 1 to change, 8 to destroy." in text, text
    md = kit("plan", str(aws), "--format", "markdown")
    for i in range(4):
        assert (f"| replace | cluster | `module.instances.aws_instance.node[{i}]` | "
                "forced by lifecycle.replace_triggered_by |") in md, md
        assert f"| replace | cluster | `module.instances.aws_volume_attachment.data[{i}]` | forced by instance_id |" in md
    assert "**Plan: 8 to add, 1 to change, 8 to destroy.**" in md
    assert "now $2.60/h (4 spot), after $6.50/h (4 on-demand)" in md, md


@pytest.fixture
def moto_ec2(monkeypatch):
    """A moto server (EC2) that the emulator creates the AWS resources in."""
    import boto3

    from tests.support.moto import moto_server
    from tests.support.tf_emulator.aws_moto import ENDPOINT_ENV

    with moto_server(monkeypatch) as url:
        monkeypatch.setenv(ENDPOINT_ENV, url)
        yield url, boto3.client("ec2", region_name="us-east-1", endpoint_url=url)


def _nodes(ec2) -> dict[str, dict]:
    """Live instances by their Name tag."""
    out = {}
    for reservation in ec2.describe_instances()["Reservations"]:
        for inst in reservation["Instances"]:
            if inst["State"]["Name"] not in ("terminated", "shutting-down"):
                out[next(t["Value"] for t in inst["Tags"] if t["Key"] == "Name")] = inst
    return out


def _data_volumes(ec2) -> dict[str, str | None]:
    """Data volume id -> the instance it is attached to."""
    vols = ec2.describe_volumes(Filters=[{"Name": "tag:kit:role", "Values": ["data-disk"]}])["Volumes"]
    return {v["VolumeId"]: next((a["InstanceId"] for a in v.get("Attachments", [])), None) for v in vols}


def test_what_terraform_creates_is_what_boto3_and_the_watcher_see(aws, moto_ec2):
    """The AWS example applied by real core into moto: boto3 (and kit's watcher source) see four
    spot instances, each with its own data volume; a market switch replaces the instances and the
    same volumes are attached to the new ones; an instance the cloud terminated is created again."""
    from kit.watch.sources.aws import AwsSource

    url, ec2 = moto_ec2
    kit("plan", str(aws))
    kit("apply", str(aws))
    nodes = _nodes(ec2)
    assert sorted(nodes) == [f"g5-spot-node-{i}" for i in range(4)]
    assert {n.get("InstanceLifecycle") for n in nodes.values()} == {"spot"}
    volumes = _data_volumes(ec2)
    assert len(volumes) == 4 and set(volumes.values()) == {n["InstanceId"] for n in nodes.values()}
    seen = AwsSource("g5-spot", "us-east-1", endpoint_url=url).poll()
    assert sorted(s.market for s in seen.instances) == ["spot"] * 4
    # the security group holds exactly the rules the module declares (EC2's default egress rule revoked)
    (group,) = {g["GroupId"] for n in nodes.values() for g in n["SecurityGroups"]}
    rules = ec2.describe_security_group_rules(Filters=[{"Name": "group-id", "Values": [group]}])["SecurityGroupRules"]
    assert sorted((r["IsEgress"], r["IpProtocol"], r.get("FromPort", -1), r.get("CidrIpv4", ""),
                   r.get("ReferencedGroupInfo", {}).get("GroupId", "")) for r in rules) == [
        (False, "-1", -1, "", group), (False, "tcp", 22, "203.0.113.0/24", ""),
        (True, "-1", -1, "", group), (True, "-1", -1, "0.0.0.0/0", "")], rules

    set_spec(aws, market="on-demand")
    kit("plan", str(aws))
    kit("apply", str(aws))
    after = _nodes(ec2)
    assert {n.get("InstanceLifecycle") for n in after.values()} == {None}
    assert not {n["InstanceId"] for n in after.values()} & {n["InstanceId"] for n in nodes.values()}
    moved = _data_volumes(ec2)
    assert set(moved) == set(volumes) and set(moved.values()) == {n["InstanceId"] for n in after.values()}

    ec2.terminate_instances(InstanceIds=[after["g5-spot-node-1"]["InstanceId"]])
    lines = changes(kit("plan", str(aws)))
    assert [c for c in lines if not c.startswith("~")] == [
        "+ cluster module.instances.aws_instance.node[1]", "+ cluster module.instances.aws_volume_attachment.data[1]"], lines


def test_nodes_get_write_access_to_their_prefix_of_the_checkpoint_bucket_only(tmp_path, monkeypatch):
    """AWS with a checkpoint bucket: the plan adds a role, its inline policy (list the job's prefix,
    read/write/delete objects under it, nothing else) and an instance profile the instances use; a
    market switch replaces the instances, not the role."""
    import yaml

    spec = example("aws-g5-spot.yaml", tmp_path, monkeypatch)
    data = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**data, "checkpoint_bucket": "s3://ckpts/kit"}, sort_keys=False))
    lines = changes(kit("plan", str(spec)))
    for address in ("aws_iam_role.node[0]", "aws_iam_role_policy.checkpoints[0]", "aws_iam_instance_profile.node[0]"):
        assert f"+ cluster module.instances.{address}" in lines, lines
    kit("apply", str(spec))
    state = json.loads(terraform_state(tmp_path, "cluster"))
    policy = next(r for r in state["resources"] if r["type"] == "aws_iam_role_policy")["instances"][0]["attributes"]
    statements = json.loads(policy["policy"])["Statement"]
    assert statements[0]["Resource"] == "arn:aws:s3:::ckpts"
    assert statements[0]["Condition"]["StringLike"]["s3:prefix"] == ["kit/g5-spot/*", "kit/g5-spot"]
    assert statements[1]["Resource"] == "arn:aws:s3:::ckpts/kit/g5-spot/*"
    profile = next(r for r in state["resources"] if r["type"] == "aws_iam_instance_profile")["instances"][0]
    instances = next(r for r in state["resources"] if r["type"] == "aws_instance")["instances"]
    assert {i["attributes"]["iam_instance_profile"] for i in instances} == {profile["attributes"]["name"]}
    set_spec(spec, market="on-demand")
    switched = changes(kit("plan", str(spec)))
    assert not [c for c in switched if "aws_iam" in c], switched


def test_aws_a_move_and_a_shape_switch_in_moto(aws, moto_ec2):
    """The AWS example given two zones and a second shape (1 x g5.12xlarge: the same 4 GPUs), applied
    through the watcher's backend by real core into moto: boto3 sees the instances move to
    us-east-1b (each with a new data volume there), then one g5.12xlarge on-demand; every volume of
    the sets the job left is still there until the first zone's set is released (its volumes alone are
    deleted, the running set cannot be), and the end deletes the rest."""
    import yaml

    from kit import terraform
    from kit.backends.cloud import TerraformBackend
    from kit.errors import KitError
    from kit.render import deployment_dir
    from kit.spec import load_spec

    _, ec2 = moto_ec2
    data = yaml.safe_load(aws.read_text())
    data.update(zones=["us-east-1a", "us-east-1b"],
                shapes=[{"instance_type": "g5.4xlarge", "nodes": 4}, {"instance_type": "g5.12xlarge", "nodes": 1}])
    aws.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(aws)
    offers = {o.name: o for o in spec.offers()}
    backend = TerraformBackend(spec, deployment_dir(spec))
    backend.apply(spec, "spot")
    assert {n["Placement"]["AvailabilityZone"] for n in _nodes(ec2).values()} == {"us-east-1a"}
    backend.apply(spec.with_offer(offers["us-east-1b/4xg5.4xlarge/spot"]), "spot")
    moved = _nodes(ec2)
    assert len(moved) == 4 and {n["Placement"]["AvailabilityZone"] for n in moved.values()} == {"us-east-1b"}
    assert {n.get("InstanceLifecycle") for n in moved.values()} == {"spot"}
    backend.apply(spec.with_offer(offers["us-east-1b/1xg5.12xlarge/on-demand"]), "on-demand")
    (node,) = _nodes(ec2).values()
    assert (node["InstanceType"], node.get("InstanceLifecycle")) == ("g5.12xlarge", None)
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:kit:role", "Values": ["data-disk"]}])["Volumes"]
    by_zone = sorted((v["AvailabilityZone"], len(v.get("Attachments", []))) for v in volumes)
    assert [z for z, _ in by_zone] == ["us-east-1a"] * 4 + ["us-east-1b"] * 5  # 4 + 4 + 1: none lost
    assert sum(attached for _, attached in by_zone) == 1  # only the running node's
    # the watcher's DiskKeeper, once us-east-1a was left long enough: that zone's disks root alone goes
    left = backend.disk_set("us-east-1a", "4xg5.4xlarge")
    with pytest.raises(KitError, match="running zone and shape"):
        backend.release_disks(backend.disk_set("us-east-1b", "1xg5.12xlarge"))
    backend.release_disks(left)
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:kit:role", "Values": ["data-disk"]}])["Volumes"]
    assert sorted(v["AvailabilityZone"] for v in volumes) == ["us-east-1b"] * 5 and left not in terraform.disk_roots(
        deployment_dir(spec))
    assert not list(deployment_dir(spec).glob("modules/*/disks/kit_destroy_override.tf")), "prevent_destroy back"
    backend.destroy(keep_disks=False)
    assert not _nodes(ec2)
    assert not ec2.describe_volumes(Filters=[{"Name": "tag:kit:role", "Values": ["data-disk"]}])["Volumes"]


def test_the_watcher_leaves_a_stocked_out_zone_and_recovers_a_preemption_on_real_plans(tmp_path, monkeypatch):
    """The GCP example as it is, watched: its first zone has no capacity (instances.insert ends with
    ZONE_RESOURCE_POOL_EXHAUSTED, Terraform's apply fails with the provider's message), so the capacity
    search records that offer and launches in us-central1-c; the source, reading both zones, sees the
    8 VMs there and no loss; one is preempted (stopped, GCP's way): the recovery tries the preempting zone
    last (us-central1-a, still out, first) and lands in us-central1-c again with a whole new gang."""
    import random

    from kit.backends.cloud import TerraformBackend
    from kit.render import deployment_dir
    from kit.spec import load_spec
    from kit.watch.acting import Actor, Backoff
    from kit.watch.events import CAPACITY_ERROR
    from kit.watch.ledger import Ledger
    from kit.watch.watcher import Watcher
    from tests.support.watch import ScriptedPolicy

    spec = load_spec(example("gcp-a3-spot.yaml", tmp_path, monkeypatch, moving=True))
    backend = TerraformBackend(spec, deployment_dir(spec))
    bootstrapped: list[list[str]] = []
    monkeypatch.setattr(backend, "bootstrap", lambda nodes: bootstrapped.append([n.zone for n in nodes]))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    with compute_api(spec, monkeypatch) as (gce, source):
        gce.stocked_out = {"us-central1-a"}
        actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0)), source=source)
        watcher = Watcher(spec, ledger, actor, ScriptedPolicy(["spot"]), source=source)
        watcher.start()
        assert watcher.tick().outcome.status == "done"
        failed = ledger.events(kinds=(CAPACITY_ERROR,))
        assert [e["detail"]["offer"] for e in failed] == ["us-central1-a/8xa3-highgpu-1g/spot"]
        assert "does not have enough resources available" in failed[0]["detail"]["error"]
        assert ledger.applied_offer() == "us-central1-c/8xa3-highgpu-1g/spot"
        assert {i["zone"].rsplit("/", 1)[-1] for i in gce.instances} == {"us-central1-c"} and len(gce.instances) == 8
        assert bootstrapped == [["us-central1-c"] * 8]
        result = watcher.tick()
        assert (result.nodes_up, result.nodes_lost, result.action) == (8, 0, None)
        ids = {i["name"]: i["id"] for i in gce.instances}
        gce.preempt("a3-spot-node-5")
        result = watcher.tick()
        assert result.action == "recover" and result.outcome.status == "done", result
        tried = [e["detail"]["offer"] for e in ledger.events(kinds=(CAPACITY_ERROR,))]
        assert tried == ["us-central1-a/8xa3-highgpu-1g/spot"] * 2  # a again first, c (preempting) last
        # One cluster root: trying zone a replaced the gang (Terraform destroys before it creates, as SkyPilot
        # terminates a preempted cluster before relaunching elsewhere), so c's VMs are all new ones.
        now = {i["name"]: i for i in gce.instances}
        assert set(now) == set(ids) and not {i["id"] for i in now.values()} & set(ids.values())
        assert {(i["zone"].rsplit("/", 1)[-1], i["status"]) for i in now.values()} == {("us-central1-c", "RUNNING")}
        assert ledger.applied_offer() == "us-central1-c/8xa3-highgpu-1g/spot"
        assert bootstrapped[-1] == ["us-central1-c"] * 8
        assert {n.instance_id for n in ledger.nodes(("up",))} == {i["id"] for i in now.values()}
        result = watcher.tick()
        assert (result.nodes_up, result.nodes_lost, result.action) == (8, 0, None)


def _zone_priced_gcp_example(tmp_path: Path, monkeypatch, spot: float):
    """The GCP example as it is (two zones of us-central1), us-central1-c's spot at 3 x ``spot`` (``prices.zones``),
    moves without egress or transfer: the changeover alone."""
    import yaml

    from kit.spec import load_spec

    path = example("gcp-a3-spot.yaml", tmp_path, monkeypatch, moving=True)
    data = yaml.safe_load(path.read_text())
    data["prices"] = {"spot_per_hour": spot, "zones": {"us-central1-c": {"spot_per_hour": 3 * spot}}}
    data["policy"].update(changeover_hours=0.2, egress_per_gb=0, checkpoint_gb=0.001)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def _spot_default():
    """The multi-zone market policy (a DefaultPolicy, so the watcher follows the simulated ``default``), answering spot."""
    from kit.policy.market import DefaultPolicy
    from training.contract import SPOT

    class SpotDefault(DefaultPolicy):
        def decide(self, obs):
            return SPOT

    return SpotDefault()


def test_a_spot_job_in_a_dear_zone_tries_to_move_and_lands_in_the_cheaper_one_on_real_plans(tmp_path, monkeypatch):
    """The GCP example, its us-central1-c priced at 3 x us-central1-a (``prices.zones``), watched with the multi-zone
    ``default``: a stocked out, the job lands in c. With a back, once staying has cost what a failed try costs (a
    break-even), it tries to move: real core plans the move, the emulator creates a's VMs in place of c's, the
    source sees them there, and the nodes are recorded at a's price. (A failed try replacing the gang on real
    plans: test_the_watcher_leaves_a_stocked_out_zone_and_recovers_a_preemption_on_real_plans.)"""
    import random

    from kit.backends.cloud import TerraformBackend
    from kit.render import deployment_dir
    from kit.watch.acting import Actor, Backoff
    from kit.watch.ledger import Ledger
    from kit.watch.watcher import Watcher
    from tests.support.watch import heartbeat

    spot = 2.0
    spec = _zone_priced_gcp_example(tmp_path, monkeypatch, spot)
    backend = TerraformBackend(spec, deployment_dir(spec))
    monkeypatch.setattr(backend, "bootstrap", lambda nodes: None)
    ledger, now = Ledger(tmp_path / "ledger.sqlite"), [1_000_000.0]
    with compute_api(spec, monkeypatch) as (gce, source):
        gce.stocked_out = {"us-central1-a"}
        actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0)), source=source, clock=lambda: now[0])
        watcher = Watcher(spec, ledger, actor, _spot_default(), source=source, clock=lambda: now[0])
        watcher.start()
        assert watcher.tick().outcome.status == "done"
        assert ledger.applied_offer() == "us-central1-c/8xa3-highgpu-1g/spot"

        def tick_after(hours: float):
            now[0] += hours * 3600
            ledger.record(heartbeat(10, 1000, written=now[0]))
            return watcher.tick()

        gce.stocked_out = set()
        assert tick_after(0.05).action is None  # staying has cost less than a failed try so far
        first = {i["id"] for i in gce.instances}
        result = tick_after(0.5)
        assert result.action == "move" and result.outcome.status == "done", result
        assert ledger.applied_offer() == "us-central1-a/8xa3-highgpu-1g/spot"
        assert {i["zone"].rsplit("/", 1)[-1] for i in gce.instances} == {"us-central1-a"} and len(gce.instances) == 8
        assert not {i["id"] for i in gce.instances} & first
        assert {(n.zone, n.price) for n in ledger.nodes(("up",))} == {("us-central1-a", spot)}
        assert ledger.last_decision("move").status == "done"
        result = tick_after(0.5)
        assert (result.nodes_up, result.nodes_lost, result.action) == (8, 0, None)

"""AWS source against moto in server mode (a real HTTP endpoint on loopback, real boto3 calls).

What moto can and cannot do (moto 5): ``run_instances`` with ``InstanceMarketOptions`` makes
instances whose ``InstanceLifecycle`` is ``spot``; terminate/stop set ``StateReason`` to
``Client.UserInitiatedShutdown``. Moto has no spot interruptions, no spot request status
transitions for interruptions and no placement groups. So:
* a *lost* node is simulated with the real API (``terminate_instances`` / ``stop_instances``);
* a *spot reclaim* is simulated by writing, in the moto server's in-process model, what EC2
  shows after an interruption: state terminated with ``StateReason`` code
  ``Server.SpotInstanceTermination``, or a spot request whose status code is
  ``marked-for-termination`` / ``capacity-not-available``. A request still waiting for capacity
  has no instance on EC2 (moto fulfils every request at once), so the test removes it. The source
  reads them through the ordinary DescribeInstances / DescribeSpotInstanceRequests calls.
"""

from __future__ import annotations

import random

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from kit.backends.base import Backend, Node
from kit.watch.acting import Actor, Backoff
from kit.watch.events import CAPACITY_ERROR, INSTANCE_LOST, NOTICE, PREEMPTION
from kit.watch.ledger import Ledger
from kit.watch.sources.aws import AwsSource, transition_time
from kit.watch.sources.base import RUNNING, STOPPED, TERMINATED
from kit.watch.status import status_report
from kit.watch.watcher import Watcher
from tests.support.watch import ScriptedPolicy, cloud_spec, heartbeat

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account


@pytest.fixture(scope="module")
def moto_url():
    from tests.support.moto import moto_server

    mp = pytest.MonkeyPatch()
    with moto_server(mp, REGION) as url:
        yield url
    mp.undo()


@pytest.fixture
def ec2(moto_url):
    client = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)
    yield client
    ids = [i["InstanceId"] for r in client.describe_instances()["Reservations"] for i in r["Instances"]]
    if ids:
        client.terminate_instances(InstanceIds=ids)


def moto_ec2_model():
    from moto.backends import get_backend

    return get_backend("ec2")[ACCOUNT][REGION]


def launch(ec2, cluster: str, count: int, market: str = "spot") -> list[str]:
    options = {"InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}} if market == "spot" else {}
    reply = ec2.run_instances(
        ImageId="ami-12c6146b", InstanceType="p4d.24xlarge", MinCount=count, MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "kit:cluster", "Value": cluster}, {"Key": "kit:market", "Value": market}]}], **options)
    return [i["InstanceId"] for i in reply["Instances"]]


def simulate_spot_reclaim(instance_id: str) -> None:
    """What EC2 shows after a spot interruption (moto cannot produce one by itself)."""
    from moto.ec2.models.instances import StateReason

    instance = moto_ec2_model().get_instance(instance_id)
    instance.terminate()
    instance.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                        "Server.SpotInstanceTermination")


class MotoBackend(Backend):
    """Nodes are the moto instances of the cluster; apply records and relaunches the missing ones."""

    cloud = "aws"

    def __init__(self, ec2, cluster, ids):
        self.ec2, self.cluster, self.ids, self.calls = ec2, cluster, list(ids), []

    def nodes(self):
        return [Node(name=f"node-{r}", instance_id=i, rank=r, market="spot") for r, i in enumerate(self.ids)]

    def apply(self, spec, market):
        self.calls.append(("apply", market))
        states = {i["InstanceId"]: i["State"]["Name"] for r in self.ec2.describe_instances(InstanceIds=self.ids)
                  ["Reservations"] for i in r["Instances"]}
        self.ids = [i if states[i] == "running" else launch(self.ec2, self.cluster, 1, market)[0] for i in self.ids]
        return [Node(name=f"node-{r}", instance_id=i, rank=r, market=market) for r, i in enumerate(self.ids)]

    def bootstrap(self, nodes):
        self.calls.append(("bootstrap", [n.instance_id for n in nodes]))

    def destroy(self, keep_disks=True):
        self.calls.append(("destroy", keep_disks))


def test_poll_lists_only_the_clusters_instances_as_spot(ec2, moto_url):
    ours = launch(ec2, "demo-a", 2)
    theirs = launch(ec2, "other", 1)
    on_demand = launch(ec2, "demo-a", 1, market="on-demand")
    poll = AwsSource("demo-a", REGION, endpoint_url=moto_url).poll()
    seen = {s.instance: s for s in poll.instances}
    assert set(seen) == set(ours + on_demand) and not set(theirs) & set(seen)
    assert all(seen[i].state == RUNNING and seen[i].market == "spot" for i in ours)
    assert seen[on_demand[0]].market == "on-demand"


def test_watcher_records_a_terminated_and_a_reclaimed_spot_node_and_recovers(ec2, moto_url, tmp_path):
    ids = launch(ec2, "demo-b", 3)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = MotoBackend(ec2, "demo-b", ids)
    spec = cloud_spec("aws", name="demo-b", nodes=3)
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0))),
                      ScriptedPolicy(["spot"]), source=AwsSource("demo-b", REGION, endpoint_url=moto_url))
    watcher.start()
    assert watcher.tick().new_events == []  # all running: nothing to record

    ec2.terminate_instances(InstanceIds=[ids[1]])  # a node lost for a non-spot reason
    simulate_spot_reclaim(ids[2])  # a spot interruption
    result = watcher.tick()

    recorded = {e["instance"]: e for e in ledger.events()}
    assert recorded[ids[1]]["kind"] == INSTANCE_LOST
    assert recorded[ids[1]]["detail"]["reason"] == "Client.UserInitiatedShutdown"
    assert recorded[ids[2]]["kind"] == PREEMPTION
    assert recorded[ids[2]]["detail"]["reason"] == "Server.SpotInstanceTermination"
    assert recorded[ids[2]]["detail"]["state"] == TERMINATED and recorded[ids[2]]["node_rank"] == 2
    assert ids[0] not in recorded
    assert result.action == "recover" and backend.calls[0] == ("apply", "spot")
    assert backend.calls[1][1][0] == ids[0] and len(set(backend.calls[1][1])) == 3  # survivor kept, 2 new
    assert {n.instance_id for n in ledger.nodes(("replaced",))} == {ids[1], ids[2]}
    # Still listed as terminated on the next poll: recorded once only.
    assert watcher.tick().new_events == [] and len(ledger.events()) == 2


def test_stopped_instance_is_a_loss(ec2, moto_url):
    ids = launch(ec2, "demo-c", 1)
    ec2.stop_instances(InstanceIds=ids)
    status, = AwsSource("demo-c", REGION, endpoint_url=moto_url).poll().instances
    assert status.state == STOPPED and status.preempted is False and status.time is not None


def spot_requests(ec2, cluster: str, count: int, *, tag_request: bool = False) -> tuple[list[str], list[str]]:
    """Fulfilled spot requests whose instances are tagged for ``cluster``: (request ids, instance ids)."""
    extra = {"TagSpecifications": [{"ResourceType": "spot-instances-request",
                                    "Tags": [{"Key": "kit:cluster", "Value": cluster}]}]} if tag_request else {}
    reply = ec2.request_spot_instances(InstanceCount=count, LaunchSpecification={
        "ImageId": "ami-12c6146b", "InstanceType": "p4d.24xlarge"}, **extra)
    requests = [r["SpotInstanceRequestId"] for r in reply["SpotInstanceRequests"]]
    model = moto_ec2_model()
    instances = [model.spot_instance_requests[r].instance.id for r in requests]
    ec2.create_tags(Resources=instances, Tags=[{"Key": "kit:cluster", "Value": cluster}])
    return requests, instances


def waiting_for_capacity(request_id: str, code: str = "capacity-not-available") -> None:
    """Turn a moto request into what EC2 shows for one still waiting for capacity: open, no
    instance (moto fulfils every request at once)."""
    request = moto_ec2_model().spot_instance_requests[request_id]
    request.instance.terminate()
    request.__class__ = type("Unfulfilled", (type(request),), {"instance_id": property(lambda self: None)})
    request.state, request._status_code = "open", code


def test_spot_request_status_codes_become_notice_and_capacity_events(ec2, moto_url):
    (request,), (instance,) = spot_requests(ec2, "demo-d", 1)
    moto_ec2_model().spot_instance_requests[request]._status_code = "marked-for-termination"
    (ours,), _ = spot_requests(ec2, "demo-d", 1, tag_request=True)
    (theirs,), _ = spot_requests(ec2, "someone-else", 1, tag_request=True)
    (untagged,), _ = spot_requests(ec2, "demo-d", 1)
    for waiting in (ours, theirs, untagged):
        waiting_for_capacity(waiting)
    poll = AwsSource("demo-d", REGION, endpoint_url=moto_url).poll()
    kinds = sorted((e.kind, e.detail["spot_status"], e.instance) for e in poll.events)
    # A request with no instance is the cluster's only when it is tagged for it.
    assert kinds == [(CAPACITY_ERROR, "capacity-not-available", ours), (NOTICE, "marked-for-termination", instance)]
    notice = next(e for e in poll.events if e.kind == NOTICE)
    assert notice.detail["notice"] is True
    capacity = next(e for e in poll.events if e.kind == CAPACITY_ERROR)
    assert capacity.detail["market"] == "spot"
    status = next(s for s in poll.instances if s.instance == instance)
    assert status.state == RUNNING and not status.preempted  # the notice is not the loss


class SpotRequestBackend(MotoBackend):
    def apply(self, spec, market):
        self.calls.append(("apply", market))
        states = {i["InstanceId"]: i["State"]["Name"] for r in self.ec2.describe_instances(InstanceIds=self.ids)
                  ["Reservations"] for i in r["Instances"]}
        self.ids = [i if states[i] == "running" else spot_requests(self.ec2, self.cluster, 1)[1][0] for i in self.ids]
        return [Node(name=f"node-{r}", instance_id=i, rank=r, market=market) for r, i in enumerate(self.ids)]


def test_two_minute_notice_is_recorded_but_only_the_reclaim_is_a_loss(ec2, moto_url, tmp_path):
    """Finding 2: the spot request's marked-for-termination (the instance still runs) used to be a
    confirmed loss: an apply and a cluster-wide training restart on every tick until AWS acted."""
    requests, ids = spot_requests(ec2, "demo-e", 2)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = SpotRequestBackend(ec2, "demo-e", ids)
    spec = cloud_spec("aws", name="demo-e", nodes=2)
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0))),
                      ScriptedPolicy(["spot"]), source=AwsSource("demo-e", REGION, endpoint_url=moto_url))
    watcher.start()
    ledger.record(heartbeat(10, 1000))
    moto_ec2_model().spot_instance_requests[requests[1]]._status_code = "marked-for-termination"
    results = [watcher.tick() for _ in range(4)]
    assert backend.calls == [], "a notice alone must not re-apply or restart training"
    assert [r.nodes_lost for r in results] == [0, 0, 0, 0] and all(r.action is None for r in results)
    assert [e["kind"] for e in ledger.events()] == [NOTICE]  # recorded once
    report = status_report(ledger, spec)
    assert (report["notices"], report["preemptions"], report["nodes_lost"]) == (1, 0, 0)

    simulate_spot_reclaim(ids[1])  # two minutes later AWS acts
    result = watcher.tick()
    assert result.action == "recover" and backend.calls[0] == ("apply", "spot")
    assert len([c for c in backend.calls if c[0] == "bootstrap"]) == 1
    report = status_report(ledger, spec)
    assert (report["notices"], report["preemptions"], report["nodes_lost"]) == (1, 1, 1)


def test_transition_time_parses_ec2_reason_text():
    assert transition_time("User initiated (2025-10-04 12:00:00 GMT)") == 1759579200.0
    assert transition_time("") is None and transition_time("Service initiated") is None


def test_a_job_that_moved_to_another_region_is_listed_there_and_not_taken_for_lost(moto_url):
    """The spec's zones span two regions: the source reads both, so the nodes of a job that moved to
    us-west-2 are running there, not "not listed by the cloud" (which the watcher would count as lost)."""
    from kit.clouds import get
    from kit.watch.sources.base import loss_events

    west = boto3.client("ec2", region_name="us-west-2", endpoint_url=moto_url)
    moved = launch(west, "demo-f", 2)
    spec = cloud_spec("aws", name="demo-f", zones=["us-east-1a", "us-west-2a"], checkpoint_bucket="s3://demo-ckpt")
    source = get("aws").event_source(spec, None)
    assert source.regions == ("us-east-1", "us-west-2")
    source.endpoint_url = moto_url
    seen = {s.instance: s.state for s in source.poll().instances}
    assert seen == {i: RUNNING for i in moved}
    current = dict.fromkeys(moved, 0)
    assert loss_events(source.poll(), current, "aws", 0.0) == []
    # what reading the first region alone did: every moved node "not listed", i.e. lost
    first_only = AwsSource("demo-f", "us-east-1", endpoint_url=moto_url).poll()
    assert {e.instance for e in loss_events(first_only, current, "aws", 0.0)} == set(moved)
    west.terminate_instances(InstanceIds=moved)

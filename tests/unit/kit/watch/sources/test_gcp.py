"""GCP source against a FAKE Compute Engine on loopback (tests/support/gcp_compute.py).

The fake answers with bodies shaped like the documented Compute Engine v1 API: here
``instances.list`` (GET /compute/v1/projects/{project}/zones/{zone}/instances, an ``InstanceList``
with ``items``/``nextPageToken``, pages of 2) and ``zoneOperations.list`` (GET
.../zones/{zone}/operations, an ``OperationList`` of system ``compute.instances.preempted``
operations). It honours only the two ``filter`` expressions the source sends and answers 400 to
anything else, so a wrong filter fails the test. google-cloud-compute's real REST transport talks to
it through ``client_options={"api_endpoint": "http://127.0.0.1:PORT"}`` with AnonymousCredentials.
"""

from __future__ import annotations

import random
from datetime import datetime

import pytest

pytest.importorskip("google.cloud.compute_v1")
from google.auth.credentials import AnonymousCredentials

from kit.backends.base import Backend, Node
from kit.errors import KitError
from kit.watch.acting import Actor, Backoff
from kit.watch.events import INSTANCE_LOST, PREEMPTION
from kit.watch.ledger import Ledger
from kit.watch.sources.base import RUNNING, STOPPED, SourceError
from kit.watch.sources.gcp import GcpSource
from kit.watch.status import status_report
from kit.watch.watcher import Watcher
from tests.support.gcp_compute import FakeCompute
from tests.support.watch import ScriptedPolicy, cloud_spec

PROJECT, ZONE = "kit-test", "us-central1-a"
BASE = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}"


def instance(iid: str, name: str, cluster: str, status: str = "RUNNING", model: str = "SPOT") -> dict:
    return {
        "kind": "compute#instance", "id": iid, "name": name, "status": status,
        "creationTimestamp": "2025-10-04T00:10:00.000-07:00",
        "machineType": f"{BASE}/machineTypes/a3-highgpu-1g", "zone": BASE.rsplit("/zones/", 1)[0] + f"/zones/{ZONE}",
        "labels": {"kit-cluster": cluster, "kit-node": name},
        "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": False,
                       "preemptible": False, "provisioningModel": model,
                       **({"instanceTerminationAction": "STOP"} if model == "SPOT" else {})},
        "lastStartTimestamp": "2025-10-04T00:11:00.000-07:00",
        **({"lastStopTimestamp": "2025-10-04T05:00:30.000-07:00"} if status != "RUNNING" else {}),
        "selfLink": f"{BASE}/instances/{name}",
    }


def preempted_operation(op_id: str, target_id: str, name: str) -> dict:
    return {
        "kind": "compute#operation", "id": op_id, "name": f"systemevent-1759579200000-{op_id}",
        "zone": f"{BASE}", "operationType": "compute.instances.preempted",
        "targetLink": f"{BASE}/instances/{name}", "targetId": target_id, "status": "DONE",
        "statusMessage": "Instance was preempted.", "user": "system", "progress": 100,
        "insertTime": "2025-10-04T05:00:00.000-07:00", "startTime": "2025-10-04T05:00:00.000-07:00",
        "endTime": "2025-10-04T05:00:00.000-07:00", "selfLink": f"{BASE}/operations/systemevent-{op_id}",
    }


class FakeDay:
    """The watcher's clock on the fake's timeline (its instances' and operations' times are of 2025-10-04,
    -07:00): a preempted operation is matched to the incarnation that ran at its time."""

    def __init__(self, hhmm: str) -> None:
        self.set(hhmm)

    def set(self, hhmm: str) -> None:
        self.now = at(hhmm)

    def __call__(self) -> float:
        return self.now


def at(hhmm: str) -> float:
    return datetime.fromisoformat(f"2025-10-04T{hhmm}:00.000-07:00").timestamp()


@pytest.fixture
def fake():
    with FakeCompute(project=PROJECT) as state:
        yield state


def source(fake, cluster="demo") -> GcpSource:
    return GcpSource(cluster, PROJECT, ZONE, credentials=AnonymousCredentials(), api_endpoint=fake.endpoint)


def test_instances_by_label_with_paging_and_preemption_operations(fake):
    fake.instances = [instance("101", "demo-0", "demo"), instance("102", "demo-1", "demo"),
                      instance("103", "demo-2", "demo", status="TERMINATED"),
                      instance("104", "demo-3", "demo", model="STANDARD"), instance("900", "x-0", "other")]
    fake.operations = [preempted_operation("7001", "103", "demo-2"), preempted_operation("7002", "900", "x-0")]
    poll = source(fake).poll()
    seen = {s.instance: s for s in poll.instances}
    assert set(seen) == {"101", "102", "103", "104"}  # all pages, only our label
    assert seen["101"].state == RUNNING and seen["101"].market == "spot"
    assert seen["104"].market == "on-demand"
    assert seen["103"].state == STOPPED and seen["103"].preempted and seen["103"].reason == "Instance was preempted."
    assert seen["103"].time == pytest.approx(1759579200.0)  # 05:00-07:00 = 12:00Z
    # Every preempted operation of the zone is reported (the watcher keeps the ones naming an
    # instance its ledger knows): an instance deleted after its preemption is not listed any more.
    events = {e.instance: e for e in poll.events}
    assert set(events) == {"103", "900"} and all(e.kind == PREEMPTION for e in events.values())
    assert (events["103"].detail["name"], events["103"].detail["listed"]) == ("demo-2", True)
    assert (events["900"].detail["name"], events["900"].detail["listed"]) == ("x-0", False)
    assert any("pageToken=2" in r for r in fake.requests)


class GcpBackend(Backend):
    cloud = "gcp"

    def __init__(self, ids):
        self.ids, self.calls = ids, []

    def nodes(self):
        return [Node(name=f"demo-{r}", instance_id=i, rank=r, market="spot") for r, i in enumerate(self.ids)]

    def apply(self, spec, market):
        self.calls.append(("apply", market))
        self.ids = [f"{i}-new" for i in self.ids]
        return self.nodes()

    def bootstrap(self, nodes):
        self.calls.append(("bootstrap", len(nodes)))

    def destroy(self, keep_disks=True):
        self.calls.append(("destroy", keep_disks))


class RestartingBackend(GcpBackend):
    """Terraform's re-apply of STOPped spot VMs: it starts them again under the same ids, at ``started[0]``
    (a list, so that a test can move the time on)."""

    def __init__(self, ids, fake, started):
        super().__init__(ids)
        self.fake, self.started = fake, started

    def apply(self, spec, market):
        self.calls.append(("apply", market))
        for inst in self.fake.instances:
            inst["status"], inst["lastStartTimestamp"] = "RUNNING", self.started[0]
        return self.nodes()


def test_watcher_records_preempted_stopped_and_deleted_nodes(fake, tmp_path):
    fake.instances = [instance(i, f"demo-{n}", "demo") for n, i in enumerate(("201", "202", "203", "204"))]
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = GcpBackend(["201", "202", "203", "204"])
    spec = cloud_spec("gcp", nodes=4)
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0))),
                      ScriptedPolicy(["spot"]), source=source(fake))
    watcher.start()
    assert watcher.tick().new_events == []

    fake.instances[1]["status"] = "TERMINATED"  # preempted, termination action STOP
    fake.operations.append(preempted_operation("7100", "202", "demo-1"))
    fake.instances[2]["status"] = "STOPPED"  # stopped by a person: a loss, not a preemption
    del fake.instances[3]  # preempted with termination action DELETE: simply gone
    result = watcher.tick()

    kinds = {}
    for e in ledger.events():
        kinds.setdefault(e["instance"], set()).add(e["kind"])
    assert kinds == {"202": {PREEMPTION}, "203": {INSTANCE_LOST}, "204": {INSTANCE_LOST}}
    missing = next(e for e in ledger.events() if e["instance"] == "204")
    assert missing["detail"]["state"] == "missing"
    assert result.action == "recover" and backend.calls[0] == ("apply", "spot")
    report = status_report(ledger, spec)
    assert (report["preemptions"], report["nodes_lost"]) == (1, 3)


def started_watcher(backend, ledger, fake):
    """A watcher of a 2-node GCP cluster on the fake, its clock on the fake's day (04:00), after its first tick."""
    spec = cloud_spec("gcp", nodes=2)
    clock = FakeDay("04:00")
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0)), clock=clock),
                      ScriptedPolicy(["spot"]), source=source(fake), clock=clock)
    watcher.start()
    watcher.tick()
    return watcher, clock


def test_preemption_of_an_instance_no_longer_listed_counts_as_a_preemption(fake, tmp_path):
    """Finding 10: a spot VM with termination action DELETE is gone from the listing by the time
    (or soon after) its preempted operation shows up; the operation must still be matched."""
    fake.instances = [instance(i, f"demo-{n}", "demo") for n, i in enumerate(("301", "302"))]
    ledger = Ledger(tmp_path / "ledger.sqlite")

    class ListedBackend(GcpBackend):
        def apply(self, spec, market):  # recreates the deleted VM under a new id, like Terraform
            self.calls.append(("apply", market))
            listed = {i["id"] for i in fake.instances}
            self.ids = [i if i in listed else f"{i}0" for i in self.ids]
            fake.instances = [instance(i, f"demo-{n}", "demo") for n, i in enumerate(self.ids)]
            return self.nodes()

    backend = ListedBackend(["301", "302"])
    watcher, clock = started_watcher(backend, ledger, fake)
    spec = watcher.spec
    del fake.instances[1]  # deleted after the preemption (05:00); its operation arrives a poll later
    clock.set("05:01")
    watcher.tick()
    assert status_report(ledger, spec)["nodes_lost"] == 1 and backend.ids == ["301", "3020"]
    fake.operations = [preempted_operation("7300", "302", "demo-1"), preempted_operation("7301", "999", "x-9")]
    clock.set("05:02")
    watcher.tick()
    report = status_report(ledger, spec)
    assert (report["preemptions"], report["nodes_lost"]) == (1, 1)
    assert {e["instance"] for e in ledger.events()} == {"302"}, "another cluster's operation is not recorded"


def test_a_stopped_spot_vm_restarted_under_the_same_id_is_watched_again(fake, tmp_path):
    """Finding 1 on GCP: termination action STOP + desired_status RUNNING: the re-apply restarts the
    preempted VM under the same id. It is up again (no endless recovery) and its next
    preemption is a new one; the old operation does not count for the new run."""
    fake.instances = [instance(i, f"demo-{n}", "demo") for n, i in enumerate(("401", "402"))]
    ledger = Ledger(tmp_path / "ledger.sqlite")

    restarted = ["2025-10-04T06:00:00.000-07:00"]
    backend = RestartingBackend(["401", "402"], fake, restarted)
    spec = cloud_spec("gcp", nodes=2)
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0))),
                      ScriptedPolicy(["spot"]), source=source(fake))
    watcher.start()
    watcher.tick()
    fake.instances[1]["status"] = "TERMINATED"
    fake.operations.append(preempted_operation("7400", "402", "demo-1"))  # 05:00
    assert watcher.tick().action == "recover"
    for _ in range(3):  # back up: nothing more to do, and the old operation is not a new loss
        result = watcher.tick()
        assert (result.action, result.nodes_up, result.nodes_lost) == (None, 2, 0)
    assert backend.calls.count(("apply", "spot")) == 1
    # preempted a second time, same VM
    fake.instances[1]["status"] = "TERMINATED"
    second = preempted_operation("7401", "402", "demo-1")
    second["insertTime"] = "2025-10-04T07:00:00.000-07:00"
    fake.operations.append(second)
    restarted[0] = "2025-10-04T07:05:00.000-07:00"
    result = watcher.tick()
    assert result.action == "recover" and backend.calls.count(("apply", "spot")) == 2
    report = status_report(ledger, spec)
    assert (report["preemptions"], report["nodes_lost"]) == (2, 2)
    runs = [n for n in ledger.all_nodes() if n.instance_id == "402"]
    assert [n.state for n in runs] == ["replaced", "replaced", "up"] and [n.lost_kind for n in runs] == \
        ["preemption", "preemption", None]


def test_a_late_operation_relabels_only_the_incarnation_that_ran_at_its_time(fake, tmp_path):
    """VM 402 is stopped by a person at 05:00 (a loss, no preemption), restarted under the same id at 05:01 and
    replaced by kit at 06:00 (a move: not lost). A preempted operation of 05:59, listed late, names that second
    run, which ended replaced: it is no fact about the first one (which stays a loss, not a preemption). One of
    04:30, when the first one ran, is."""
    fake.instances = [instance(i, f"demo-{n}", "demo") for n, i in enumerate(("401", "402"))]
    ledger = Ledger(tmp_path / "ledger.sqlite")

    backend = RestartingBackend(["401", "402"], fake, ["2025-10-04T05:01:00.000-07:00"])
    watcher, clock = started_watcher(backend, ledger, fake)
    spec = watcher.spec
    fake.instances[1].update(status="STOPPED", lastStopTimestamp="2025-10-04T05:00:00.000-07:00")
    clock.set("05:01")
    assert watcher.tick().action == "recover"
    clock.set("06:00")  # kit moves rank 1 to a new VM: the second run of 402 is replaced, not lost
    decision = ledger.begin_decision(policy="scripted", decision="spot", action="move", market_before="spot",
                                     market_after="spot", reason="a cheaper offer", now=clock())
    backend.ids, fake.instances = ["401", "403"], [fake.instances[0], instance("403", "demo-1", "demo")]
    moved = [n.to_dict() for n in backend.nodes()]
    attempt = ledger.start_apply(decision, "spot", clock())
    ledger.mark_applied(attempt, moved, market="spot", now=clock())
    ledger.finish_apply(attempt, decision, moved, "spot", clock())

    late = preempted_operation("7500", "402", "demo-1")
    late["insertTime"] = "2025-10-04T05:59:00.000-07:00"
    fake.operations.append(late)
    clock.set("06:30")
    watcher.tick()
    runs = [n for n in ledger.all_nodes() if n.instance_id == "402"]
    assert [(n.state, n.lost_kind) for n in runs] == [("replaced", INSTANCE_LOST), ("replaced", None)]
    assert status_report(ledger, spec)["preemptions"] == 0

    fake.operations.append(preempted_operation("7501", "402", "demo-1"))
    fake.operations[-1]["insertTime"] = "2025-10-04T04:30:00.000-07:00"
    clock.set("06:31")
    watcher.tick()
    assert [n.lost_kind for n in ledger.all_nodes() if n.instance_id == "402"] == [PREEMPTION, None]


def test_permission_denied_is_a_user_error_and_server_error_is_transient(fake):
    fake.fail_with = 403
    with pytest.raises(KitError, match="refused"):
        source(fake).poll()
    fake.fail_with = 500
    with pytest.raises(SourceError):
        source(fake).poll()


def test_a_job_that_moved_to_another_zone_is_listed_there_and_not_taken_for_lost(fake):
    """Instances and preemption operations are zonal: the source reads every zone of the spec, so the
    nodes of a job that moved to us-central1-c are running there (and their preemption is seen there),
    not "not listed by the cloud", which the watcher would count as lost on every poll."""
    from kit.clouds import get
    from kit.watch.sources.base import loss_events

    other = BASE.replace(ZONE, "us-central1-c")
    moved = [{**instance("301", "demo-0", "demo"), "zone": other},
             {**instance("302", "demo-1", "demo", status="TERMINATED"), "zone": other}]
    fake.instances = moved
    fake.operations = [{**preempted_operation("7301", "302", "demo-1"), "zone": other}]
    spec = cloud_spec("gcp", zones=[ZONE, "us-central1-c"], checkpoint_bucket="gs://demo-ckpt")
    built = get("gcp").event_source(spec, None)
    assert built.zones == (ZONE, "us-central1-c")
    poll = GcpSource("demo", PROJECT, built.zones, credentials=AnonymousCredentials(),
                     api_endpoint=fake.endpoint).poll()
    assert {s.instance: s.state for s in poll.instances} == {"301": RUNNING, "302": STOPPED}
    assert [(e.instance, e.kind) for e in poll.events] == [("302", PREEMPTION)]
    current = {"301": 0, "302": 1}
    # the one preempted in the new zone is a preemption; the other runs
    assert [(e.instance, e.kind) for e in loss_events(poll, current, "gcp", 0.0)] == [("302", PREEMPTION)]
    # what reading the first zone alone did: every moved node "not listed", i.e. lost
    first_only = source(fake).poll()
    assert {(e.instance, e.kind) for e in loss_events(first_only, current, "gcp", 0.0)} == {
        ("301", INSTANCE_LOST), ("302", INSTANCE_LOST)}


def test_a_vm_still_stopping_is_lost_once_it_has_stopped(fake):
    """GCE stops a preempted Spot VM over about 30 s (STOPPING, then TERMINATED); an apply in between would
    ask the API to start a VM that is still stopping, which it refuses. The loss is reported once the VM has
    stopped, as a preemption."""
    from kit.watch.sources.base import loss_events

    fake.instances = [instance("301", "demo-0", "demo"), instance("302", "demo-1", "demo", status="STOPPING")]
    current = {"301": 0, "302": 1}
    assert loss_events(source(fake).poll(), current, "gcp", 0.0) == []
    fake.instances[1]["status"] = "TERMINATED"
    fake.operations = [preempted_operation("7301", "302", "demo-1")]
    assert [(e.instance, e.kind) for e in loss_events(source(fake).poll(), current, "gcp", 0.0)] == [("302", PREEMPTION)]

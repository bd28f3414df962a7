"""DiskKeeper: the disks of a zone and shape the job left are kept ``disk.keep_left_hours``, then deleted,
only once a checkpoint at least as new is complete elsewhere; released disks stop billing."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from kit.errors import KitError
from kit.watch.disks import DiskKeeper
from kit.watch.ledger import Ledger
from tests.support.watch import cloud_spec, heartbeat

H = 3600.0
T0 = 1_000_000.0
SHAPE = "2xg5.xlarge"


class Sets:
    """A backend whose disk sets are named <zone>/<shape>, running in ``zone``."""

    cloud = "test"

    def __init__(self, zone: str, fail: bool = False):
        self.spec = SimpleNamespace(start_zone=zone, own_shape=SimpleNamespace(name=SHAPE))
        self.released: list[str] = []
        self.fail = fail

    def disk_set(self, zone, shape):
        return f"{zone}/{shape}" if zone and shape else None

    def release_disks(self, name):
        if self.fail:
            raise KitError("terraform destroy failed")
        self.released.append(name)

    def wall_time(self, t):
        return t


def nodes(zone: str, first: int) -> list[dict]:
    return [{"instance_id": f"i-{first + r}", "name": f"n{r}", "rank": r, "market": "spot", "zone": zone,
             "disk_id": f"vol-{zone}-{r}", "shape": SHAPE} for r in range(2)]


def moved(tmp_path, keep_left_hours=24.0) -> tuple[Ledger, object]:
    """Ran in zone a from T0, reached step 400 (checkpoint 400 on its disks); moved to zone b at T0 + 10 h."""
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.adopt_deployment(nodes("a", 0), "spot", "default", T0)
    ledger.record(heartbeat(400, 1000, written=T0 + 9 * H))
    decision = ledger.begin_decision(policy="default", decision="spot", action="recover", market_before="spot",
                                     market_after="spot", reason="moved", now=T0 + 10 * H)
    for i in ("i-0", "i-1"):
        ledger.mark_lost(i, T0 + 10 * H, "preemption")
    ledger.mark_applied(ledger.start_apply(decision, "spot", T0 + 10 * H), nodes("b", 10), market="spot", now=T0 + 10 * H)
    return ledger, cloud_spec("aws", disk={"size_gb": 100, "type": "gp3", "keep_left_hours": keep_left_hours})


def test_left_disks_are_kept_for_the_set_time_then_deleted_once_a_newer_checkpoint_is_elsewhere(tmp_path):
    ledger, spec = moved(tmp_path)
    backend = Sets("b")
    now = [T0 + 20 * H]
    keeper = DiskKeeper(backend, ledger, spec, clock=lambda: now[0])
    assert [(s.name, s.in_use) for s in keeper.sets()] == [("a/" + SHAPE, False), ("b/" + SHAPE, True)]
    assert keeper.tick() == [] and backend.released == [], "left 10 h ago: kept (the job may come back)"
    now[0] = T0 + 40 * H
    ledger.record(heartbeat(385, 1000, written=T0 + 10.5 * H))  # zone b resumed from the bucket's older copy (380)
    ledger.record(heartbeat(380 + 5, 1000, written=T0 + 11 * H, checkpoint_step=380))
    assert keeper.tick() == [] and backend.released == [], "zone a's disks hold step 400, the newest: kept"
    ledger.record(heartbeat(400 + 5, 1000, written=T0 + 12 * H, checkpoint_step=400))
    (released,) = keeper.tick()
    assert backend.released == ["a/" + SHAPE] and released.disk_ids == ("vol-a-0", "vol-a-1")
    assert keeper.tick() == [] and backend.released == ["a/" + SHAPE], "released once"
    assert [s.name for s in keeper.sets()] == ["b/" + SHAPE]



def test_the_left_zones_own_last_report_is_not_a_checkpoint_elsewhere(tmp_path):
    """A cloud dates a preemption when it begins (GCP's preempted operation, the nodes' ``until``) and the
    node then saves and reports within its notice: that report, written after the set was left, is of the
    set's own disk. It does not let the set go, whether its agent names the instance or the watcher pulled
    it (no instance: nothing but zone a's nodes was up when it was written, before b's apply)."""
    ledger, spec = moved(tmp_path)
    ledger.record(heartbeat(404, 1000, written=T0 + 10 * H - 60))
    stop_save = heartbeat(405, 1000, state="preempted", written=T0 + 10 * H + 20, checkpoint_step=405)
    ledger.record(replace(stop_save, instance="i-0"))  # zone a's node-0, by its agent
    backend = Sets("b")
    keeper = DiskKeeper(backend, ledger, spec, clock=lambda: T0 + 100 * H)
    assert keeper.tick() == [] and backend.released == [], "step 405 is on zone a's disks only"
    idle, spec = preempted_and_idle(tmp_path / "idle")
    idle.record(replace(stop_save, instance="trainer", source="local"))  # pulled by the watcher: no instance
    assert DiskKeeper(Sets("b"), idle, spec, clock=lambda: T0 + 100 * H).tick() == []
    ledger.record(heartbeat(405 + 5, 1000, written=T0 + 11 * H, checkpoint_step=405))  # b resumed from the bucket
    assert [s.name for s in keeper.tick()] == ["a/" + SHAPE] and backend.released == ["a/" + SHAPE]


def test_a_copy_elsewhere_must_be_as_new_as_the_left_sets_own_stop_save(tmp_path):
    """Zone a's node saved step 405 within its notice, after the preemption's date; b restored the bucket's
    400 and saved 404 (a checkpoint by time): a holds the newer one until b has 405."""
    ledger, spec = moved(tmp_path)
    ledger.record(replace(heartbeat(405, 1000, state="preempted", written=T0 + 10 * H + 20, checkpoint_step=405),
                          instance="i-0"))
    ledger.record(replace(heartbeat(404, 1000, written=T0 + 11 * H, checkpoint_step=404), instance="i-10"))
    backend = Sets("b")
    keeper = DiskKeeper(backend, ledger, spec, clock=lambda: T0 + 100 * H)
    assert keeper.tick() == [] and backend.released == []
    ledger.record(replace(heartbeat(405, 1000, written=T0 + 12 * H, checkpoint_step=405), instance="i-10"))
    assert [s.name for s in keeper.tick()] == ["a/" + SHAPE]


def preempted_and_idle(tmp_path) -> tuple[Ledger, object]:
    """Ran in zone a from T0 and was preempted at T0 + 10 h; nothing has run since."""
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.adopt_deployment(nodes("a", 0), "spot", "default", T0)
    ledger.record(heartbeat(400, 1000, written=T0 + 9 * H, checkpoint_step=400))
    for i in ("i-0", "i-1"):
        ledger.mark_lost(i, T0 + 10 * H, "preemption")
    return ledger, cloud_spec("aws", disk={"size_gb": 100, "type": "gp3", "keep_left_hours": 24.0})


def test_released_disks_stop_billing_and_say_so(tmp_path):
    from kit.watch.status import disk_report

    ledger, spec = moved(tmp_path)
    ledger.record(heartbeat(400 + 5, 1000, written=T0 + 12 * H, checkpoint_step=400))
    DiskKeeper(Sets("b"), ledger, spec, clock=lambda: T0 + 34 * H).tick()
    report = disk_report(ledger, spec, T0 + 100 * H)
    by_id = {d["disk_id"]: d for d in report["disks"]}
    assert by_id["vol-a-0"]["released"] == T0 + 34 * H and by_id["vol-a-0"]["hours"] == pytest.approx(34.0)
    assert by_id["vol-a-0"]["idle_hours"] == pytest.approx(24.0)
    assert by_id["vol-b-0"]["released"] is None and by_id["vol-b-0"]["hours"] == pytest.approx(90.0)


def test_null_keeps_them_until_the_job_ends_and_a_failed_delete_is_tried_again(tmp_path):
    ledger, spec = moved(tmp_path, keep_left_hours=None)
    ledger.record(heartbeat(400 + 5, 1000, written=T0 + 12 * H, checkpoint_step=400))
    backend = Sets("b")
    assert DiskKeeper(backend, ledger, spec, clock=lambda: T0 + 1000 * H).tick() == []
    _, spec = moved(tmp_path / "x", keep_left_hours=0)
    failing = Sets("b", fail=True)
    keeper = DiskKeeper(failing, ledger, spec, clock=lambda: T0 + 10 * H)
    assert keeper.tick() == [] and not ledger.events(kinds=("disks-released",)), "not recorded as deleted"
    failing.fail = False
    assert [s.name for s in keeper.tick()] == ["a/" + SHAPE]


def test_the_running_set_is_never_released(tmp_path):
    """All nodes lost in the zone the job runs in (waiting for capacity there): its disks stay."""
    ledger, spec = moved(tmp_path, keep_left_hours=0)
    for i in ("i-10", "i-11"):
        ledger.mark_lost(i, T0 + 11 * H, "preemption")
    # b's node-0 saved step 500 within its notice (after the cloud dated its preemption): on b's disks
    ledger.record(replace(heartbeat(500, 1000, state="preempted", written=T0 + 11 * H + 20, checkpoint_step=500),
                          instance="i-10"))
    backend = Sets("b")
    DiskKeeper(backend, ledger, spec, clock=lambda: T0 + 100 * H).tick()
    assert backend.released == ["a/" + SHAPE]


def test_keep_left_hours_is_validated():
    from kit.errors import InputError

    with pytest.raises((InputError, ValueError), match="keep_left_hours"):
        cloud_spec("aws", disk={"size_gb": 100, "keep_left_hours": -1})


def test_a_lifetime_ends_at_the_first_deletion_after_a_use_and_starts_again_at_the_next_use():
    """Used 0-10 h and 35-40 h, deleted at 30 h and (a second record) 32 h and at 45 h: existed 0-30 h and
    35-45 h, idle 10-30 h and 40-45 h, gone since 45 h; overlapping uses are busy once; still in use at
    ``now``: it exists until then and is not gone, whatever was deleted before."""
    from kit.watch.disks import LEFT, Release, lifetime

    def gone(hour: float) -> Release:
        return Release(hour * H, "a", frozenset({"d"}), LEFT)

    life = lifetime([(35 * H, 40 * H), (0, 10 * H), (2 * H, 8 * H)], [gone(45), gone(32), gone(30)], 50 * H)
    assert life.existed == ((0, 30 * H), (35 * H, 45 * H))
    assert life.idle == ((10 * H, 30 * H), (40 * H, 45 * H))
    assert (life.hours, life.idle_hours, life.deleted) == (40.0, 25.0, gone(45))
    running = lifetime([(0, 10 * H), (35 * H, 50 * H)], [gone(30)], 50 * H)
    assert running.existed == ((0, 30 * H), (35 * H, 50 * H)) and running.idle == ((10 * H, 30 * H),)
    assert running.deleted is None
    assert lifetime([], [gone(1)], 50 * H).hours == 0.0

"""Cost accounting and the ledger view (`kit status`), plus the local node-state source."""

from __future__ import annotations

import dataclasses
import io
import json
import random

import pytest
from rich.console import Console

from kit.errors import KitError
from kit.spec import SpecBase
from kit.watch import commands
from kit.watch.acting import Actor, Backoff
from kit.watch.ledger import Ledger
from kit.watch.sources.base import RUNNING, TERMINATED, SourceError
from kit.watch.sources.local import LocalSource
from kit.watch.status import ledger_now, render_status, route, status_report
from kit.watch.watcher import Watcher
from tests.support.watch import (
    BackendSource,
    RecordingBackend,
    ScriptedPolicy,
    cloud_spec,
    heartbeat,
    local_spec,
)

HOUR = 3600.0


class Clock:
    t = 1_000_000.0

    def __call__(self):
        return self.t


def run_scenario(tmp_path, spec: SpecBase | None = None):
    """2 spot nodes for 1 h, node 1 preempted and replaced, then a switch to on-demand for 0.5 h."""
    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = RecordingBackend(2)
    spec = spec or local_spec()
    policy = ScriptedPolicy(["spot", "on-demand"])  # first call: at the first heartbeat
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(0)), clock=clock),
                      policy, source=BackendSource(backend), clock=clock)
    watcher.start()
    watcher.tick()  # launch spot at t0
    ledger.record(heartbeat(100, 1000, 1.8))
    clock.t += HOUR
    backend.preempt(1)
    watcher.tick()  # node 1 lost at t0+1h (source time = now), recovered at once
    watcher.tick()  # policy: on-demand -> switch
    clock.t += 0.5 * HOUR
    return ledger, spec, clock


def test_cost_is_node_hours_per_market_times_price(tmp_path):
    ledger, spec, clock = run_scenario(tmp_path)
    report = status_report(ledger, spec, now=clock.t)
    assert report["spot_hours"] == pytest.approx(2.0)  # 2 nodes x 1 h (the replacement lived 0 s)
    assert report["on_demand_hours"] == pytest.approx(1.0)  # 2 nodes x 0.5 h
    assert report["cost"] == pytest.approx(2.0 * 1.0 + 1.0 * 4.0)
    # The same job on on-demand: 2 nodes x $4 x (100 steps x 1.8 s + one 0.2 h changeover) — not
    # the node-hours actually held (3.0 h, preemption and switch included) x $4.
    assert report["compute_hours"] == pytest.approx(100 * 1.8 / HOUR)
    assert report["startup_measured"] is False  # the heartbeat's time is before the launch: spec's d
    assert report["cost_all_on_demand"] == pytest.approx(2 * 4.0 * (100 * 1.8 / HOUR + 0.2))
    assert report["market"] == "on-demand" and report["market_switches"] == 1
    assert report["preemptions"] == report["interruptions"] == report["nodes_lost"] == 1
    assert report["progress"]["step"] == 100 and report["progress"]["fraction"] == pytest.approx(0.1)
    assert [d["action"] for d in report["decisions"]] == ["switch", "recover", "launch"]
    out = io.StringIO()
    render_status(report, Console(file=out, width=140))
    text = out.getvalue()
    assert "market: on-demand" in text and "$6.00" in text and "interruptions: 1  preemptions: 1" in text and "$2.00" in text
    assert report["can_move"] is False and "a move copies" not in text  # one zone, one shape


def test_status_says_what_a_move_would_copy(tmp_path):
    """A job that may move: the checkpoint size the capacity search charges a move, and where it comes from
    (the simulator's default before a checkpoint; then the trainer's newest; the spec's overrides both)."""
    def spec_with(**policy):
        return local_spec(zones=["a", "b"], policy=policy)

    ledger = Ledger(tmp_path / "ledger.sqlite")

    def facts(spec) -> tuple:
        report = status_report(ledger, spec, now=0.0)
        out = io.StringIO()
        render_status(report, Console(file=out, width=200))
        line = next(x for x in out.getvalue().splitlines() if x.startswith("a move copies"))
        return report["checkpoint_gb"], report["checkpoint_gb_source"], line

    assert facts(spec_with()) == (50.0, "default", "a move copies the checkpoint: 50 GB (default) at 10 Gbit/s")
    ledger.record(heartbeat(10, 100, written=1.0, checkpoint_step=10, checkpoint_bytes=1_039_187_307))
    assert facts(spec_with())[:2] == (1.039, "measured")
    assert facts(spec_with(checkpoint_gb=200, transfer_gbps=2)) == (
        200.0, "spec", "a move copies the checkpoint: 200 GB (spec) at 2 Gbit/s")


def test_status_prints_names_and_cloud_errors_as_they_are_not_as_markup(tmp_path):
    """A cloud's error text, an instance id or a zone may hold "[...]": rich must not read it as markup
    (it dropped "[red]" and raised MarkupError on a closing "[/x]")."""
    ledger, spec, clock = run_scenario(tmp_path)
    report = status_report(ledger, spec, now=clock.t)
    report["decisions"][0]["error"] = "quota [/x] exceeded [red]now"
    report["nodes"][0]["instance_id"] = "i-[bold]1"
    report["offers"] = ["[/zone]/2xlocal/spot"]
    out = io.StringIO()
    render_status(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "quota [/x] exceeded [red]now" in text and "i-[bold]1" in text and "[/zone]/2xlocal/spot" in text, text


def test_all_on_demand_uses_the_measured_first_start_up(tmp_path):
    """d of N x Q x (d + C0) is the first launch as measured when a heartbeat follows it: launched
    at t0, the first heartbeat at t0 + 0.5 h says step 100 at 1.8 s/step, so step 0 ran at
    t0 + 0.45 h."""
    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = RecordingBackend(2)
    spec = local_spec()
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, clock=clock), ScriptedPolicy(["spot"]),
                      source=BackendSource(backend), clock=clock)
    watcher.start()
    t0 = clock.t
    watcher.tick()  # launch
    beat = heartbeat(100, 1000, 1.8)
    ledger.record(dataclasses.replace(beat, time=t0 + 0.5 * HOUR))
    clock.t += HOUR
    report = status_report(ledger, spec, now=clock.t)
    assert report["startup_measured"] is True and report["startup_hours"] == pytest.approx(0.45)
    assert report["cost_all_on_demand"] == pytest.approx(2 * 4.0 * (0.45 + 100 * 1.8 / HOUR))


def test_unknown_price_leaves_cost_unknown(tmp_path):
    # an instance type outside the catalog, with only its on-demand price said
    unknown = cloud_spec("aws", instance_type="x9.custom", gpus_per_node=1, prices={"on_demand_per_hour": 4.0})
    ledger, spec, clock = run_scenario(tmp_path, unknown)
    report = status_report(ledger, spec, now=clock.t)
    assert report["cost"] is None and report["cost_all_on_demand"] == pytest.approx(2.0)


def test_kit_status_json_and_missing_ledger(tmp_path, monkeypatch, capsys):
    _, spec, _ = run_scenario(tmp_path)
    monkeypatch.setattr(commands, "_load", lambda path: (spec, tmp_path))
    commands.run_status(tmp_path / "cluster.yaml", as_json=True)
    report = json.loads(capsys.readouterr().out)
    assert report["cluster"] == "demo" and report["preemptions"] == 1
    monkeypatch.setattr(commands, "_load", lambda path: (spec, tmp_path / "elsewhere"))
    with pytest.raises(KitError, match="no ledger"):
        commands.run_status(tmp_path / "cluster.yaml", as_json=False)


def test_status_of_a_running_local_job_is_read_on_the_ledger_s_compressed_clock(tmp_path, monkeypatch, capsys):
    """The local backend's times are trace times (kit.clock.VirtualClock: origin + wall seconds x
    scale). `kit status` of a running local job read them against the wall clock: 0.01 h of running and
    $0.04 at step 341 of 400, where the job had run 1.3 trace hours. Here the clock started at the
    scenario's first tick and has run the scenario's 1.5 h since: status now is status at its end."""
    import time

    from kit.watch.ledger import WatcherLock
    from kit.watch.session import LOCK_FILE

    ledger, spec, clock = run_scenario(tmp_path)
    t0, wall = Clock.t, 1_900_000_000.0
    ledger.keep_clock(t0, (clock.t - t0) / (wall - t0), 0.0)  # as LocalBackend.attach keeps it
    monkeypatch.setattr(time, "time", lambda: wall)
    monkeypatch.setattr(commands, "_load", lambda path: (spec, tmp_path))
    with WatcherLock(tmp_path / LOCK_FILE):  # the job runs: a kit holds its lock
        commands.run_status(tmp_path / "cluster.yaml", as_json=True)
    report = json.loads(capsys.readouterr().out)
    assert report.pop("stopped_with_kit") is False and report["wall_hours"] == pytest.approx(1.5)
    assert report == json.loads(json.dumps(status_report(ledger, spec, now=clock.t)))


def test_status_of_local_nodes_left_up_by_a_killed_kit_stops_at_the_ledger_s_last_record(tmp_path, monkeypatch, capsys):
    """kit train SIGKILLed: its local nodes died with it, but nothing recorded their end, so `kit status` charged
    them on until kit ran again. With no kit holding the cluster's lock, a local job's figures stand as of the
    ledger's last record, and status says why; while a kit runs it, or for a cloud's nodes (they run on and are
    billed), status counts to now."""
    import time

    from kit.watch.ledger import WatcherLock
    from kit.watch.session import LOCK_FILE

    ledger, spec, clock = run_scenario(tmp_path)
    last = ledger.last_record()
    assert last is not None and last < clock.t and ledger.nodes(("up",))
    monkeypatch.setattr(time, "time", lambda: clock.t + 5 * HOUR)
    monkeypatch.setattr(commands, "_load", lambda path: (spec, tmp_path))

    def status() -> dict:
        commands.run_status(tmp_path / "cluster.yaml", as_json=True)
        return json.loads(capsys.readouterr().out)

    orphaned = status()
    assert orphaned["stopped_with_kit"] is True
    assert orphaned["cost"] == pytest.approx(status_report(ledger, spec, now=last)["cost"])
    with WatcherLock(tmp_path / LOCK_FILE):  # a kit runs the job: its nodes are up, now
        running = status()
    assert running["stopped_with_kit"] is False and running["cost"] > orphaned["cost"]
    monkeypatch.setattr(commands, "_load", lambda path: (cloud_spec("aws"), tmp_path))
    assert status()["stopped_with_kit"] is False
    monkeypatch.setattr(commands, "_load", lambda path: (spec, tmp_path))
    commands.run_status(tmp_path / "cluster.yaml", as_json=False)
    assert "kit is not running this job" in capsys.readouterr().out


def test_a_ledger_clock_without_its_scale_reads_as_the_wall_clock(tmp_path, monkeypatch):
    """A version-6 ledger kept the clock's origin only: its times cannot be read again, so status uses the
    wall clock (as before) instead of guessing a scale; the next attach keeps the scale."""
    import sqlite3
    import time

    Ledger(tmp_path / "l.sqlite").keep_clock(100.0, 150.0, 0.0)
    db = sqlite3.connect(tmp_path / "l.sqlite")
    db.executescript("ALTER TABLE run DROP COLUMN clock_scale; ALTER TABLE run DROP COLUMN clock_offset;"
                     " PRAGMA user_version = 6;")
    db.close()
    ledger = Ledger(tmp_path / "l.sqlite")
    assert ledger.clock() == (100.0, None, 0.0)
    monkeypatch.setattr(time, "time", lambda: 200.0)
    assert ledger_now(ledger) == 200.0
    ledger.keep_clock(100.0, 60.0, 0.0)
    assert ledger_now(ledger) == 100.0 + 100.0 * 60.0


def test_local_source_reads_node_state_files(tmp_path):
    nodes = LocalSource.state_dir_for(tmp_path)
    nodes.mkdir(parents=True)
    (nodes / "node-0.json").write_text(json.dumps({"name": "node-0", "instance_id": "node-0-1", "rank": 0,
                                                   "market": "spot", "state": "running", "time": 5.0}))
    (nodes / "node-1.json").write_text(json.dumps({"name": "node-1", "instance_id": "node-1-2", "rank": 1,
                                                   "market": "spot", "state": "preempted",
                                                   "reason": "injected", "time": 9.0}))
    (nodes / "node-3.json").write_text(json.dumps({"name": "node-3", "instance_id": "node-3-4", "rank": 3,
                                                   "market": "spot", "state": "stopped", "reason": "kit exited",
                                                   "time": 11.0}))
    statuses = {s.instance: s for s in LocalSource("demo", nodes).poll().instances}
    assert statuses["node-0-1"].state == RUNNING and not statuses["node-0-1"].preempted
    assert statuses["node-1-2"].state == TERMINATED and statuses["node-1-2"].preempted
    # only kit stops a local node (interrupted, or killed with it): no news about the market
    assert [s.instance for s in statuses.values() if s.by_kit] == ["node-3-4"]
    assert not statuses["node-3-4"].preempted
    (nodes / "node-2.json").write_text("{broken")
    with pytest.raises(SourceError, match="node-2.json"):
        LocalSource("demo", nodes).poll()


def test_bad_listen_address_is_input_error():
    from kit.errors import InputError
    from kit.watch.session import parse_listen

    assert parse_listen("0.0.0.0:8787") == ("0.0.0.0", 8787)
    with pytest.raises(InputError, match="HOST:PORT"):
        parse_listen("localhost")


def test_kit_watch_runs_server_and_loop_until_the_trainer_reports_done(tmp_path, monkeypatch):
    """`kit watch` wiring: lock, ledger, token, HTTP endpoint, adoption, policy ticks, exit on done."""
    import threading
    import urllib.request

    import kit.backends.cloud
    import kit.watch.session
    import kit.watch.sources
    from kit.watch.server import cluster_token, node_token

    spec = local_spec()
    backend = RecordingBackend(2)
    backend.apply(spec, "spot")
    backend.calls.clear()
    policy = ScriptedPolicy(["spot"])
    monkeypatch.setattr(commands, "_load", lambda path: (spec, tmp_path))
    monkeypatch.setattr(kit.watch.session, "make_policy_for", lambda s: policy)
    monkeypatch.setattr(kit.backends.cloud, "backend_for", lambda s, d, **kw: backend)
    monkeypatch.setattr(kit.watch.sources, "source_for", lambda s, d: BackendSource(backend))
    port = __import__("socket").socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    codes = []
    # A long interval: the loop must be woken by the agent's reports, not by its timer.
    runner = threading.Thread(target=lambda: codes.append(commands.run_watch(
        tmp_path / "cluster.yaml", interval_s=60, listen=f"127.0.0.1:{free}", advertise_url=None, once=False)),
        daemon=True)
    runner.start()

    def post(body):
        request = urllib.request.Request(
            f"http://127.0.0.1:{free}/v1/clusters/demo/events", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {node_token(cluster_token(tmp_path), body['instance'])}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status

    beat = {"kind": "progress", "instance": "i-0001", "node_rank": 0, "time": 1.0, "cloud": "local",
            "detail": {"state": "running"}, "step": 5, "total_steps": 10, "step_time_s": 0.5}
    for _ in range(100):  # the endpoint comes up with the watcher
        try:
            assert post(beat) == 202
            break
        except OSError:
            __import__("time").sleep(0.05)
    assert post({**beat, "kind": "preemption-notice", "detail": {"action": "terminate"}}) == 202  # wakes
    for _ in range(200):
        if policy.seen:
            break
        __import__("time").sleep(0.05)
    assert policy.seen, "a preemption notice did not wake the watch loop"
    assert post({**beat, "step": 10, "detail": {"state": "done"}}) == 202  # wakes, and the loop ends
    runner.join(timeout=20)
    assert not runner.is_alive() and codes == [0]
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert policy.seen and policy.seen[0].job_h == pytest.approx(10 * 0.5 / 3600)
    assert [d.action for d in ledger.decisions()] == ["launch"]  # adopted, nothing else to do
    assert backend.of("apply") == []


def test_every_data_disk_is_listed_with_its_zone_size_idle_time_and_cost(tmp_path):
    """Two gp3 volumes of 200 GB (AWS list price $0.08/GB-month) for 73 hours: each costs
    200 x 0.08 x 73 / 730 = $1.60 whether a node ran on it or not (the disks of a zone the job left
    sit idle and still bill); an unknown disk type's price leaves the cost unknown."""
    from kit.watch.ledger import Ledger
    from kit.watch.status import disk_report

    spec = cloud_spec("aws", disk={"size_gb": 200, "type": "gp3"})
    ledger = Ledger(tmp_path / "l.sqlite")
    t0 = 1_000_000.0
    ledger.adopt_deployment([{"instance_id": f"i-{r}", "name": f"n{r}", "rank": r, "market": "spot",
                              "zone": "us-east-1a", "disk_id": f"vol-{r}"} for r in range(2)], "spot", "default", t0)
    ledger.mark_lost("i-1", t0 + 3600 * 10, "preemption")  # node 1 gone after 10 h: its volume idles from then
    report = disk_report(ledger, spec, t0 + 3600 * 73)
    assert [(d["disk_id"], d["zone"], d["size_gb"]) for d in report["disks"]] == [
        ("vol-0", "us-east-1a", 200), ("vol-1", "us-east-1a", 200)]
    assert [d["cost"] for d in report["disks"]] == [pytest.approx(1.6), pytest.approx(1.6)]
    assert [d["idle_hours"] for d in report["disks"]] == [0.0, pytest.approx(63.0)]
    assert report["disk_cost"] == pytest.approx(3.2)
    hyper = cloud_spec("gcp", instance_type="a3-highgpu-8g", disk={"size_gb": 100, "type": "hyperdisk-balanced"})
    assert disk_report(ledger, hyper, t0 + 3600)["disk_cost"] is None


def _runs(tmp_path, runs: list[tuple[float, str]], released: list[tuple[float, str, str]]) -> Ledger:
    """One node per run (hour, zone) until the next, on its zone's disk (the same id when made again, as GCP
    names disks: disk-<zone>); each (hour, zone, why) a deletion of that zone's disk."""
    from kit.watch.events import Event

    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.job_started(1_000_000.0)
    for hour, zone in runs:
        now = 1_000_000.0 + hour * HOUR
        decision = ledger.begin_decision(policy="default", decision="spot", action="move",
                                         market_before="spot", market_after="spot", reason="moved", now=now)
        node = {"instance_id": f"i-{hour:g}", "name": "n0", "rank": 0, "market": "spot", "zone": zone,
                "disk_id": f"disk-{zone}", "shape": "2xg5.xlarge"}
        ledger.mark_applied(ledger.start_apply(decision, "spot", now), [node], market="spot", now=now)
    for hour, zone, why in released:
        ledger.record(Event(kind="disks-released", instance=f"disks-{zone}", time=1_000_000.0 + hour * HOUR,
                            source="watcher", detail={"zone": zone, "disks": [f"disk-{zone}"], "why": why},
                            dedup_key=f"{zone}:{hour}"))
    return ledger


def test_a_disk_deleted_and_made_again_is_not_billed_or_idle_in_between(tmp_path):
    """In us-east-1a 0-10 h and 35-40 h, its disk deleted at 30 h and made again at 35 h (the plot's case,
    tests/unit/kit/test_report.py): it existed 0-30 h and 35-50 h (45 h, billed) and sat idle 10-30 h and
    40-50 h (30 h), not 50 h and 10 h (billed through the gap, idle only since the last use)."""
    from kit.watch.status import disk_report

    ledger = _runs(tmp_path, [(0, "us-east-1a"), (10, "us-east-1b"), (35, "us-east-1a"), (40, "us-east-1b")],
                   released=[(30, "us-east-1a", "zone left")])
    spec = cloud_spec("aws", disk={"size_gb": 730, "type": "gp3"})  # $0.08/GB-month: $0.08 an hour
    disk = {d["zone"]: d for d in disk_report(ledger, spec, 1_000_000.0 + 50 * HOUR)["disks"]}["us-east-1a"]
    assert (disk["hours"], disk["idle_hours"]) == (pytest.approx(45.0), pytest.approx(30.0))
    assert disk["cost"] == pytest.approx(45 * 0.08) and disk["released"] is None


def test_a_disk_deleted_when_left_and_again_when_the_job_ended_is_billed_until_the_first(tmp_path):
    """The watcher deleted us-east-1a's disk at 30 h; at the job's end kit records every disk it used as
    deleted with the job (kit.watch.disks.DiskKeeper.record_deleted_with_the_job), that one too: it was
    gone from 30 h, for the reason then."""
    from kit.watch.status import disk_report

    ledger = _runs(tmp_path, [(0, "us-east-1a"), (10, "us-east-1b")],
                   released=[(30, "us-east-1a", "zone left"), (60, "us-east-1a", "job ended")])
    disk = disk_report(ledger, cloud_spec("aws"), 1_000_000.0 + 70 * HOUR)["disks"][0]
    assert (disk["hours"], disk["idle_hours"]) == (pytest.approx(30.0), pytest.approx(20.0))
    assert (disk["released"], disk["released_why"]) == (1_000_000.0 + 30 * HOUR, "zone left")


def test_the_route_shows_a_relaunch_on_the_same_offer_once():
    offers = ["a/2xlocal/spot", "a/2xlocal/spot", "b/1xlocal/spot", "a/2xlocal/spot"]
    assert route(offers) == "a/2xlocal/spot -> b/1xlocal/spot -> a/2xlocal/spot"
    assert route([]) == ""


def _one_node(ledger, *, shape, price, since=1000.0):
    ledger.adopt_deployment([{"name": "n0", "instance_id": "i-1", "rank": 0, "market": "spot", "zone": "z",
                              "shape": shape, "price": price}], "spot", "default", since)


def test_a_node_of_an_offer_without_a_known_price_leaves_the_cost_unknown(tmp_path):
    """The actor records a node's shape and no price where kit knew none for its offer; the cost took the spec's
    own price for it (another type, another zone), as for a row of an older ledger."""
    from kit.watch.status import node_cost

    ledger = Ledger(tmp_path / "l.sqlite")
    _one_node(ledger, shape="8xbig", price=None)
    assert node_cost(ledger, 1000.0 + HOUR, {"spot": 1.0, "on-demand": 4.0}) is None
    older = Ledger(tmp_path / "older.sqlite")
    _one_node(older, shape=None, price=None)  # no offer recorded: its market's price
    assert node_cost(older, 1000.0 + HOUR, {"spot": 1.0, "on-demand": 4.0}) == pytest.approx(1.0)


def test_a_loss_dated_before_its_incarnation_began_is_dated_when_it_was_seen(tmp_path):
    """A stale cloud timestamp (a restarted instance's previous stop) ended the incarnation before it
    began: clamped to zero hours, it cost nothing however long it had run. Such a time is not this
    incarnation's loss: it is dated when the poll saw it gone, and the ledger never ends a row before
    its start."""
    from kit.watch.sources.base import STOPPED, InstanceStatus, Poll, loss_events

    poll = Poll([InstanceStatus("i-1", STOPPED, "spot", preempted=True, time=4000.0)])
    (event,) = loss_events(poll, {"i-1": 0}, "gcp", 9000.0, since={"i-1": 5000.0})
    assert event.time == 9000.0
    ledger = Ledger(tmp_path / "l.sqlite")
    _one_node(ledger, shape=None, price=None, since=5000.0)
    assert ledger.mark_lost("i-1", 4000.0, "preemption")
    (row,) = ledger.all_nodes()
    assert row.until == row.since == 5000.0

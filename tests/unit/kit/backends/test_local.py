"""LocalBackend and the injector with a fake node command (fast: no torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.backends.base import CapacityError
from kit.backends.local import LocalBackend
from kit.clock import VirtualClock
from kit.clouds.local import LocalSpec
from kit.errors import InputError, KitError
from kit.local.injector import Injector
from kit.watch.sources.local import LocalSource
from tests.support.watch import local_spec

FAKE_NODE = r"""
import json, os, sys, time, pathlib
rank, endpoint, stop, progress, out = sys.argv[1:6]
pathlib.Path(out).write_text(json.dumps({"rank": int(rank), "endpoint": endpoint, "pid": os.getpid()}))
while not os.path.exists(stop):
    time.sleep(0.05)
pathlib.Path(progress).write_text(json.dumps({"step": 1, "total_steps": 2, "state": "preempted", "time": time.time()}))
sys.exit(75)
"""


def fake_spec(nodes: int = 2) -> LocalSpec:
    return local_spec(name="t", nodes=nodes)


@pytest.fixture
def backend(tmp_path):
    script = tmp_path / "node.py"
    script.write_text(FAKE_NODE)

    def command(b, rank, endpoint):
        return [sys.executable, str(script), str(rank), endpoint, str(b.stop_file(rank)), str(b.progress_file(rank)),
                str(b.node_dir(rank) / "started.json")]

    b = LocalBackend(fake_spec(), tmp_path / "deploy", node_command=command, use_agent=False)
    yield b
    b.kill_all()


def started(b, rank, timeout=10):
    path = b.node_dir(rank) / "started.json"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"node {rank} never started")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_apply_bootstrap_recover_switch_destroy(backend):
    nodes = backend.apply(backend.spec, "spot")
    assert [n.rank for n in nodes] == [0, 1] and all(n.market == "spot" for n in nodes)
    ids = [n.instance_id for n in nodes]
    assert len(set(ids)) == 2
    polled = LocalSource("t", LocalSource.state_dir_for(backend.deploy_dir)).poll()
    assert sorted(i.instance for i in polled.instances) == sorted(ids)
    backend.bootstrap(nodes)
    first = [started(backend, r) for r in (0, 1)]
    assert first[0]["endpoint"] == first[1]["endpoint"] and first[0]["endpoint"].startswith("127.0.0.1:")
    assert backend.disk_dir(0).is_dir() and backend.disk_dir(1).is_dir()
    # idempotent: a second apply on the same market keeps both instances
    assert [n.instance_id for n in backend.apply(backend.spec, "spot")] == ids
    # node 0 preempted: state file says so, processes are gone, apply recreates only node 0
    (backend.disk_dir(0) / "ckpt").mkdir()
    backend.mark(0, "preempted", "injected preemption")
    assert backend.read_state(0)["state"] == "preempted"
    assert not alive(first[0]["pid"])
    polled = LocalSource("t", backend.state_dir()).poll()
    assert any(i.preempted and i.instance == ids[0] for i in polled.instances)
    again = backend.apply(backend.spec, "spot")
    assert again[0].instance_id not in ids and again[1].instance_id == ids[1]
    assert (backend.disk_dir(0) / "ckpt").is_dir(), "the data disk is reused"
    backend.bootstrap(again)
    second = [started(backend, r) for r in (0, 1)]
    assert second[0]["endpoint"] != first[0]["endpoint"], "a new master gets a new endpoint"
    assert not alive(first[1]["pid"]), "bootstrap restarts every node"
    # switch: every instance replaced
    switched = backend.apply(backend.spec, "on-demand")
    assert all(n.market == "on-demand" for n in switched)
    assert not {n.instance_id for n in switched} & {n.instance_id for n in again}
    backend.destroy(keep_disks=True)
    assert backend.nodes() == [] and backend.disk_dir(0).is_dir()
    backend.destroy(keep_disks=False)
    assert not backend.disk_dir(0).exists()


def test_bootstrap_refuses_missing_node(backend):
    backend.apply(backend.spec, "spot")
    backend.mark(1, "preempted")
    with pytest.raises(Exception, match="not running"):
        backend.bootstrap(backend.nodes())


def test_capacity_error_and_stop_all(backend):
    backend.spot_available = lambda: False
    with pytest.raises(CapacityError):
        backend.apply(backend.spec, "spot")
    assert backend.nodes() == []
    nodes = backend.apply(backend.spec, "on-demand")  # on-demand is not limited by the trace
    backend.bootstrap(nodes)
    pids = [started(backend, r)["pid"] for r in (0, 1)]
    backend.stop_all()
    assert not any(alive(p) for p in pids)
    assert {backend.read_state(r)["state"] for r in (0, 1)} == {"stopped"}


def test_stop_all_with_grace_lets_the_trainers_save(backend):
    nodes = backend.apply(backend.spec, "on-demand")
    backend.bootstrap(nodes)
    for rank in (0, 1):
        started(backend, rank)
    backend.stop_all(grace_s=10)
    # the fake node exits 75 only once it saw its stop file: a kill would leave no progress record
    for rank in (0, 1):
        assert json.loads(backend.progress_file(rank).read_text())["state"] == "preempted"
    assert {backend.read_state(r)["state"] for r in (0, 1)} == {"stopped"}


def test_market_switch_lets_live_trainers_save_before_replacing_them(tmp_path):
    """Like a cloud instance that terraform replaces (it shuts down, the unit stops, the trainer
    saves), a local node on the old market is asked to save before it is killed."""
    script = tmp_path / "node.py"
    script.write_text(r"""
import os, sys, time, pathlib
stop, disk = sys.argv[1:3]
pathlib.Path(disk, "up").write_text("")
while not os.path.exists(stop):
    time.sleep(0.05)
pathlib.Path(disk, "saved").write_text(open(stop).read())
sys.exit(75)
""")
    b = LocalBackend(fake_spec(), tmp_path / "deploy", use_agent=False,
                     node_command=lambda b, r, e: [sys.executable, str(script), str(b.stop_file(r)), str(b.disk_dir(r))])
    try:
        b.bootstrap(b.apply(b.spec, "on-demand"))
        for rank in (0, 1):
            deadline = time.time() + 10
            while not (b.disk_dir(rank) / "up").exists() and time.time() < deadline:
                time.sleep(0.05)
        b.spot_available = lambda: False
        with pytest.raises(CapacityError):  # a failed launch touches nothing
            b.apply(b.spec, "spot")
        assert not any((b.disk_dir(r) / "saved").exists() for r in (0, 1))
        b.spot_available = lambda: True
        nodes = b.apply(b.spec, "spot")
        assert {n.market for n in nodes} == {"spot"}
        for rank in (0, 1):
            assert "market spot" in (b.disk_dir(rank) / "saved").read_text()
    finally:
        b.kill_all()


def test_stop_all_grace_is_bounded(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text("import time\nwhile True: time.sleep(1)\n")  # never looks at its stop file
    b = LocalBackend(fake_spec(1), tmp_path / "deploy", node_command=lambda b, r, e: [sys.executable, str(script)],
                     use_agent=False)
    try:
        b.bootstrap(b.apply(b.spec, "on-demand"))
        pid = b.procs[0][0].pid
        t0 = time.monotonic()
        b.stop_all(grace_s=1.0)
        assert 0.9 < time.monotonic() - t0 < 8
        assert not alive(pid)
    finally:
        b.kill_all()


class Wall:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_injector_preempt_every_hits_node0_first(backend):
    wall = Wall()
    injector = Injector(backend, nodes=2, clock=VirtualClock(1000.0, 60, wall), origin=1000.0, preempt_every=5,
                        grace_seconds=2, wall=wall)
    nodes = backend.apply(backend.spec, "spot")
    backend.bootstrap(nodes)
    backend.progress_file(0).write_text("{}")
    injector.step()
    wall.t += 5
    injector.step()
    assert backend.notice_file(0).read_text() == "TRUE"
    assert backend.stop_file(0).exists(), "without an agent the injector asks the trainer itself"
    assert backend.read_state(0)["state"] == "running", "killed only after the grace period"
    wall.t += 2
    injector.step()
    assert backend.read_state(0)["state"] == "preempted"
    assert backend.read_state(1)["state"] == "running"
    assert injector.preemptions[0]["rank"] == 0


def test_injector_replays_trace(backend, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [16, 1, 0, 16]}))
    wall = Wall()
    clock = VirtualClock(1000.0, 600, wall)  # one trace tick per wall second
    injector = Injector(backend, nodes=2, clock=clock, origin=1000.0, trace=str(trace), grace_seconds=0.5, wall=wall)
    backend.injector = injector  # the backend asks its injector whether spot capacity is there
    backend.apply(backend.spec, "spot")
    injector.step()
    assert injector.spot_available() and not injector.preemptions
    wall.t += 1  # capacity 1 < 2: the highest rank goes, spot launches fail
    injector.step()
    assert [p["rank"] for p in injector.preemptions] == [1]
    assert not injector.spot_available()
    with pytest.raises(CapacityError):
        backend.apply(backend.spec, "spot")
    wall.t += 1  # capacity 0: node 0 goes too
    injector.step()
    assert [p["rank"] for p in injector.preemptions] == [1, 0]
    wall.t += 1
    injector.step()
    assert injector.spot_available()
    assert {backend.read_state(r)["state"] for r in (0, 1)} == {"preempted"}
    backend.apply(backend.spec, "spot")  # capacity is back


def test_injector_notices_only_the_nodes_above_the_trace_s_capacity_however_many_passes(backend, tmp_path):
    """Capacity 1 for a 2-node spot gang: one node is above it. The injector passes every 0.1 s; a pass
    counted the node already noticed (on its way out) against the capacity again and noticed node 0 at the
    next pass: two preemptions where the trace says one."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [16, 1, 1, 1, 1]}))
    wall = Wall()
    injector = Injector(backend, nodes=2, clock=VirtualClock(1000.0, 600, wall), origin=1000.0, trace=str(trace),
                        grace_seconds=1.0, wall=wall)
    backend.apply(backend.spec, "spot")
    wall.t += 1  # the trace's next tick: capacity 1
    for _ in range(25):  # through the notice's grace, its kill and on, at the injector's pace
        injector.step()
        wall.t += 0.1
    assert [p["rank"] for p in injector.preemptions] == [1]
    assert backend.read_state(1)["state"] == "preempted" and backend.read_state(0)["state"] == "running"


def test_injector_bad_inputs(backend, tmp_path):
    with pytest.raises(InputError, match="not found"):
        Injector(backend, nodes=2, clock=time.time, origin=0, trace=str(tmp_path / "nope.json"))
    with pytest.raises(InputError):
        Injector(backend, nodes=2, clock=time.time, origin=0, preempt_every=0)


def test_a_continued_run_at_another_time_scale_continues_the_job_s_clock(tmp_path, monkeypatch):
    """`kit train` continued with another --time-scale: the clock rescaled about its origin, so a smaller
    scale set it back behind the ledger's newest times (150 -> 1 after 10 wall seconds: 1500 s back to 10)."""
    from kit.watch.ledger import Ledger
    from kit.watch.status import ledger_now

    ledger, wall = Ledger(tmp_path / "ledger.sqlite"), [1000.0]
    monkeypatch.setattr(time, "time", lambda: wall[0])

    def attach(scale):
        spec = fake_spec(1).with_run_options(time_scale=scale, no_preemptions=True)
        return LocalBackend(spec, tmp_path / "deploy", use_agent=False).attach(ledger)

    first = attach(150.0)
    wall[0] += 10.0
    stood = first()
    assert stood == 1000.0 + 1500.0
    continued = attach(1.0)
    assert continued() == stood and ledger_now(ledger) == stood
    wall[0] += 20.0
    assert continued() == stood + 20.0 and ledger_now(ledger) == stood + 20.0
    again = attach(1.0)  # the same scale again: the same clock
    assert again() == stood + 20.0 and ledger.clock() == (1000.0, 1.0, 1490.0)


def test_injector_falls_back_when_the_agent_does_not_relay(backend):
    backend.use_agent = True  # an agent that never writes the stop file
    wall = Wall()
    injector = Injector(backend, nodes=2, clock=VirtualClock(1000.0, 60, wall), origin=1000.0, preempt_every=5,
                        grace_seconds=4, wall=wall)
    backend.apply(backend.spec, "spot")
    backend.progress_file(0).parent.mkdir(parents=True, exist_ok=True)
    backend.progress_file(0).write_text("{}")
    injector.step()
    wall.t += 5
    injector.step()
    assert backend.notice_file(0).read_text() == "TRUE" and not backend.stop_file(0).exists()
    wall.t += 1.6
    injector.step()
    assert backend.stop_file(0).exists()


def test_injector_does_not_relay_a_notice_the_agent_relayed_and_the_trainer_acted_on(backend, caplog):
    """The agent writes the stop file and records the notice; the trainer saves, stops and removes the stop
    file, all within the relay timeout (the local example's small model does). The injector took the missing
    stop file for an agent that never relayed: it warned so at every preemption of `kit train` and wrote a
    second stop file. A notice recorded for an earlier instance of that rank does not count."""
    import logging

    from training.contract import PREEMPTION_NOTICE, write_atomic

    wall = Wall()
    injector = Injector(backend, nodes=2, clock=VirtualClock(1000.0, 60, wall), origin=1000.0, preempt_every=1000,
                        grace_seconds=4, wall=wall)
    backend.bootstrap(backend.apply(backend.spec, "spot"))
    # Agents from here on, but none started: the test plays both agents by hand. A real one, started by the
    # bootstrap, raced the test: on a loaded machine node 0's wrote its stop file after the test's trainer
    # had removed it.
    backend.use_agent = True
    events = [backend.disk_dir(r) / "events.jsonl" for r in (0, 1)]
    for path in events:
        path.parent.mkdir(parents=True, exist_ok=True)
    # node 1's disk holds the notice of the instance it ran before, and a line torn by a crash
    earlier = {"kind": PREEMPTION_NOTICE, "instance": "an-earlier-instance", "node_rank": 1}
    events[1].write_text(json.dumps(earlier) + "\n" + '{"kind": "preemption-not')
    instance = backend.read_state(0)["instance_id"]
    injector.notice(0)
    injector.notice(1)
    # node 0's agent relays; its trainer stops and consumes the stop file at once. Node 1's agent never does.
    events[0].write_text(json.dumps({"kind": PREEMPTION_NOTICE, "instance": instance, "node_rank": 0}) + "\n")
    write_atomic(backend.stop_file(0), "preemption-notice\n")
    backend.stop_file(0).unlink()
    wall.t += 2.1
    with caplog.at_level(logging.WARNING, logger="kit.local"):
        injector.step()
    assert not backend.stop_file(0).exists(), "a second stop request for a notice the agent relayed"
    assert backend.stop_file(1).exists(), "node 1's agent did not relay: the injector does"
    relayed = [r.getMessage() for r in caplog.records if "did not relay" in r.getMessage()]
    assert relayed == ["injector: node-1's agent did not relay the notice; writing the stop file"], relayed


@pytest.mark.parametrize("replacement", ["on-demand", "spot"])
def test_injector_kills_only_the_instance_it_noticed(backend, replacement):
    """Finding 5: the injector remembered only the rank, so a node replaced within the grace
    period (the watcher switched to on-demand, or recovered it) was killed in its place."""
    wall = Wall()
    injector = Injector(backend, nodes=2, clock=VirtualClock(1000.0, 60, wall), origin=1000.0, preempt_every=1000,
                        grace_seconds=4, wall=wall)
    backend.bootstrap(backend.apply(backend.spec, "spot"))
    noticed = backend.read_state(0)["instance_id"]
    injector.notice(0)  # spot notice to node 0, kill in 4 s
    wall.t += 1
    if replacement == "spot":
        backend.mark(0, "preempted", "reclaimed early")  # e.g. gone already; the watcher recovers it
    backend.bootstrap(backend.apply(backend.spec, replacement))
    new = backend.read_state(0)
    assert new["instance_id"] != noticed and new["market"] == replacement
    pid = started(backend, 0)["pid"]
    wall.t += 4
    injector.step()
    assert backend.read_state(0) == new, "the replacement is not preempted"
    assert alive(pid) and backend.trainer_exit(0) is None
    assert not backend.notice_file(0).exists() and not backend.stop_file(0).exists()
    assert not injector.pending


def test_mark_with_an_instance_id_leaves_other_instances_alone(backend):
    backend.bootstrap(backend.apply(backend.spec, "spot"))
    state = backend.read_state(1)
    assert backend.mark(1, "preempted", instance_id="node-1-999") is False
    assert backend.read_state(1)["state"] == "running" and backend.trainer_exit(1) is None
    assert backend.mark(1, "preempted", instance_id=state["instance_id"], market="on-demand") is False
    assert backend.mark(1, "preempted", instance_id=state["instance_id"], market="spot") is True
    assert backend.read_state(1)["state"] == "preempted"


# ---------------------------------------------------------------------- crash-only start
IGNORES_STOP = "import sys, time\nwhile True:\n    time.sleep(0.1)\n"


def test_reconcile_stops_nodes_a_killed_kit_left_running(backend, tmp_path):
    """A restarted kit finds state files that say running and nothing running: each node is recorded
    stopped at its last sign of life (its newest run file), so the watcher relaunches it and its cost
    ends where its processes did; nodes already stopped or preempted are left as they are."""
    backend.clock = lambda: 900.0
    for rank, state in ((0, "running"), (1, "preempted")):
        backend.write_state(rank, f"node-{rank}-7", "spot", state)
    backend.node_dir(0).mkdir(parents=True)
    (backend.node_dir(0) / "train.log").write_text("step 30\n")
    os.utime(backend.node_dir(0) / "train.log", (1000.0, 1000.0))
    preempted = backend.read_state(1)

    restarted = LocalBackend(fake_spec(), backend.deploy_dir, use_agent=False, clock=lambda: 5000.0)
    assert restarted.reconcile(at=lambda wall: wall + 1.0) == [0]
    state = restarted.read_state(0)
    assert state["state"] == "stopped" and state["instance_id"] == "node-0-7" and "killed" in state["reason"]
    assert state["time"] == 1001.0  # train.log's mtime on the clock, not the restart's 5000
    assert restarted.read_state(1) == preempted
    assert restarted.nodes() == []
    assert restarted.reconcile() == [], "idempotent"


def test_reconcile_dates_the_stop_at_the_last_sign_of_life(backend):
    backend.write_state(0, "node-0-1", "spot", "running")
    started_at = backend.read_state(0)["time"]
    backend.node_dir(0).mkdir(parents=True)
    (backend.node_dir(0) / "progress.json").write_text("{}")
    life = started_at + 50.0
    os.utime(backend.node_dir(0) / "progress.json", (life, life))
    restarted = LocalBackend(fake_spec(1), backend.deploy_dir, use_agent=False, clock=lambda: started_at + 900.0)
    restarted.reconcile()
    assert restarted.read_state(0)["time"] == pytest.approx(life)


def test_attach_dates_a_killed_run_s_nodes_on_the_compressed_clock_not_the_wall_clock(tmp_path):
    """A restarted `kit train`: its backend starts on the wall clock and attach() moves it to the job's
    compressed one. Reconcile ran before that move and capped each stop at the wall clock's now, hours
    before the trace times the node came up at: the killed run's nodes ended before they began (0 hours
    billed). They end at their last sign of life, after they came up."""
    from kit.watch.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger.sqlite")
    origin = time.time() - 60.0  # the killed kit ran for 60 wall seconds at 150x
    ledger.keep_clock(origin, 150.0, 0.0)
    clock = VirtualClock(origin, 150.0)
    killed = LocalBackend(fake_spec(1), tmp_path / "deploy", use_agent=False, clock=lambda: clock.at(origin + 10.0))
    killed.write_state(0, "node-0-1", "spot", "running")  # up 10 wall seconds in
    since = killed.read_state(0)["time"]
    killed.node_dir(0).mkdir(parents=True)
    life = time.time() - 5.0  # its trainer last wrote 5 wall seconds ago
    (killed.node_dir(0) / "train.log").write_text("step 30\n")
    os.utime(killed.node_dir(0) / "train.log", (life, life))

    restarted = LocalBackend(fake_spec(1), tmp_path / "deploy", use_agent=False)  # as Session.start builds it
    try:
        restarted.attach(ledger)
        state = restarted.read_state(0)
        assert state["state"] == "stopped"
        assert state["time"] >= since, "stopped before it came up: billed 0 hours"
        assert state["time"] == pytest.approx(clock.at(life), abs=150.0 * 0.5)  # its last sign of life
    finally:
        restarted.close()
        ledger.close()


def test_reconcile_waits_for_leftover_processes_then_kills_them(backend, tmp_path, caplog):
    """Processes of the killed kit's node that are still alive (saving on the parent-death signal, or
    stuck) are asked to stop through the node's stop file and killed after the grace: no two trainers
    ever write one checkpoint directory. The log names them, when found and when killed, so a wait on a
    process that could not save can be told from a long save."""
    script = tmp_path / "stuck.py"
    script.write_text(IGNORES_STOP)
    backend.write_state(0, "node-0-1", "spot", "running")
    backend.node_dir(0).mkdir(parents=True)
    backend.progress_file(0).write_text("{}")  # it was training: it gets the whole grace to save
    # reparented to init, as a node process is once its kit died; found by the stop-file argument
    stuck = subprocess.Popen([sys.executable, str(script), "--stop-file", str(backend.stop_file(0))],
                             start_new_session=True)
    other = subprocess.Popen([sys.executable, str(script), "--stop-file", str(backend.stop_file(0)) + ".other"])
    try:
        restarted = LocalBackend(fake_spec(1), backend.deploy_dir, use_agent=False)
        restarted.save_grace_s = 0.5
        assert restarted.node_processes(0) == [stuck.pid]
        t0 = time.monotonic()
        assert restarted.reconcile() == [0]
        assert 0.5 <= time.monotonic() - t0 < 5
        assert stuck.wait(5) == -9 and restarted.stop_file(0).exists()
        assert other.poll() is None, "only the node's own processes"
        found, killed, _stopped = (r.getMessage() for r in caplog.records if r.name == "kit.backends.local")
        assert found.startswith(f"node-0: 1 processes of a killed kit are still running ({stuck.pid} ")
        assert "stuck.py --stop-file); they save and stop" in found
        assert killed == (f"node-0: {stuck.pid} {Path(sys.executable).name} stuck.py --stop-file did not stop "
                          "within 0.5 s of the stop request: killed")
    finally:
        for proc in (stuck, other):
            proc.kill()
            proc.wait()


def test_reconcile_kills_a_leftover_that_never_reported_progress_without_the_save_grace(backend, tmp_path):
    """A node killed during its start-up (no progress yet) has nothing to save: it gets the short
    start-up grace, not the 30-s save grace, so the restarted kit trains again at once."""
    script = tmp_path / "stuck.py"
    script.write_text(IGNORES_STOP)
    backend.write_state(0, "node-0-1", "spot", "running")
    backend.node_dir(0).mkdir(parents=True)
    stuck = subprocess.Popen([sys.executable, str(script), "--stop-file", str(backend.stop_file(0))],
                             start_new_session=True)
    try:
        restarted = LocalBackend(fake_spec(1), backend.deploy_dir, use_agent=False)
        waited = time.monotonic() + 5
        while restarted.node_processes(0) != [stuck.pid] and time.monotonic() < waited:
            time.sleep(0.05)  # until the child has exec'd and shows its --stop-file argument
        assert restarted.save_grace_s >= 30 and restarted.node_processes(0) == [stuck.pid]
        t0 = time.monotonic()
        assert restarted.reconcile() == [0]
        assert restarted.startup_grace_s <= time.monotonic() - t0 < 10
        assert stuck.wait(5) == -9
    finally:
        stuck.kill()
        stuck.wait()


def test_zones_replay_their_own_traces_and_a_move_or_reshape_replaces_every_node(tmp_path):
    """Two zones of a set (each its own file, one clock): a spot launch in a zone without room is a
    capacity error there only; preemptions follow the job to the zone and shape it runs on; a move
    starts every node on the new zone's disks, a reshape (2 x 1 -> 1 x 2 processes) replaces them."""
    from kit.spec import parse_spec

    traces = tmp_path / "set"
    traces.mkdir()
    (traces / "za.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [16, 0, 0]}))
    (traces / "zb.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 1, 16]}))
    spec = parse_spec({"name": "t", "cloud": "local", "zones": ["za", "zb"], "local": {"trace": str(traces)},
                       "shapes": [{"nodes": 2, "gpus_per_node": 1}, {"nodes": 1, "gpus_per_node": 2}]},
                      str(tmp_path / "c.yaml"))
    wall = Wall()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    b = LocalBackend(spec, tmp_path / "deploy", node_command=lambda b, r, e: sleeper, use_agent=False)
    try:
        b.clock = clock = VirtualClock(1000.0, 600, wall)
        b.injector = Injector(b, nodes=2, clock=clock, origin=1000.0, grace_seconds=0.1, wall=wall,
                              zones={z: spec.trace_of(z) for z in spec.zone_list}, zone="za")
        (wide, tall) = [o for o in spec.offers() if o.zone == "zb" and o.market == "spot"]
        with pytest.raises(CapacityError, match="in zb"):  # zb has room for 1 node
            b.apply(spec.with_offer(wide), "spot")
        nodes = b.apply(spec, "spot")  # za, 2 x 1
        assert [n.zone for n in nodes] == ["za", "za"] and b.disk_dir(0) == b.root / "disks" / "za" / "node-0"
        wall.t += 1  # za drops to 0: both of its nodes get a notice
        b.injector.step()
        assert sorted(p["rank"] for p in b.injector.preemptions) == [0, 1]
        moved = b.apply(spec.with_offer(tall), "spot")  # zb, 1 x 2: every node new, on zb's disk
        assert [(n.rank, n.zone, n.disk_id) for n in moved] == [(0, "zb", str(b.root / "disks" / "zb" / "node-0"))]
        assert moved[0].instance_id not in {n.instance_id for n in nodes}
        assert b.read_state(0)["procs"] == 2 and b.read_state(1) is None and b.injector.zone == "zb"
        assert (b.root / "disks" / "za" / "node-0").is_dir(), "the left zone's disk is kept"
        # the disk sets the watcher's DiskKeeper may release: one per zone; the running one cannot go
        assert b.disk_set("za", "2xlocal") == b.disk_set("za", "1xlocal") == "za"
        with pytest.raises(KitError, match="in use"):
            b.release_disks("zb")
        b.release_disks("za")
        assert not (b.root / "disks" / "za").exists() and (b.root / "disks" / "zb" / "node-0").is_dir()
        assert b.wall_time(clock.at(wall.t + 5)) == pytest.approx(wall.t + 5), "ledger clock back to wall"
        assert b.apply(spec.with_offer(tall), "spot") == moved  # the same offer again: kept
        assert "--nproc-per-node=2" in b.trainer_command(0, "127.0.0.1:1")
        assert any(a.startswith("file://") and a.endswith("/bucket/t") for a in b.trainer_command(0, "127.0.0.1:1"))
    finally:
        b.kill_all()


def test_a_move_s_new_nodes_are_judged_by_the_new_zone_s_capacity_from_their_first_state_file(tmp_path):
    """The injector's thread reads the state files without the backend's lock. apply() wrote the new
    nodes' files before it told the injector their zone: a pass in between judged the spot nodes just
    started in zb (room for 16) against za's capacity (none) and preempted them."""
    from kit.spec import parse_spec

    traces = tmp_path / "set"
    traces.mkdir()
    (traces / "za.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [16, 0, 0]}))
    (traces / "zb.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [16, 16, 16]}))
    spec = parse_spec({"name": "t", "cloud": "local", "nodes": 2, "zones": ["za", "zb"],
                       "local": {"trace": str(traces)}}, str(tmp_path / "c.yaml"))
    wall = Wall()

    class PassInTheGap(LocalBackend):  # an injector pass right after each state file apply() writes
        def write_state(self, *args, **kwargs):
            data = super().write_state(*args, **kwargs)
            if self.injector is not None:
                self.injector.step()
            return data

    b = PassInTheGap(spec, tmp_path / "deploy", use_agent=False)
    b.clock = clock = VirtualClock(1000.0, 600, wall)
    b.injector = Injector(b, nodes=2, clock=clock, origin=1000.0, grace_seconds=5.0, wall=wall,
                          zones={z: spec.trace_of(z) for z in spec.zone_list}, zone="za")
    b.apply(spec, "on-demand")  # in za
    wall.t += 1  # za has no spot capacity now; zb has
    zb = next(o for o in spec.offers() if o.zone == "zb" and o.market == "spot")
    moved = b.apply(spec.with_offer(zb), "spot")
    assert [n.zone for n in moved] == ["zb", "zb"] and b.injector.zone == "zb"
    assert b.injector.preemptions == [], "a node started in zb was noticed by za's trace"


def test_each_node_s_agent_gets_its_own_watcher_token_not_the_cluster_s(tmp_path):
    """The token file a node's agent reads reports as that node only (kit.watch.server.node_token): what
    node 0 holds is refused when it names node 1, by the watcher's own endpoint."""
    import stat
    import urllib.error
    import urllib.request

    from kit.watch.server import WatcherServer, node_token

    secret = "cluster-secret-" + "x" * 30
    b = LocalBackend(fake_spec(), tmp_path / "deploy", watcher_url="http://127.0.0.1:1", watcher_token=secret)
    files = {}
    for rank, instance in ((0, "local-t-0-a"), (1, "local-t-1-b")):
        cmd = b.agent_command(rank, instance)
        files[instance] = Path(cmd[cmd.index("--watcher-token-file") + 1])
    got = []
    with WatcherServer({"t": secret}, lambda cluster, event: got.append(event.instance)) as server:
        def post(token_of: str, instance: str, rank: int) -> int:
            body = {"kind": "shutdown", "instance": instance, "node_rank": rank, "time": 1.0, "cloud": "local"}
            request = urllib.request.Request(f"{server.url}/v1/clusters/t/events", data=json.dumps(body).encode(),
                                             headers={"Authorization": f"Bearer {files[token_of].read_text()}"})
            try:
                with urllib.request.urlopen(request, timeout=10) as reply:
                    return reply.status
            except urllib.error.HTTPError as error:
                return error.code

        assert post("local-t-0-a", "local-t-1-b", 1) == 401
        assert post("local-t-0-a", "local-t-0-a", 0) == 202
    assert got == ["local-t-0-a"]
    for instance, path in files.items():
        assert path.read_text() == node_token(secret, instance) != secret
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

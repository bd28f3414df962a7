"""Ledger: deduplication, the per-cluster lock, and crash recovery with exactly one apply."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.watch.events import INSTANCE_LOST, Event
from kit.watch.ledger import SCHEMA_VERSION, Ledger, WatcherLock
from tests.support import REPO

CHILD = REPO / "tests" / "support" / "watch_crash_child.py"


def run_child(workdir: Path, crash_at: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), str(workdir), crash_at],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("crash_at", ["after-decision", "apply-begun", "apply-done", "bootstrap"])
def test_watcher_killed_between_decision_and_done_applies_exactly_once(tmp_path, crash_at):
    killed = run_child(tmp_path, crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # it really died mid-way
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.pending_decision() is not None  # the decision was durable before acting
    ledger.close()

    restarted = run_child(tmp_path, "none")
    assert restarted.returncode == 0, restarted.stderr

    calls = [tuple(c) for c in json.loads((tmp_path / "cloud.json").read_text())["calls"]]
    completed = [c for c in calls if c[0] == "apply"]
    assert completed == [("apply", "on-demand", "on-demand")]  # converged exactly once
    begun = [c for c in calls if c[0] == "apply-begun"]
    # Only an apply that never converged is started again.
    assert len(begun) == (1 if crash_at == "apply-begun" else 0)
    assert calls[-1][0] == "bootstrap"  # training restarted on the final nodes
    ledger = Ledger(tmp_path / "ledger.sqlite")
    switches = [d for d in ledger.decisions() if d.action == "switch"]
    assert [(d.status, d.market_after) for d in switches] == [("done", "on-demand")]
    assert ledger.pending_decision() is None and ledger.market() == "on-demand"
    ok = [a for a in ledger.applies() if a.status == "ok" and a.decision_id == switches[0].id]
    assert len(ok) == 1 and ok[0].adopted == (crash_at == "apply-done")


def test_second_watcher_on_the_same_cluster_is_refused(tmp_path):
    with WatcherLock(tmp_path / "watcher.lock"):
        with pytest.raises(KitError, match="already watching"):
            WatcherLock(tmp_path / "watcher.lock").acquire()
        # Another process too (flock is per open file description, checked across processes).
        code = ("import sys; from kit.watch.ledger import WatcherLock\n"
                f"try:\n WatcherLock({str(tmp_path / 'watcher.lock')!r}).acquire()\n"
                "except Exception as e:\n print(e); sys.exit(3)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 3 and "already watching" in proc.stdout
    WatcherLock(tmp_path / "watcher.lock").acquire().release()  # free again once released


def test_events_are_recorded_once_and_wal_is_on(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    event = Event(kind=INSTANCE_LOST, instance="i-1", time=1.0, source="aws", dedup_key="loss:i-1")
    assert ledger.record(event) is True
    assert ledger.record(event) is False
    assert len(ledger.events()) == 1
    assert ledger._query("PRAGMA journal_mode")[0][0] == "wal"


def test_job_start_is_fixed_once(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    assert ledger.job_started(100.0) == 100.0
    assert Ledger(tmp_path / "l.sqlite").job_started(999.0) == 100.0


def test_newer_ledger_schema_is_refused(tmp_path):
    import sqlite3

    Ledger(tmp_path / "l.sqlite").close()
    db = sqlite3.connect(tmp_path / "l.sqlite")
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(KitError, match="schema version 99"):
        Ledger(tmp_path / "l.sqlite")


@pytest.mark.parametrize("damage", ["not a database", "torn pages", "truncated"])
def test_a_damaged_ledger_is_refused_before_anything_reads_or_writes_it(tmp_path, damage):
    """A ledger that is not SQLite, or whose pages were torn (a disk fault, a copy cut short), is an error
    that names the file and says what to do, with the file as it was: not a traceback from the first query
    that happens to touch the bad page (the watcher would have acted on a half-read history)."""
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    ledger.job_started(100.0)
    ledger.close()
    data = path.read_bytes()
    page = 4096  # SQLite's default page size: the first page holds the header and the schema
    bad = {"not a database": b"x" * 100 + data[100:], "torn pages": data[:page] + b"\xff" * (len(data) - page),
           "truncated": data[:1500]}[damage]
    path.write_bytes(bad)
    with pytest.raises(KitError, match="the ledger cannot be read") as info:
        Ledger(path)
    assert info.value.where == str(path) and "move it aside" in info.value.fix
    assert path.read_bytes() == bad


def test_a_crash_after_the_tick_is_recorded_does_not_count_its_preemption_twice(tmp_path):
    """Finding 12: the tick and the event cursor were two transactions; a watcher killed between
    them replayed the tick (preempted) on restart and then saw its events again (preempted twice)."""
    from kit.watch.acting import Actor
    from kit.watch.watcher import Watcher
    from tests.support.watch import BackendSource, RecordingBackend, ScriptedPolicy, heartbeat, local_spec

    class Killed(BaseException):
        pass

    class KilledAfterTick(Ledger):
        armed = False

        def record_tick(self, *args, **kwargs):
            super().record_tick(*args, **kwargs)
            if self.armed:
                raise Killed  # the process dies right after the tick is durable

    backend = RecordingBackend(2)
    backend.apply(local_spec(), "spot")
    backend.calls.clear()
    spec = local_spec()
    ledger = KilledAfterTick(tmp_path / "ledger.sqlite")
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec), ScriptedPolicy(["spot"]),
                      source=BackendSource(backend))
    watcher.start()
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    backend.preempt(1)
    ledger.armed = True
    with pytest.raises(Killed):
        watcher.tick()
    ledger.close()

    ledger = Ledger(tmp_path / "ledger.sqlite")
    policy = ScriptedPolicy(["spot"])
    again = Watcher(spec, ledger, Actor(backend, ledger, spec), policy, source=BackendSource(backend))
    again.start()  # replays the recorded ticks
    again.tick()
    assert [o.preempted for o in policy.seen] == [False, True, False], "one preemption, seen once"


def test_latest_progress_is_the_newest_record_and_done_is_final(tmp_path):
    """Finding 12: the highest step ever recorded overstated progress after a restart from an
    older checkpoint."""
    from tests.support.watch import heartbeat

    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.record(heartbeat(380, 1000))
    ledger.record(heartbeat(350, 1000))  # resumed from the checkpoint at 350
    assert ledger.latest_progress()["step"] == 350
    ledger.record(heartbeat(1000, 1000, state="done"))
    ledger.record(heartbeat(990, 1000))  # a slower reporter's late heartbeat
    assert (ledger.latest_progress()["step"], ledger.latest_progress()["state"]) == (1000, "done")


def test_heartbeats_are_ordered_by_when_the_trainer_wrote_them(tmp_path):
    """Every node writes its own progress file (at most once a second, each at its own moment) and its
    report may arrive after a fresher one of another node: a stale report is no setback, a resume is."""
    from tests.support.watch import heartbeat

    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.record(heartbeat(46, 120, rank=0, written=110.0))
    ledger.record(heartbeat(44, 120, rank=1, written=109.4))  # read on node 1 before node 0's, arrived after
    assert ledger.latest_progress()["step"] == 46
    ledger.record(heartbeat(40, 120, rank=0, written=150.0))  # resumed from the checkpoint at 40
    assert [step for _, step in ledger.progress_history()] == [44, 46, 40]
    assert ledger.latest_progress()["step"] == 40


@pytest.mark.parametrize("scale", [None, 60.0])
def test_a_crossing_of_two_nodes_reports_is_no_setback_and_a_relaunch_is(tmp_path, scale):
    """Node 1's report of step 45 written 2 ms after node 0's of 46 (each node writes at its own moment,
    on its own clock) is no step lost; the relaunched nodes' first reports, from the checkpoint at 40, lose
    the steps since (8: the job had reached 48), though no reporter went back (new instance ids). On the
    local backend's compressed clock (``scale``) the nodes' starts are converted to the trainers' clock."""
    from dataclasses import replace

    from kit.train import steps_lost
    from tests.support.watch import heartbeat

    ledger = Ledger(tmp_path / "l.sqlite")
    if scale is not None:
        ledger.keep_clock(0.0, scale, 0.0)
    on_ledger = (lambda wall: wall) if scale is None else (lambda wall: wall * scale)

    def report(instance: str, rank: int, step: int, written: float) -> None:
        ledger.record(replace(heartbeat(step, 120, rank=rank, written=written), instance=instance))

    def nodes(first: int) -> list[dict]:
        return [{"instance_id": f"i-{first + r}", "rank": r, "market": "spot"} for r in range(2)]

    ledger.adopt_deployment(nodes(0), "spot", "default", on_ledger(50.0))
    for instance, rank, step, written in (("i-0", 0, 40, 100.0), ("i-1", 1, 44, 102.2), ("i-0", 0, 46, 103.0),
                                          ("i-1", 1, 45, 103.002), ("i-1", 1, 48, 104.0)):
        report(instance, rank, step, written)
    assert [step for _, step in ledger.progress_history()] == [40, 44, 46, 46, 48]
    assert steps_lost(ledger) == 0
    for i in ("i-0", "i-1"):
        ledger.mark_lost(i, on_ledger(110.0), "preemption")
    decision = ledger.begin_decision(policy="default", decision="spot", action="recover", market_before="spot",
                                     market_after="spot", reason="lost", now=on_ledger(120.0))
    ledger.mark_applied(ledger.start_apply(decision, "spot", on_ledger(120.0)), nodes(10), market="spot",
                        now=on_ledger(150.0))
    for instance, rank, step, written in (("i-10", 0, 40, 200.0), ("i-11", 1, 41, 200.5), ("i-10", 0, 42, 201.0)):
        report(instance, rank, step, written)
    assert [step for _, step in ledger.progress_history()][5:] == [40, 41, 42]
    assert steps_lost(ledger) == 8


def test_the_checkpoint_size_is_the_newest_reported_and_a_bad_one_is_not_kept(tmp_path):
    """``checkpoint_bytes`` arrives as free-form detail from the network: only a whole number of bytes is
    kept; the size is the newest report's, by when the trainer wrote it."""
    from tests.support.watch import heartbeat

    ledger = Ledger(tmp_path / "l.sqlite")
    assert ledger.checkpoint_gb() is None
    ledger.record(heartbeat(10, 100, written=10.0, checkpoint_step=10, checkpoint_bytes=2 * 10**9))
    ledger.record(heartbeat(5, 100, rank=1, written=9.0, checkpoint_step=5, checkpoint_bytes=10**9))  # arrived late
    assert ledger.checkpoint_gb() == 2.0
    for bad in (True, -1, 1.5e9, "3000000000", 2**63, None):
        ledger.record(heartbeat(11, 100, written=11.0, checkpoint_step=10, checkpoint_bytes=bad))
    assert ledger.checkpoint_gb() == 2.0
    ledger.record(heartbeat(12, 100, written=12.0, checkpoint_step=10, checkpoint_bytes=0))
    assert ledger.checkpoint_gb() == 0.0


def test_a_version_5_ledger_gets_the_checkpoint_size_column(tmp_path):
    """A job the previous kit (schema 5) started goes on: its heartbeats are kept, the size is added."""
    import sqlite3

    from tests.support.watch import heartbeat

    Ledger(tmp_path / "l.sqlite").record(heartbeat(10, 100, written=10.0, checkpoint_step=10))
    db = sqlite3.connect(tmp_path / "l.sqlite")
    db.executescript("ALTER TABLE progress DROP COLUMN checkpoint_bytes; PRAGMA user_version = 5;")
    db.close()
    ledger = Ledger(tmp_path / "l.sqlite")
    assert ledger._query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    assert ledger.latest_progress()["step"] == 10 and ledger.checkpoint_gb() is None
    ledger.record(heartbeat(20, 100, written=20.0, checkpoint_step=20, checkpoint_bytes=10**9))
    assert ledger.checkpoint_gb() == 1.0


def test_a_version_7_ledger_takes_moves_and_keeps_its_decisions_and_applies(tmp_path):
    """Version 8 adds the ``move`` action; SQLite cannot alter a CHECK constraint, so a version 7 ledger's
    ``decisions`` is rebuilt: its rows, ids and the applies that refer to them stay, and a move is taken."""
    import sqlite3

    old = Ledger(tmp_path / "l.sqlite")
    first = old.begin_decision(policy="default", decision="spot", action="launch", market_before=None,
                               market_after="spot", reason="nothing running", now=1.0)
    attempt = old.start_apply(first, "spot", 2.0)
    old.close()
    db = sqlite3.connect(tmp_path / "l.sqlite")
    table = db.execute("SELECT sql FROM sqlite_master WHERE name = 'decisions'").fetchone()[0]
    # legacy_alter_table: the rename leaves the applies table referring to "decisions", as a version 7 ledger does
    db.executescript("PRAGMA foreign_keys=OFF; PRAGMA legacy_alter_table=ON; ALTER TABLE decisions RENAME TO d8;"
                     + table.replace("'release', 'move'", "'release'") + ";"
                     "INSERT INTO decisions SELECT * FROM d8; DROP TABLE d8; PRAGMA user_version = 7;")
    with pytest.raises(sqlite3.IntegrityError):  # the version 7 table refuses a move
        db.execute("INSERT INTO decisions(created, policy, decision, action, reason, status) "
                   "VALUES (3, 'default', 'spot', 'move', 'x', 'pending')")
    db.close()
    ledger = Ledger(tmp_path / "l.sqlite")
    assert ledger._query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    assert ledger.decision(first).action == "launch" and ledger.applies(decision_id=first)[0].id == attempt
    moved = ledger.begin_decision(policy="default", decision="spot", action="move", market_before="spot",
                                  market_after="spot", reason="a cheaper offer", now=3.0)
    assert ledger.decision(moved).action == "move" and ledger.decision(first).status == "superseded"
    assert ledger._query("PRAGMA foreign_keys")[0][0] == 1 and not ledger._query("PRAGMA foreign_key_check")


V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (id INTEGER PRIMARY KEY, time REAL NOT NULL, recorded REAL NOT NULL, kind TEXT NOT NULL,
    instance TEXT NOT NULL, node_rank INTEGER, source TEXT NOT NULL, detail TEXT NOT NULL, dedup_key TEXT UNIQUE);
CREATE TABLE nodes (instance_id TEXT PRIMARY KEY, name TEXT NOT NULL, rank INTEGER NOT NULL, market TEXT,
    zone TEXT, private_ip TEXT, public_ip TEXT, disk_id TEXT,
    state TEXT NOT NULL CHECK (state IN ('up', 'lost', 'replaced', 'released')),
    since REAL NOT NULL, until REAL, apply_id INTEGER);
INSERT INTO meta VALUES ('schema_version', '1'), ('market', 'spot'), ('job_started', '0.0'),
                        ('capacity_failures:spot', '3'), ('local_clock_origin', '12.5');
INSERT INTO events VALUES (1, 50.0, 50.0, 'preemption', 'i-2', 1, 'aws', '{}', 'loss:i-2'),
                          (2, 40.0, 40.0, 'preemption', 'i-1', 0, 'agent', '{}', 'agent:i-1');
INSERT INTO nodes VALUES ('i-1', 'node-0', 0, 'spot', NULL, NULL, NULL, NULL, 'up', 0.0, NULL, 1),
                         ('i-2', 'node-1', 1, 'spot', NULL, NULL, NULL, NULL, 'replaced', 0.0, 50.0, 1),
                         ('i-3', 'node-1', 1, 'spot', NULL, NULL, NULL, NULL, 'up', 50.0, NULL, 2);
"""


def test_a_version_1_ledger_is_migrated(tmp_path):
    """A job started with the previous kit continues: nodes get incarnations and how they ended."""
    import sqlite3

    from kit.watch.status import status_report
    from tests.support.watch import local_spec

    db = sqlite3.connect(tmp_path / "l.sqlite")
    db.executescript(V1_SCHEMA)
    db.close()
    ledger = Ledger(tmp_path / "l.sqlite")
    assert ledger._query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    for column in ("written", "checkpoint_bytes"):
        assert ledger._query("SELECT 1 FROM pragma_table_info('progress') WHERE name = ?", (column,)), "later columns"
    # the job's facts, from text in `meta` to typed columns (and `meta` is gone)
    assert (ledger.market(), ledger.started_at(), ledger.capacity_failures("spot")) == ("spot", 0.0, 3)
    assert ledger.clock() == (12.5, None, 0.0) and not ledger._query(
        "SELECT 1 FROM sqlite_master WHERE name = 'meta'")
    rows = {n.instance_id: n for n in ledger.all_nodes()}
    assert {i: (n.state, n.lost_kind) for i, n in rows.items()} == {
        "i-1": ("up", None), "i-2": ("replaced", "preemption"), "i-3": ("up", None)}
    report = status_report(ledger, local_spec(), now=100.0)
    assert (report["preemptions"], report["nodes_lost"], report["notices"]) == (1, 1, 1)
    assert report["spot_hours"] == pytest.approx((100 + 50 + 50) / 3600, abs=1e-6)
    ledger.close()
    assert Ledger(tmp_path / "l.sqlite").market() == "spot"  # reopened: nothing to do


def test_a_ledger_whose_migration_was_killed_before_its_version_was_stamped_still_takes_moves(tmp_path):
    """A version-2 ledger's migration commits step by step and stamps the version last; killed after its
    ``meta`` table was dropped, the next open read version 0 (a new ledger), skipped the rebuild that allows
    the ``move`` action, stamped the current version, and every move failed its CHECK constraint after."""
    import sqlite3

    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    db = sqlite3.connect(path)
    sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'decisions'").fetchone()[0]
    db.executescript("PRAGMA foreign_keys=OFF; ALTER TABLE decisions RENAME TO old; "
                     + sql.replace(", 'move'", "") + "; DROP TABLE old; PRAGMA user_version = 0;")
    db.close()
    ledger = Ledger(path)
    ledger.begin_decision(policy="default", decision="spot", action="move", market_before="spot",
                          market_after="spot", reason="try to move", now=1.0)
    assert ledger.decisions()[0].action == "move"

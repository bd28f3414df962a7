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
from kit.watch.ledger import Ledger, WatcherLock

CHILD = Path(__file__).with_name("watch_crash_child.py")


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
    Ledger(tmp_path / "l.sqlite").set_meta("schema_version", "99")
    with pytest.raises(KitError, match="schema version 99"):
        Ledger(tmp_path / "l.sqlite")

"""ProgressPuller: progress read from the nodes is recorded like a heartbeat (throttled, deduplicated,
the final digest kept for the export check)."""
from __future__ import annotations

from kit.watch.ledger import Ledger
from kit.watch.progress import ProgressPuller


class NodesSay:
    def __init__(self):
        self.record = None
        self.reads = 0

    def progress(self):
        self.reads += 1
        return self.record


def test_pull_records_new_progress_once_and_keeps_the_final_digest(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    nodes = NodesSay()
    puller = ProgressPuller(nodes, ledger, source="gcp", clock=lambda: 100.0, every_s=3600, time_scale=2.0)
    assert puller.pull(force=True) is None and ledger.latest_progress() is None, "nothing to read yet"
    nodes.record = {"step": 10, "total_steps": 50, "state": "running", "step_time_s": 0.5, "time": 1}
    assert puller.pull() is None and nodes.reads == 1, "throttled: no second read within every_s"
    assert puller.pull(force=True)["step"] == 10
    assert puller.pull(force=True) is None, "the same record is not stored twice"
    row = ledger.latest_progress()
    assert (row["step"], row["total_steps"], row["step_time_s"]) == (10, 50, 1.0), "step time in scaled seconds"
    assert ledger.params_sha256() is None
    nodes.record = {"step": 50, "total_steps": 50, "state": "done", "params_sha256": "ab" * 32, "time": 2}
    assert puller.pull(force=True)["state"] == "done"
    assert ledger.latest_progress()["state"] == "done"
    assert ledger.params_sha256() == "ab" * 32
    assert [step for _, step in ledger.progress_history()] == [10, 50]


def test_pulled_progress_keeps_the_trainers_write_time(tmp_path):
    """The puller reads the nodes later than the agents report: its row is ordered by the file's time."""
    from tests.support.watch import heartbeat

    ledger = Ledger(tmp_path / "ledger.sqlite")
    nodes = NodesSay()
    puller = ProgressPuller(nodes, ledger, source="aws", clock=lambda: 500.0, every_s=0)
    ledger.record(heartbeat(46, 120, written=110.0))
    nodes.record = {"step": 44, "total_steps": 120, "state": "running", "time": 109.0}
    assert puller.pull(force=True)["step"] == 44
    assert [step for _, step in ledger.progress_history()] == [44, 46]
    assert ledger.latest_progress()["step"] == 46

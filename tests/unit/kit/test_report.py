"""``kit train --plot`` (kit.report): drawn from the ledger of a job that moved, had an offer without
capacity, and whose left zone's disks were deleted after a while."""
from __future__ import annotations

from kit.report import idle_disk_spans, plot_run
from kit.watch.events import CAPACITY_ERROR, Event
from kit.watch.ledger import Ledger
from tests.support.watch import cloud_spec, heartbeat

H, T0 = 3600.0, 1_000_000.0


def moved_job(tmp_path) -> Ledger:
    """2 nodes in us-east-1a from T0, preempted at 10 h; us-east-1c had no capacity; relaunched in
    us-east-1b; 1a's volumes deleted at 30 h."""
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.job_started(T0)

    def nodes(zone: str, first: int) -> list[dict]:
        return [{"instance_id": f"i-{first + r}", "name": f"n{r}", "rank": r, "market": "spot", "zone": zone,
                 "disk_id": f"vol-{zone}-{r}", "shape": "2xg5.xlarge"} for r in range(2)]

    ledger.adopt_deployment(nodes("us-east-1a", 0), "spot", "default", T0)
    for step, hour in ((100, 5), (200, 9.9)):
        ledger.record(heartbeat(step, 400, written=T0 + hour * H))
    for i in ("i-0", "i-1"):
        ledger.record(Event(kind="preemption", instance=i, time=T0 + 10 * H, source="aws", dedup_key=f"loss:{i}"))
        ledger.mark_lost(i, T0 + 10 * H, "preemption")
    ledger.record(Event(kind=CAPACITY_ERROR, instance="*", time=T0 + 10.1 * H, source="watcher",
                        detail={"market": "spot", "offer": "us-east-1c/2xg5.xlarge/spot"}, dedup_key="c1"))
    decision = ledger.begin_decision(policy="default", decision="spot", action="recover", market_before="spot",
                                     market_after="spot", reason="lost", now=T0 + 10.2 * H)
    ledger.mark_applied(ledger.start_apply(decision, "spot", T0 + 10.2 * H), nodes("us-east-1b", 10), market="spot",
                        now=T0 + 10.2 * H)
    ledger.record(heartbeat(400, 400, state="done", written=T0 + 40 * H))
    ledger.record(Event(kind="disks-released", instance="disks-us-east-1a", time=T0 + 30 * H, source="watcher",
                        detail={"zone": "us-east-1a", "disks": ["vol-us-east-1a-0", "vol-us-east-1a-1"]}))
    return ledger


def test_idle_disks_are_the_left_zones_from_leaving_until_deleted(tmp_path):
    ledger = moved_job(tmp_path)
    assert idle_disk_spans(ledger, T0 + 40 * H) == {("us-east-1a", "2xg5.xlarge"): [(T0 + 10 * H, T0 + 30 * H)]}


def job(tmp_path, runs: list[tuple[float, str, str]], released: list[tuple[float, str, list[str]]]) -> Ledger:
    """One node per run (hour, zone, shape) until the next, on the disk of its zone and shape (a cloud that
    names its disks, as GCP: made again under the same id); the disks deleted at each (hour, zone, disks)."""
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.job_started(T0)
    for hour, zone, shape in runs:
        decision = ledger.begin_decision(policy="default", decision="spot", action="move", market_before="spot",
                                         market_after="spot", reason="moved", now=T0 + hour * H)
        node = {"instance_id": f"i-{hour:g}", "name": "n0", "rank": 0, "market": "spot", "zone": zone,
                "disk_id": f"disk-{zone}-{shape}", "shape": shape}
        ledger.mark_applied(ledger.start_apply(decision, "spot", T0 + hour * H), [node], market="spot",
                            now=T0 + hour * H)
    for hour, zone, disks in released:
        ledger.record(Event(kind="disks-released", instance=f"disks-{zone}", time=T0 + hour * H, source="watcher",
                            detail={"zone": zone, "disks": disks}))
    return ledger


def test_idle_disks_are_per_disk_set_not_per_zone(tmp_path):
    """Two shapes in one zone are two disk sets (a disks root each): one idle while the job runs on the other
    is shown, and each has its own bar, ended by the deletion of its own disks."""
    ledger = job(tmp_path, [(0, "us-east-1a", "2xg5.xlarge"), (10, "us-east-1a", "1xg5.2xlarge"),
                            (20, "us-east-1b", "2xg5.xlarge")],
                 released=[(15, "us-east-1a", ["disk-us-east-1a-2xg5.xlarge"])])
    assert idle_disk_spans(ledger, T0 + 30 * H) == {("us-east-1a", "2xg5.xlarge"): [(T0 + 10 * H, T0 + 15 * H)],
                                                    ("us-east-1a", "1xg5.2xlarge"): [(T0 + 20 * H, T0 + 30 * H)]}


def test_disks_deleted_and_made_again_were_not_idle_in_between(tmp_path):
    """The job left us-east-1a at 10 h, its disks were deleted at 30 h and made again (the same id) when the
    job came back at 35 h: idle 10-30 h and again after it left at 40 h, not while they did not exist."""
    ledger = job(tmp_path, [(0, "us-east-1a", "2xg5.xlarge"), (10, "us-east-1b", "2xg5.xlarge"),
                            (35, "us-east-1a", "2xg5.xlarge"), (40, "us-east-1b", "2xg5.xlarge")],
                 released=[(30, "us-east-1a", ["disk-us-east-1a-2xg5.xlarge"])])
    assert idle_disk_spans(ledger, T0 + 50 * H) == {
        ("us-east-1a", "2xg5.xlarge"): [(T0 + 10 * H, T0 + 30 * H), (T0 + 40 * H, T0 + 50 * H)],
        ("us-east-1b", "2xg5.xlarge"): [(T0 + 35 * H, T0 + 40 * H)]}


def test_the_plot_is_drawn_with_moves_tries_and_idle_disks(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    legends = []
    real_savefig = plt.Figure.savefig

    def keep(fig, *args, **kw):
        legends.append({t.get_text() for t in fig.axes[0].get_legend().get_texts()})
        return real_savefig(fig, *args, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    out = plot_run(moved_job(tmp_path), cloud_spec("aws"), tmp_path / "plot" / "run.png")
    assert out.stat().st_size > 10_000
    assert legends == [{"step", "spot", "preemption", "no capacity (1 offer tries)", "idle disks (no node on them)"}]

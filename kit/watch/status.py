"""The ledger's view of a cluster: nodes, market, preemptions, decisions, progress, cost so far.

Cost is node-hours per market (each instance from when an apply brought it up until it was
lost, replaced or released) times the spec's prices (``prices{spot_per_hour,
on_demand_per_hour}``, per node). A price that is unknown leaves the cost unknown rather than
guessing.
"""

from __future__ import annotations

import time
from typing import Any

from kit.watch.events import CAPACITY_ERROR, LOSS_KINDS, PREEMPTION, REBALANCE
from kit.watch.ledger import Ledger

SPOT, ON_DEMAND = "spot", "on-demand"


def node_hours(ledger: Ledger, now: float) -> dict[str, float]:
    hours = {SPOT: 0.0, ON_DEMAND: 0.0}
    for node in ledger.all_nodes():
        end = node.until if node.until is not None else now
        hours[node.market if node.market in hours else ON_DEMAND] += max(0.0, end - node.since) / 3600.0
    return hours


def prices_of(spec) -> dict[str, float | None]:
    prices = getattr(spec, "prices", None)
    return {SPOT: getattr(prices, "spot_per_hour", None), ON_DEMAND: getattr(prices, "on_demand_per_hour", None)}


def cost_summary(ledger: Ledger, prices: dict[str, float | None], now: float) -> dict[str, Any]:
    hours = node_hours(ledger, now)
    known = all(prices[m] is not None for m in hours if hours[m] > 0)
    cost = sum(hours[m] * (prices[m] or 0.0) for m in hours) if known else None
    od = prices[ON_DEMAND]
    return {
        "spot_hours": round(hours[SPOT], 6), "on_demand_hours": round(hours[ON_DEMAND], 6),
        "cost": None if cost is None else round(cost, 4),
        # The same node-hours bought on-demand: what not using spot would have cost so far.
        "cost_all_on_demand": None if od is None else round((hours[SPOT] + hours[ON_DEMAND]) * od, 4),
    }


def preemption_counts(ledger: Ledger) -> dict[str, int]:
    """Losses are counted once per instance, whichever sources reported them; agent notices
    (which precede the cloud's confirmation) are counted separately."""
    events = ledger.events(kinds=LOSS_KINDS + (REBALANCE, CAPACITY_ERROR))
    confirmed = [e for e in events if e["source"] != "agent"]
    return {
        "preemptions": len({e["instance"] for e in confirmed if e["kind"] == PREEMPTION}),
        "nodes_lost": len({e["instance"] for e in confirmed if e["kind"] in LOSS_KINDS}),
        "notices": sum(1 for e in events if e["source"] == "agent" and e["kind"] == PREEMPTION),
        "rebalance_recommendations": sum(1 for e in events if e["kind"] == REBALANCE),
        "capacity_errors": sum(1 for e in events if e["kind"] == CAPACITY_ERROR),
    }


def status_report(ledger: Ledger, spec, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    progress = ledger.latest_progress()
    started = ledger.get_meta("job_started")
    decisions = ledger.decisions()
    report: dict[str, Any] = {
        "cluster": spec.name, "cloud": spec.cloud, "market": ledger.market(),
        "job_started": float(started) if started else None,
        "wall_hours": (now - float(started)) / 3600.0 if started else 0.0,
        "nodes": [{"rank": n.rank, "name": n.name, "instance_id": n.instance_id, "market": n.market,
                   "state": n.state, "private_ip": n.private_ip, "zone": n.zone} for n in ledger.nodes(("up", "lost"))],
        "progress": None if not progress else {
            "step": progress["step"], "total_steps": progress["total_steps"],
            "fraction": progress["step"] / progress["total_steps"], "step_time_s": progress["step_time_s"],
            "state": progress["state"], "time": progress["time"]},
        "decisions": [{"id": d.id, "created": d.created, "policy": d.policy, "decision": d.decision,
                       "action": d.action, "from": d.market_before, "to": d.market_after, "status": d.status,
                       "attempts": d.attempts, "reason": d.reason, "error": d.error} for d in decisions],
        "market_switches": sum(1 for d in decisions if d.action == "switch" and d.status == "done"),
        **preemption_counts(ledger),
        **cost_summary(ledger, prices_of(spec), now),
    }
    return report


def render_status(report: dict[str, Any], console) -> None:
    from rich.table import Table

    money = lambda v: "?" if v is None else f"${v:,.2f}"
    progress = report["progress"]
    console.print(f"[bold]{report['cluster']}[/bold] ({report['cloud']})  market: "
                  f"[bold]{report['market'] or 'none'}[/bold]  running {report['wall_hours']:.2f} h")
    if progress:
        console.print(f"progress: step {progress['step']}/{progress['total_steps']} "
                      f"({100 * progress['fraction']:.1f} %), {progress['step_time_s'] or 0:.3f} s/step, "
                      f"{progress['state'] or '?'}")
    else:
        console.print("progress: no heartbeat yet")
    console.print(f"preemptions: {report['preemptions']}  nodes lost: {report['nodes_lost']}  "
                  f"capacity errors: {report['capacity_errors']}  market switches: {report['market_switches']}")
    console.print(f"cost so far: {money(report['cost'])} (spot {report['spot_hours']:.2f} node-h, on-demand "
                  f"{report['on_demand_hours']:.2f} node-h; all on-demand would be "
                  f"{money(report['cost_all_on_demand'])})")
    nodes = Table(title="nodes", title_justify="left")
    for column in ("rank", "name", "instance", "market", "state", "ip"):
        nodes.add_column(column)
    for n in report["nodes"]:
        nodes.add_row(str(n["rank"]), n["name"], n["instance_id"], n["market"] or "?", n["state"], n["private_ip"] or "")
    console.print(nodes)
    decisions = Table(title="decisions (newest first)", title_justify="left")
    for column in ("id", "action", "from", "to", "status", "tries", "reason"):
        decisions.add_column(column)
    for d in report["decisions"][:10]:
        decisions.add_row(str(d["id"]), d["action"], d["from"] or "-", d["to"] or "-", d["status"],
                          str(d["attempts"]), d["reason"] + (f" [red]({d['error'][:80]})[/red]" if d["error"] else ""))
    console.print(decisions)

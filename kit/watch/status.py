"""The ledger's view of a cluster: nodes, market, preemptions, decisions, progress, cost so far.

Cost is each instance's hours (from when an apply brought it up until it was lost, replaced or
released) times its own price per hour, recorded with it from the offer it ran on (zone x shape x
market); rows of older ledgers use the spec's prices (``prices{spot_per_hour,
on_demand_per_hour}``, per node). A price that is unknown leaves the cost unknown rather than
guessing.

The comparison, ``cost_all_on_demand``, is what the *same job* would cost on on-demand from the
start: the simulator's baseline ``N x Q x (d + C0)`` (+ the same final export), with

* ``N x Q`` the cheapest on-demand offer's price for the whole job (the spec's nodes x its
  on-demand price for a spec with one zone and shape);
* ``d`` one launch: this job's first launch as measured (from the start of its apply to the
  trainer's first step, estimated from the first heartbeat after it), else
  ``policy.changeover_hours`` (a deployment adopted from ``kit apply``, or no heartbeat yet);
* ``C0`` the useful compute: the steps done (all of them for a finished job) x the median
  measured step time;
* for a finished job, the time from the trainer's ``done`` until the nodes were released (the
  final export), which an all-on-demand run spends too.

It does not grow with preemptions, redone steps, further changeovers or idle nodes: those are
what using spot risks, and what ``cost`` pays for.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import TYPE_CHECKING, Any

from kit.clock import VirtualClock
from kit.policy import DEFAULT_CHANGEOVER_H
from kit.policy.offers import Moves, offer_parts, region_of
from kit.watch.disks import lifetime_of, releases
from kit.watch.events import CAPACITY_ERROR, NOTICE, PREEMPTION, REBALANCE, STOPPED_BY_KIT
from kit.watch.ledger import Ledger
from training.contract import ON_DEMAND, SPOT

if TYPE_CHECKING:
    from kit.spec import SpecBase


def node_cost(ledger: Ledger, now: float, prices: dict[str, float | None]) -> float | None:
    """$ so far: each incarnation's hours x its own price (the offer it ran on), else, for a row that
    recorded no offer (older ledgers, a deployment adopted from `kit apply`), its market's price in
    ``prices``; None when a price is unknown. A row with its offer's shape and no price ran where kit
    knew no price (kit.watch.acting records None for it): unknown, not the spec's own price."""
    total = 0.0
    for node in ledger.all_nodes():
        end = node.until if node.until is not None else now
        hours = max(0.0, end - node.since) / 3600.0
        price = node.price if node.price is not None or node.shape is not None else prices.get(node.market or ON_DEMAND)
        if price is None:
            if hours > 0:
                return None
            continue
        total += hours * price
    return total


def node_hours(ledger: Ledger, now: float) -> dict[str, float]:
    hours = {SPOT: 0.0, ON_DEMAND: 0.0}
    for node in ledger.all_nodes():
        end = node.until if node.until is not None else now
        hours[node.market if node.market in hours else ON_DEMAND] += max(0.0, end - node.since) / 3600.0
    return hours


def prices_of(spec: SpecBase) -> dict[str, float | None]:
    """$/h per node of the spec's own shape in its own zone, for ledger rows that did not record theirs."""
    here = spec.prices.of(spec.start_zone)
    return {SPOT: here.spot_per_hour, ON_DEMAND: here.on_demand_per_hour}


def changeover_of(spec: SpecBase) -> float:
    return float(spec.policy.changeover_hours)


def median_step_s(ledger: Ledger) -> float | None:
    """The median of every measured step time (seconds of the ledger's clock); None before any."""
    step_times = ledger.recent_step_times(limit=None)
    return statistics.median(step_times) if step_times else None


def compute_hours(ledger: Ledger, steps: int | None, step_s: float | None) -> float | None:
    """Useful compute of ``steps`` steps (default: the newest recorded step), in hours of the
    ledger's clock: steps x the median step time ``step_s``. None before any measurement."""
    if steps is None:
        progress = ledger.latest_progress()
        steps = progress["step"] if progress else None
    if steps is None or step_s is None:
        return None
    return steps * step_s / 3600.0


def startup_hours(ledger: Ledger, step_s: float | None) -> float | None:
    """The first launch's start-up as measured: from the start of its apply to the trainer's step 0
    (the first heartbeat after it, less the steps it had already done x the median step time)."""
    started = ledger.first_launch_started()
    first = ledger.first_progress_after(started) if started is not None else None
    if first is None or step_s is None:
        return None
    step0 = first["time"] - first["step"] * step_s
    return (step0 - started) / 3600.0 if step0 > started else None


def cost_summary(ledger: Ledger, prices: dict[str, float | None], now: float, *, nodes: int = 1,
                 changeover_h: float = DEFAULT_CHANGEOVER_H, steps: int | None = None,
                 finished: bool = False, on_demand_rate: float | None = None) -> dict[str, Any]:
    """Node-hours and cost so far, and the same job on on-demand (module docstring). ``steps``: the
    job's size for a finished job (default: the steps done so far); ``finished``: the nodes were
    released after the trainer's done (the time in between counts for the baseline too);
    ``on_demand_rate``: the whole job's on-demand $/h (default ``nodes`` x the on-demand price)."""
    hours = node_hours(ledger, now)
    cost = node_cost(ledger, now, prices)
    od = on_demand_rate / nodes if on_demand_rate is not None else prices[ON_DEMAND]
    step_s = median_step_s(ledger)  # one read of the heartbeats for both estimates
    useful = compute_hours(ledger, steps, step_s)
    measured = startup_hours(ledger, step_s)
    startup = measured if measured is not None else changeover_h
    done = ledger.done_at() if finished else None
    finish = max(0.0, now - done) / 3600.0 if done is not None else 0.0
    baseline = None if od is None or useful is None else nodes * od * (startup + useful + finish)
    return {
        "spot_hours": round(hours[SPOT], 6), "on_demand_hours": round(hours[ON_DEMAND], 6),
        "cost": None if cost is None else round(cost, 4),
        "compute_hours": None if useful is None else round(useful, 9),
        "startup_hours": round(startup, 9), "startup_measured": measured is not None,
        "finish_hours": round(finish, 9),
        # The same job on on-demand from the start: N x Q x (d + C0 [+ final export]).
        "cost_all_on_demand": None if baseline is None else round(baseline, 4),
    }


def on_demand_rate(spec: SpecBase) -> float | None:
    """The whole job on-demand, $/h: the cheapest on-demand offer (zone x shape) of the spec; None
    when it has none (a type sold only as spot: then its list on-demand price stands in)."""
    rates = [o.price for o in spec.offers() if o.market == ON_DEMAND]
    return min(rates) if rates else None


def cost_of(ledger: Ledger, spec: SpecBase, now: float, *, steps: int | None = None, finished: bool = False) -> dict[str, Any]:
    return cost_summary(ledger, prices_of(spec), now, nodes=spec.nodes, changeover_h=changeover_of(spec),
                        steps=steps, finished=finished, on_demand_rate=on_demand_rate(spec))


def preemption_counts(ledger: Ledger) -> dict[str, int]:
    """Losses are counted once per instance *incarnation* (the node table says how each ended),
    whichever sources reported them: ``preemptions`` is how many nodes the market took (a 2-node gang lost
    once is 2), ``interruptions`` how many times the job was interrupted (that gang loss is 1: what the policy
    counts, kit.watch.watcher); notices (agents', the AWS spot request's two-minute warning),
    which precede the cloud's confirmation, are counted separately. Nodes kit stopped itself (an interrupted
    local run's) were not lost."""
    events = ledger.events(kinds=(PREEMPTION, NOTICE, REBALANCE, CAPACITY_ERROR))
    ended = [n.lost_kind for n in ledger.all_nodes() if n.lost_kind and n.lost_kind != STOPPED_BY_KIT]
    return {
        "preemptions": sum(1 for kind in ended if kind == PREEMPTION),
        "interruptions": ledger.interruptions(),
        "nodes_lost": len(ended),
        "notices": sum(1 for e in events if (e["source"] == "agent" and e["kind"] == PREEMPTION) or e["kind"] == NOTICE),
        "rebalance_recommendations": sum(1 for e in events if e["kind"] == REBALANCE),
        "capacity_errors": sum(1 for e in events if e["kind"] == CAPACITY_ERROR),
    }


def market_switches(ledger: Ledger) -> int:
    """How often the cluster really changed market: consecutive applies that reached the cloud on
    different markets (a switch whose bootstrap failed and was superseded still happened)."""
    markets = ledger.applied_markets()
    return sum(1 for before, after in itertools.pairwise(markets) if before != after)


HOURS_PER_MONTH = 730.0  # the clouds bill disks per GB-month of 730 hours


def disk_report(ledger: Ledger, spec: SpecBase, now: float) -> dict[str, Any]:
    """Every data disk the job used, with its zone, size, hours it existed so far, hours idle (no node on it:
    a zone or shape the job left), cost so far (size x the cloud's $/GB-month over the hours it existed: from
    the node that made it until it was deleted, ``released``, or ``now``; a disk deleted and made again is
    not billed in between; kit.watch.disks.lifetime, the plot's account too); ``disk_cost`` None when the
    disk type's price is unknown."""
    price = spec.cloud_facts.disk_price(spec)
    nodes, deletions = ledger.all_nodes(), releases(ledger)
    disks, total = [], 0.0
    for row in ledger.disks():
        life = lifetime_of(nodes, deletions, row["zone"], {row["disk_id"]}, now)
        cost = None if price is None else spec.disk.size_gb * price * life.hours / HOURS_PER_MONTH
        total += cost or 0.0
        gone = life.deleted
        disks.append({"disk_id": row["disk_id"], "zone": row["zone"], "size_gb": spec.disk.size_gb,
                      "hours": round(life.hours, 6), "idle_hours": round(life.idle_hours, 6),
                      "cost": None if cost is None else round(cost, 4),
                      "released": None if gone is None else gone.time,
                      "released_why": None if gone is None else gone.why})
    return {"disks": disks, "disk_cost": None if price is None else round(total, 4),
            "idle_disk_hours": round(sum(d["idle_hours"] for d in disks), 6)}


def placement_changes(ledger: Ledger, moves: Moves | None = None) -> dict[str, Any]:
    """Where the job ran, apply by apply (zone/shape/market, kit.policy.offers.Offer.name), how often it
    moved to another zone or changed shape on the way, and its probes: the real loop's launch attempts
    on an offer (the capacity search's tries), the failed ones free, as the simulator bills them. Egress
    is priced by ``moves`` (the spec's ``policy.moves()``; default: the clouds' list prices)."""
    moves_cost = moves or Moves()
    offers = ledger.applied_offers()
    failed = [e for e in ledger.events(kinds=(CAPACITY_ERROR,)) if e["detail"].get("offer")]
    parts = [offer_parts(name) for name in offers]
    pairs = list(itertools.pairwise(parts))
    zone_moves = [(a[0], b[0]) for a, b in pairs if a[0] != b[0]]
    return {"offers": offers, "moves": len(zone_moves), "shape_switches": sum(1 for a, b in pairs if a[1] != b[1]),
            "probes": len(offers) + len(failed), "probes_without_capacity": len(failed),
            # $ per GB of checkpoint the moves cost in egress (``moves``' rates): x its size
            "egress_per_checkpoint_gb": round(sum(moves_cost.rate(region_of(a), region_of(b))
                                                  for a, b in zone_moves), 4)}


def route(offers: list[str]) -> str:
    """Where the job ran, for people: the offers in order, a relaunch on the same one (a recovery, a run
    continued after an interrupt) shown once. ``offers`` keeps every apply (each is a probe)."""
    return " -> ".join(offer for i, offer in enumerate(offers) if i == 0 or offer != offers[i - 1])


def move_facts(ledger: Ledger, spec: SpecBase) -> dict[str, Any]:
    """What the capacity search charges a move to another zone (kit.watch.acting): the checkpoint's size
    (``policy.checkpoint_gb``, else the newest the trainer reported, else the simulator's default), where
    that size comes from, and the transfer rate."""
    measured = ledger.checkpoint_gb()
    moves = spec.policy.moves(measured)
    source = "spec" if spec.policy.checkpoint_gb is not None else ("measured" if measured is not None else "default")
    return {"can_move": spec.can_move, "checkpoint_gb": round(moves.checkpoint_gb, 3), "checkpoint_gb_source": source,
            "transfer_gbps": moves.transfer_gbps}


def ledger_now(ledger: Ledger) -> float:
    """Now, on the clock the ledger's times are on: a local job's compressed clock (kept in the
    ledger, kit.clock.VirtualClock), else the wall clock. Without it a
    running local job's status set wall seconds against trace hours (0.01 h run after 1.3 trace hours)."""
    origin, scale, offset = ledger.clock() or (None, None, 0.0)
    if origin is None or scale is None:  # no compressed clock, or one from before its scale was kept
        return time.time()
    return VirtualClock(origin, scale, offset=offset)()


def status_report(ledger: Ledger, spec: SpecBase, now: float | None = None) -> dict[str, Any]:
    now = ledger_now(ledger) if now is None else now
    progress = ledger.latest_progress()
    started = ledger.started_at()
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
        "market_switches": market_switches(ledger),
        **placement_changes(ledger, spec.policy.moves()),
        **move_facts(ledger, spec),
        **disk_report(ledger, spec, now),
        **preemption_counts(ledger),
        **cost_of(ledger, spec, now),
    }
    return report


def render_status(report: dict[str, Any], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    # every name, id, reason and error below comes from the spec, the ledger or a cloud API: escaped, so
    # that rich prints "[...]" in them as it is instead of reading it as markup (or failing on "[/x]")
    money = lambda v: "?" if v is None else f"${v:,.2f}"
    progress = report["progress"]
    console.print(f"[bold]{escape(report['cluster'])}[/bold] ({escape(report['cloud'])})  market: "
                  f"[bold]{escape(report['market'] or 'none')}[/bold]  running {report['wall_hours']:.2f} h")
    if report.get("stopped_with_kit"):
        console.print("[yellow]kit is not running this job: its nodes stopped with it (kit was killed), so the "
                      "figures are as of the ledger's last record; `kit train` again continues[/yellow]")
    if progress:
        console.print(escape(f"progress: step {progress['step']}/{progress['total_steps']} "
                             f"({100 * progress['fraction']:.1f} %), {progress['step_time_s'] or 0:.3f} s/step, "
                             f"{progress['state'] or '?'}"))
    else:
        console.print("progress: no heartbeat yet")
    console.print(f"interruptions: {report['interruptions']}  preemptions: {report['preemptions']}  "
                  f"nodes lost: {report['nodes_lost']}  "
                  f"capacity errors: {report['capacity_errors']}  market switches: {report['market_switches']}  "
                  f"moves: {report['moves']}  shape switches: {report['shape_switches']}  "
                  f"probes: {report['probes']} ({report['probes_without_capacity']} without capacity)")
    if report["offers"]:
        console.print(escape(f"ran on: {route(report['offers'])}"))
    if report["can_move"]:
        console.print(f"a move copies the checkpoint: {report['checkpoint_gb']:g} GB ({report['checkpoint_gb_source']}) "
                      f"at {report['transfer_gbps']:g} Gbit/s")
    console.print(f"cost so far: {money(report['cost'])} (spot {report['spot_hours']:.2f} node-h, on-demand "
                  f"{report['on_demand_hours']:.2f} node-h; the compute done so far, all on-demand: "
                  f"{money(report['cost_all_on_demand'])})")
    nodes = Table(title="nodes", title_justify="left")
    for column in ("rank", "name", "instance", "market", "state", "ip"):
        nodes.add_column(column)
    for n in report["nodes"]:
        nodes.add_row(*(escape(str(v)) for v in (n["rank"], n["name"], n["instance_id"], n["market"] or "?", n["state"],
                                                  n["private_ip"] or "")))
    console.print(nodes)
    disks = Table(title=f"data disks (so far {money(report['disk_cost'])})", title_justify="left")
    for column in ("disk", "zone", "GB", "hours", "idle hours", "cost", "state"):
        disks.add_column(column)
    for d in report["disks"]:
        disks.add_row(escape(str(d["disk_id"])), escape(d["zone"] or "?"), str(d["size_gb"]), f"{d['hours']:.2f}",
                      f"{d['idle_hours']:.2f}", money(d["cost"]), "kept" if d["released"] is None else f"deleted ({d['released_why']})")
    console.print(disks)
    decisions = Table(title="decisions (newest first)", title_justify="left")
    for column in ("id", "action", "from", "to", "status", "tries", "reason"):
        decisions.add_column(column)
    for d in report["decisions"][:10]:
        decisions.add_row(*(escape(str(v)) for v in (d["id"], d["action"], d["from"] or "-", d["to"] or "-", d["status"],
                                                      d["attempts"])),
                          escape(d["reason"]) + (f" [red]({escape(d['error'][:80])})[/red]" if d["error"] else ""))
    console.print(decisions)

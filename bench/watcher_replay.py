"""The real watch loop replayed on a multi-zone market, against the simulated policy on the same market.

``kit simulate`` replays kit's multi-zone ``default`` (``kit.policy.zones.ZoneDefault``); the watcher
decides with the same policy module but through its own parts: the ledger (SQLite), the capacity search of
``kit.watch.acting.Actor`` (each try a launch, a capacity error when there is none, backoff between
searches) and the market policy on the watcher's observation. This bench runs the real ``Watcher``, with
its real ``Actor`` and ``Ledger``, on an in-memory cloud whose spot capacity per zone follows the traces of
bench/zones.py's synthetic markets (each zone its own Markov availability and run length; one price for
every zone, as a local spec has one), and the simulator on the same traces, starts and prices, so the two
can be compared: what the real loop loses (or gains) against the model the benchmarks measure.

The model the in-memory cloud follows is the simulator's (docs/policies.md, "Many zones"): a spot gang has
capacity at a tick when its zone's trace has room for every node; it is lost in the first tick without
room; a launch is billed from the apply and makes progress after the changeover d; progress is kept
across losses (the trainer saves on the preemption notice); on-demand is always there. Moves are free and
instant (checkpoint_gb and egress 0 on both sides), so the comparison is about where and when to launch.

    .venv/bin/python bench/watcher_replay.py                     # seeds 11-13, d = 1, 2, 4 ticks, R0 = 60 h (~4 min)
    .venv/bin/python bench/watcher_replay.py --seeds 11 --d-ticks 4 --deadlines 72
    .venv/bin/python bench/watcher_replay.py --gcp --deadlines 60,72    # the GCP set, 16 nodes, d = 0.2 h, flat prices
    .venv/bin/python bench/watcher_replay.py --gcp --zone-prices --deadlines 60,72   # each zone at its trace's prices
    .venv/bin/python bench/watcher_replay.py --gcp --zone-prices --no-move-tries      # and without voluntary moves

``--zone-prices`` keeps each zone's prices from its trace (GCP prices by region: spot $1.86-8.74/h a node on the
bundled set) and gives them to the watcher's spec as ``prices.zones``; the same loop with one price for every
zone (the spec's own zone's, all a spec could say before ``prices.zones``; the spec lists the zones cheapest
first, so the job starts in the cheapest) runs beside it, as the baseline, and both are billed at each zone's
real prices.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zones import MARKETS, SYNTHETIC_NODES, synthetic_set

from kit.backends.base import Backend, CapacityError, Node
from kit.clouds.local import TRACE_PRICES
from kit.paths import SPOT_TRACES_DIR
from kit.policy.offers import Moves
from kit.policy.zones import moving_market_policy
from kit.simulate.single import Params
from kit.simulate.zones import simulate_zones, zone_market, zone_starts
from kit.spec import SpecBase, parse_spec
from kit.traces import Trace, load_traces
from kit.watch.acting import Actor, Backoff
from kit.watch.events import PROGRESS, Event
from kit.watch.ledger import Ledger
from kit.watch.sources.base import RUNNING, TERMINATED, EventSource, InstanceStatus, Poll
from kit.watch.watcher import Watcher

SPOT_PRICE, ON_DEMAND_PRICE = 1.0, 4.0  # $/h per node, every zone (a local spec has one price per market)
JOB_H = 48.0
STEP_S = 36.0  # trainer step time: 100 steps an hour


def flat_priced(traces: list[Trace]) -> list[Trace]:
    """The traces with one spot price for every zone (the local spec's)."""
    return [replace(t, prices=None, metadata={**t.metadata, "spot_price_per_hour": SPOT_PRICE,
                                              "on_demand_price_per_hour": ON_DEMAND_PRICE}) for t in traces]


class TraceCloud(Backend):
    """An in-memory cloud whose spot capacity per zone is a trace's, one trace tick per ``tick_s``."""

    cloud = "local"

    def __init__(self, traces: dict[str, Trace], nodes: int, clock) -> None:
        self.traces, self.size, self.clock = traces, nodes, clock
        self.start_s = clock()
        self.first_tick = 0
        self.deployed: list[Node] = []
        self.gone: dict[str, Node] = {}
        self.serial = 0
        self.launched_at = 0.0

    def tick_index(self) -> int:
        gap = next(iter(self.traces.values())).gap_seconds
        return self.first_tick + round((self.clock() - self.start_s) / gap)

    def room(self, zone: str) -> bool:
        return self.traces[zone].data[self.tick_index()] >= self.size

    def apply(self, spec: SpecBase, market: str) -> list[Node]:
        """As kit's Terraform apply: nodes of another zone or market are replaced, destroyed before the new
        ones are created (a data disk attaches to one instance at a time; a move to another region destroys
        the old cluster first), so an apply that then finds no capacity leaves nothing running."""
        zone = spec.start_zone
        same = self.deployed and all(n.market == market and n.zone == zone for n in self.deployed)
        if not same:
            self.deployed = []
        if market == "spot" and not self.room(zone):
            raise CapacityError(f"no spot capacity in {zone}")
        if not same:
            for rank in range(self.size):
                self.serial += 1
                self.deployed.append(Node(name=f"node-{rank}", instance_id=f"i-{self.serial}", rank=rank,
                                          market=market, zone=zone, disk_id=f"{zone}-{rank}"))
            self.launched_at = self.clock()
        return list(self.deployed)

    def nodes(self) -> list[Node]:
        return list(self.deployed)

    def bootstrap(self, nodes: list[Node]) -> None:
        pass

    def destroy(self, keep_disks: bool = True) -> None:
        self.deployed = []

    def disk_set(self, zone: str | None, shape: str | None) -> str | None:
        return zone

    def release_disks(self, name: str) -> None:
        pass

    def lose_spot(self) -> None:
        """The trace's tick: a spot gang without room in its zone is lost (every node)."""
        if self.deployed and self.deployed[0].market == "spot" and not self.room(self.deployed[0].zone or ""):
            self.gone.update({n.instance_id: n for n in self.deployed})
            self.deployed = []


class CloudView(EventSource):
    """The cloud API's view: deployed nodes run, lost ones are terminated as spot reclaims."""

    name = "local"

    def __init__(self, cloud: TraceCloud) -> None:
        self.cloud = cloud

    def poll(self) -> Poll:
        poll = Poll([InstanceStatus(n.instance_id, RUNNING, n.market) for n in self.cloud.deployed])
        poll.instances += [InstanceStatus(i, TERMINATED, n.market, preempted=True, reason="spot reclaim")
                           for i, n in self.cloud.gone.items()]
        return poll


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def zone_prices(traces: list[Trace]) -> dict[str, dict[str, float]]:
    """Each zone's $/h per node from its trace's metadata, as a spec's ``prices.zones``."""
    return {t.name: {key: float(t.metadata[found]) for key, found in TRACE_PRICES.items()} for t in traces}


def spec_for(zones: list[str], params: Params, prices: dict | None = None) -> SpecBase:
    """The job's spec: ``prices`` a spec's ``prices`` section (default: one price for every zone)."""
    prices = prices or {"spot_per_hour": SPOT_PRICE, "on_demand_per_hour": ON_DEMAND_PRICE}
    return parse_spec({"name": "replay", "cloud": "local", "nodes": params.nodes, "market": "spot", "zones": zones,
                       "prices": prices,
                       "policy": {"name": "default", "changeover_hours": params.changeover_h,
                                  "deadline_hours": params.deadline_h, "checkpoint_gb": 0.001, "egress_per_gb": 0,
                                  "transfer_gbps": 1000}})


def replay_watcher(traces: list[Trace], start: int, params: Params, workdir: Path, *, prices: dict | None = None,
                   billed: dict[str, dict[str, float]] | None = None,
                   on_tick: Callable[[int, Path], None] | None = None) -> dict:
    """One start of the real watch loop: cost vs on-demand, deadline met, launches. ``prices``: the spec's
    (default: one for every zone); ``billed``: each zone's real prices, which the cost is counted at (default:
    the flat prices); ``on_tick(i, ledger file)`` after each tick the watcher made (bench/memory.py)."""
    gap = traces[0].gap_seconds
    tick_h = gap / 3600.0
    clock = Clock(1_000_000.0)
    cloud = TraceCloud({t.name: t for t in traces}, params.nodes, clock)
    cloud.first_tick = start
    spec = spec_for([t.name for t in traces], params, prices)
    ledger_path = Path(tempfile.mkdtemp(dir=workdir)) / "ledger.sqlite"
    ledger = Ledger(ledger_path)  # a fresh ledger for each run
    actor = Actor(cloud, ledger, spec, backoff=Backoff(initial_s=1.0, cap_s=1.0, jitter=0.0), clock=clock)
    watcher = Watcher(spec, ledger, actor, moving_market_policy(), source=CloudView(cloud), interval_s=gap, clock=clock)
    watcher.start()
    progress, total = 0.0, int(JOB_H * 3600 / STEP_S)
    end = len(traces[0].data) - start - 1
    for i in range(end):
        clock.t = 1_000_000.0 + i * gap
        cloud.lose_spot()
        step = min(total, int(progress * 3600 / STEP_S))
        ledger.record(Event(kind=PROGRESS, instance="node-0", time=clock.t, source="agent", node_rank=0,
                            detail={"state": "done" if step >= total else "running"}, step=step, total_steps=total,
                            step_time_s=STEP_S, written=clock.t))
        if step >= total:
            break
        watcher.tick()
        if on_tick is not None:
            on_tick(i, ledger_path)
        if cloud.deployed:  # progress through the next tick, after the changeover
            useful_from = cloud.launched_at + params.changeover_h * 3600
            progress += max(0.0, min(gap, clock.t + gap - useful_from)) / 3600
    flat = {"spot_per_hour": SPOT_PRICE, "on_demand_per_hour": ON_DEMAND_PRICE}
    rate = {z: (billed or {}).get(z, flat) for z in cloud.traces}
    cost = sum(((n.until if n.until is not None else clock.t) - n.since) / 3600 * rate[n.zone or ""][
        "spot_per_hour" if n.market == "spot" else "on_demand_per_hour"] for n in ledger.all_nodes())
    q_min = min(r["on_demand_per_hour"] for r in rate.values())  # the simulator's baseline: the cheapest zone
    base = params.nodes * q_min * (params.job_h + params.changeover_h)
    finished_h = (clock.t - 1_000_000.0) / 3600
    launches = len({n.apply_id for n in ledger.all_nodes()})
    tries = sum(1 for d in ledger.decisions() if d.action == "move")  # voluntary moves tried (Actor.move_due)
    ledger.close()
    return {"cost_vs_on_demand": cost / base, "launches": launches, "move_tries": tries,
            "missed": progress < JOB_H - 1e-9 or finished_h > params.deadline_h + tick_h}


def compare(traces: list[Trace], params: Params, workdir: Path, *, priced: bool = False) -> dict:
    """opt, the simulated ``default`` and the watcher on one market; ``priced``: each zone at its trace's prices,
    with the watcher that knows them (``prices.zones``) and the one that has one price for every zone."""
    # priced: the spec lists the zones cheapest first, so the job starts where spot is cheapest, as one would write it
    traces = sorted(traces, key=lambda t: (t.metadata["spot_price_per_hour"], t.name)) if priced else flat_priced(traces)
    moves = Moves(checkpoint_gb=0.001, transfer_gbps=1000, egress_per_gb=0.0)
    sim = simulate_zones(traces, ["opt", "default"], params, moves)["cost_vs_on_demand"]
    starts = zone_starts(zone_market(traces, params, moves), params)
    billed = zone_prices(traces) if priced else None
    known = {**billed[traces[0].name], "zones": billed} if billed else None
    runs = [replay_watcher(traces, s, params, workdir, prices=known, billed=billed) for s in starts]
    row = {"deadline_h": params.deadline_h, "opt": sim["opt"], "simulated": sim["default"],
           "watcher": mean(r["cost_vs_on_demand"] for r in runs), "watcher_misses": sum(r["missed"] for r in runs),
           "move_tries": mean(r["move_tries"] for r in runs)}
    if billed:  # the baseline: the same loop with one price for every zone, the first (cheapest) zone's
        one = [replay_watcher(traces, s, params, workdir, prices=billed[traces[0].name], billed=billed) for s in starts]
        row |= {"watcher_one_price": mean(r["cost_vs_on_demand"] for r in one),
                "one_price_misses": sum(r["missed"] for r in one)}
    return row


def settings(args: argparse.Namespace):
    """(label, traces, params) of each row: the synthetic markets, or with ``--gcp`` the bundled GCP set."""
    deadlines = [float(x) for x in args.deadlines.split(",")]
    if args.gcp:
        traces = load_traces([SPOT_TRACES_DIR / "gcp-a3-h100-2025-10"])
        for label, prefix in MARKETS:
            for deadline in deadlines:
                params = Params(nodes=args.nodes, job_h=JOB_H, deadline_h=deadline, changeover_h=0.2, starts=8)
                yield f"{label}, N={args.nodes}, d=0.2 h", [t for t in traces if t.name.startswith(prefix or "")], params
        return
    for seed in map(int, args.seeds.split(",")):
        for d in map(int, args.d_ticks.split(",")):
            for deadline in deadlines:
                params = Params(nodes=SYNTHETIC_NODES, job_h=JOB_H, deadline_h=deadline, changeover_h=d / 6, starts=8)
                yield f"seed {seed}, d={d} ticks", synthetic_set(seed), params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="11,12,13")
    parser.add_argument("--d-ticks", default="1,2,4")
    parser.add_argument("--deadlines", default="60")
    parser.add_argument("--gcp", action="store_true", help="the bundled GCP H100 set (13 zones, then one region "
                        "at a time) instead of the synthetic markets")
    parser.add_argument("--nodes", type=int, default=16, help="the gang with --gcp (default 16)")
    parser.add_argument("--zone-prices", action="store_true", help="each zone at its trace's prices, known to the "
                        "watcher's spec (prices.zones), beside the same loop with one price for every zone")
    parser.add_argument("--no-move-tries", action="store_true", help="the watcher without its voluntary moves "
                        "(Actor.move_due patched to never find one due), to measure what they do")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    logging.getLogger("kit.watch").setLevel(logging.ERROR)  # each capacity error and loss is a warning
    if args.no_move_tries:
        Actor.move_due = lambda self, slack_h, tick_h: None  # type: ignore[method-assign]
    rows = []
    extra = ("watcher, one price for every zone", "with prices.zones / one price") if args.zone_prices else ()
    print("| market | R0 | opt | simulated default | watcher | watcher / simulated | watcher misses | move tries |"
          + "".join(f" {h} |" for h in extra))
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(extra))
    with tempfile.TemporaryDirectory() as tmp:
        for label, traces, params in settings(args):
            row = {"market": label, **compare(traces, params, Path(tmp), priced=args.zone_prices)}
            rows.append(row)
            line = (f"| {label} | {params.deadline_h:g} h | {row['opt']:.4f} | {row['simulated']:.4f} | "
                    f"{row['watcher']:.4f} | {row['watcher'] / row['simulated']:.3f} | {row['watcher_misses']} | "
                    f"{row['move_tries']:.1f} |")
            if args.zone_prices:
                line += (f" {row['watcher_one_price']:.4f} ({row['one_price_misses']}) | "
                         f"{row['watcher'] / row['watcher_one_price']:.3f} |")
            print(line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

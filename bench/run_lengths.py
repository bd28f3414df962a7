"""How long spot runs last once they have lasted a while, and what that does to ``default``'s launches.

    .venv/bin/python bench/run_lengths.py            # GCP H100 set, 16 nodes (~15 s)
    .venv/bin/python bench/run_lengths.py --nodes 1 --deadline-hours 72
    .venv/bin/python bench/run_lengths.py --region us-central1
    .venv/bin/python bench/run_lengths.py --synthetic 11 --nodes 2   # a synthetic set of bench/zones.py

Every policy of kit/policy prices a spot run as exponential (memoryless: a run that has held an hour is
as likely to end in the next tick as one that just began). This measures that assumption on a trace set:

1. the hazard of its runs (a run: consecutive ticks with capacity for the job's nodes), per zone and
   pooled: of the runs that lasted k ticks, the share that ends at k, and the mean of the rest. Runs
   with a constant chance of ending per tick (geometric, the exponential on ticks) have the same share
   and the same rest at every k, so per zone "mean ticks beyond the first" equals the mean run; pooled
   over zones a mixture of such zones already shows a falling share, so only the per-zone columns test
   the assumption;
2. the multi-zone ``default`` replayed on the set (every zone at once, C0 = 48 h, d = 0.2 h, R0 = 60 h
   unless ``--deadline-hours``, 8 starts):
   its spot runs split by whether the launch landed on a *fresh* run (the zone had no capacity in the tick
   before, so the run's age is under a tick) or an older one, and the share of each that ended after one
   tick (a changeover of 0.2 h is longer than a 10-minute tick: those made no progress); and what its
   changeovers cost, beside its whole cost and ``opt``'s;
3. after each one-tick gap of a zone, how long its capacity then holds, against how long the capacity of
   the other zones of its region that are up at that tick goes on;
4. what a move to a cheaper zone's run pays once that run has lasted k ticks (runs that have lasted long
   last longer: the hazard falls), for a job that otherwise stays on the offer whose whole trace gives the
   cheapest progress (``--from-zone`` to choose another): the hours of progress the rest of the run gives
   after the launch, the saving on them less the launch there and the launch back (changeovers, transfers
   and egress), and per 48 hours of trace the sum over its runs less the probes that watch a run's age
   (one minute billed for each tick a probe finds it up, until age k). This is the causal policy's share
   of what ``opt``, which foresees run lengths, takes from the cheap zones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import replay_args
from zones import synthetic_set

from kit.policy.offers import Moves, region_of
from kit.simulate.single import Params
from kit.simulate.zones import ZoneSet, policies_for, replay, simulate_opt_zones, zone_market, zone_starts
from kit.traces import load_traces

AGES = (1, 2, 3, 6, 12, 36)  # ticks a run has lasted


def runs_of(up) -> list[int]:
    """Lengths (ticks) of the runs of True in ``up``; a run cut by either end of the trace is left out
    (its length is not known)."""
    a = np.concatenate(([False], np.asarray(up, dtype=bool), [False]))
    starts, ends = np.flatnonzero(~a[:-1] & a[1:]), np.flatnonzero(a[:-1] & ~a[1:])
    whole = (starts > 0) & (ends < len(a) - 2)
    return [int(n) for n in (ends - starts)[whole]]


def hazard(runs: list[int]) -> list[tuple[int, int, float, float]]:
    """(k, runs that lasted k ticks, share of those that end at k, mean ticks beyond k) for each age in AGES."""
    r = np.asarray(runs)
    out = []
    for k in AGES:
        lasted = r[r >= k]
        if len(lasted):
            out.append((k, len(lasted), float(np.mean(lasted == k)), float(np.mean(lasted - k))))
    return out


def ticks_up(up, i: int) -> int:
    """Ticks ``up`` holds from tick ``i`` on (0 when it is down there)."""
    n = 0
    while i + n < len(up) and up[i + n]:
        n += 1
    return n


def gap_returns(market: ZoneSet) -> dict[str, list[int]]:
    """After every one-tick gap of a zone (up, down, up): how long its capacity then holds ("back"), and how
    long the capacity of each other zone of the same region that is up at that tick goes on ("other"), in
    ticks. A job relaunching after a one-tick loss chooses between the two."""
    out: dict[str, list[int]] = {"back": [], "other": []}
    spot = [o for o in market.offers if o.spot]
    for offer in spot:
        up = market.avail[offer]
        for t in range(1, len(up) - 1):
            if up[t - 1] and not up[t] and up[t + 1]:
                out["back"].append(ticks_up(up, t + 1))
                out["other"] += [ticks_up(market.avail[o], t + 1) for o in spot if o.zone != offer.zone
                                 and region_of(o.zone) == region_of(offer.zone) and market.avail[o][t + 1]]
    return out


def launches(market: ZoneSet, params: Params, moves: Moves) -> tuple[dict[str, list[int]], dict[str, float]]:
    """``default``'s spot runs on ``market``, by the age of the capacity it launched on: fresh or older
    (each value: the lengths in ticks the job held them), and its mean cost per start, of which
    changeovers and egress, with ``opt``'s, all relative to the on-demand baseline."""
    out: dict[str, list[int]] = {"fresh": [], "older": []}
    parts = {"default": 0.0, "changeovers": 0.0, "egress": 0.0, "opt": 0.0}
    offers = {o.name: o for o in market.offers}
    starts = zone_starts(market, params)
    baseline = market.baseline(params) * len(starts)
    for start in starts:
        run = replay(market, start, params, moves, policies_for("default", market, moves, start)[0], record=True)
        for key, dollars in (("default", run.cost), ("changeovers", run.changeover_cost), ("egress", run.egress),
                             ("opt", simulate_opt_zones(market, start, params, moves).cost)):
            parts[key] += dollars / baseline
        held: list[list] = []  # [offer name, ticks, first tick]
        for i, row in enumerate(run.timeline):
            if held and held[-1][0] == row["offer"]:
                held[-1][1] += 1
            else:
                held.append([row["offer"], 1, i])
        for name, ticks, first in held:
            offer = offers.get(name) if name else None
            if offer is None or not offer.spot:
                continue
            before = start + first - 1
            fresh = before >= 0 and not market.avail[offer][before]
            out["fresh" if fresh else "older"].append(ticks)
    return out, parts


def stay_offer(market: ZoneSet, params: Params):
    """The spot offer whose whole trace gives the cheapest progress: its mean price x the hours its runs
    hold over the hours they make after a changeover each."""
    def price(offer):
        hours = np.asarray(runs_of(market.avail[offer])) * market.G
        useful = np.maximum(0.0, hours - params.changeover_h).sum()
        return float(np.mean(market.prices[offer])) * hours.sum() / useful if useful > 0 else float("inf")
    return min((o for o in market.offers if o.spot), key=price)


def aged_moves(market: ZoneSet, params: Params, moves: Moves, home) -> list[tuple]:
    """For each spot offer cheaper than ``home`` and each age k in AGES: (zone, price / q_min, k, runs that
    lasted k ticks, mean hours of progress after a move at k, net saving per move in hours of the cheapest
    on-demand offer, and net saving per 48 h of trace, before and after the probes, relative to the job's
    on-demand baseline N x Q_min x (C0 + d), the unit of ``cost_vs_on_demand``). See the module's
    docstring, part 4."""
    out = []
    here = float(np.mean(market.prices[home]))
    span_h = market.ticks * market.G
    for offer in market.offers:
        price = float(np.mean(market.prices[offer])) if offer.spot else 0.0
        if not offer.spot or price >= here:
            continue
        there_h = moves.launch_h(params.changeover_h, home.zone, offer.zone)
        back = moves.launch_h(params.changeover_h, offer.zone, home.zone) * here + 2 * moves.egress(home.zone, offer.zone)
        runs = np.asarray(runs_of(market.avail[offer]))
        for k in AGES:
            rest_h = (runs[runs >= k] - k) * market.G
            if not len(rest_h):
                continue
            progress = np.maximum(0.0, rest_h - there_h)
            net = progress * (here - price) - there_h * price - back
            watched = np.minimum(runs, k).sum() * price / 60
            unit = market.baseline(params) * span_h / 48
            out.append((offer.zone, price / market.q_min, k, len(rest_h), float(progress.mean()),
                        float(net.mean()) / market.q_min, net.sum() / unit, (net.sum() - watched) / unit))
    return out


def main() -> int:
    def extra(ap):
        ap.add_argument("--nodes", type=int, default=16)
        ap.add_argument("--deadline-hours", type=float, default=60.0)
        ap.add_argument("--region", default="", help="only the zones whose names start with this (us-east4)")
        ap.add_argument("--from-zone", default="", help="part 4: the zone the job stays on (default: the spot "
                        "offer whose whole trace gives the cheapest progress)")
        ap.add_argument("--synthetic", type=int, default=None, metavar="SEED",
                        help="bench/zones.py's synthetic Markov set of this seed instead of --traces")

    args = replay_args.parse(__doc__, extra)
    traces = load_traces([args.traces]) if args.synthetic is None else synthetic_set(args.synthetic)
    traces = [t for t in traces if t.name.startswith(args.region)]
    name = args.traces.name if args.synthetic is None else f"synthetic set, seed {args.synthetic}"
    params = Params(nodes=args.nodes, job_h=48.0, deadline_h=args.deadline_hours, changeover_h=0.2, starts=8)
    moves = Moves()
    market = zone_market(traces, params, moves)
    pooled: list[int] = []
    print(f"{name}, {args.nodes} nodes, {market.G * 60:g}-minute ticks\n")
    print("| zone | runs | mean run (ticks) | share of 1 tick | mean ticks beyond the first, when it outlasts it |\n|---|---:|---:|---:|---:|")
    for offer in market.offers:
        if not offer.spot:
            continue
        runs = runs_of(market.avail[offer])
        pooled += runs
        if len(runs) >= 3:
            first = hazard(runs)
            rest = next((h[3] for h in first if h[0] == 2), float("nan")) + 1
            print(f"| {offer.zone} | {len(runs)} | {np.mean(runs):.1f} | {first[0][2]:.2f} | {rest:.1f} |")
    print(f"\nAll zones' runs ({len(pooled)}): an exponential would end the same share at every age\n")
    print("| lasted k ticks | runs | share ending at k | mean ticks beyond k |\n|---:|---:|---:|---:|")
    for k, n, ends, beyond in hazard(pooled):
        print(f"| {k} | {n} | {ends:.3f} | {beyond:.1f} |")
    print("\nAfter a one-tick gap: the zone's capacity back, or another zone of its region up then\n")
    print("| capacity | cases | median ticks it holds | mean |\n|---|---:|---:|---:|")
    for kind, ticks in gap_returns(market).items():
        if ticks:
            print(f"| {kind} | {len(ticks)} | {np.median(ticks):g} | {np.mean(ticks):.1f} |")
    print_aged_moves(market, params, moves, args.from_zone)
    held, parts = launches(market, params, moves)
    print(f"\nThe multi-zone default's spot runs (R0 = {args.deadline_hours:g} h, 8 starts)\n")
    print("| launched on | runs | held 1 tick | held 2 ticks |\n|---|---:|---:|---:|")
    for kind, ticks in held.items():
        t = np.asarray(ticks)
        print(f"| {kind} capacity | {len(t)} | {np.mean(t == 1):.2f} | {np.mean(t == 2):.2f} |")
    print(f"\nCost vs on-demand: default {parts['default']:.4f}, of which changeovers and transfers "
          f"{parts['changeovers']:.4f} and egress {parts['egress']:.4f}; opt {parts['opt']:.4f}")
    return 0


def print_aged_moves(market: ZoneSet, params: Params, moves: Moves, from_zone: str) -> None:
    home = (next(o for o in market.offers if o.spot and o.zone == from_zone) if from_zone
            else stay_offer(market, params))
    print(f"\nA move from {home.zone} ({float(np.mean(market.prices[home])) / market.q_min:.3f} of on-demand) to a "
          f"cheaper zone's run once it has lasted k ticks (hours of on-demand per job, d = {params.changeover_h:g} h)\n")
    print("| zone | price | k | runs | progress after the move (h) | net per move (h) | net per 48 h "
          "(of the baseline) | the same, probes paid |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for zone, price, k, n, progress, net, per_48, probed in aged_moves(market, params, moves, home):
        print(f"| {zone} | {price:.3f} | {k} | {n} | {progress:.2f} | {net:+.3f} | {per_48:+.4f} | {probed:+.4f} |")


if __name__ == "__main__":
    raise SystemExit(main())

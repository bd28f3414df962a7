"""How much of the multi-zone ``default``'s gap to ``opt`` is foresight, on the rows of bench/zones.py it misses.

    .venv/bin/python bench/zone_bounds.py [--out bench-zone-bounds.json]   # ~2 min

``default`` is replayed with *oracles*: the same policy, told something about the market that no policy can
know (a trace's future, or how long another zone has been up without probing it). They are analysis, not
policies: each reads the traces directly and would fail the no-leak test of tests/unit/kit/simulate.

* ``watch``: on spot, it knows for free how long each zone whose spot price is at least 20 % below the
  running one has been up, and moves there once that run has lasted an hour (6 ticks);
* ``no-short``: it never launches a spot run that ends within two ticks (before it makes progress);
* ``launch``: when it launches spot, it launches the up offer whose coming run is cheapest per hour of
  progress (its changeover and transfer included), not the one its ranking finds first;
* ``launch+move``: and on spot it moves whenever an up offer's coming run is 5 % cheaper per hour of
  progress than the rest of the running one;
* ``spot-runs``: ``launch+move``, and off spot it launches the best up offer exactly when its coming run
  saves more than its changeovers cost against on-demand (from on-demand, the launch back included):
  every decision about a spot run is made knowing how long it will last; only waiting through an
  outage (no spot anywhere) and going on-demand then are left to ``default``.

If even ``launch+move`` stays above 1.10 x ``opt``, the rest of the gap is not where to launch or when to
move but when to wait, which needs the foresight ``opt`` has. Prints a Markdown table (docs/benchmarks.md,
"Many zones").
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import replay_args
from zones import MARKETS, synthetic_params, synthetic_set

from kit.policy.offers import Moves, Offer
from kit.policy.zones import ZoneDefault, ZoneObservation, finishing_offer
from kit.simulate.single import Params
from kit.simulate.zones import ZoneSet, replay, simulate_opt_zones, zone_market, zone_starts
from kit.traces import load_traces

WATCH_MARGIN, WATCH_TICKS, SHORT_TICKS, MOVE_GAIN = 0.2, 6, 2, 0.05
ORACLES = ("watch", "no-short", "launch", "launch+move", "spot-runs")


class Oracle(ZoneDefault):
    """``default``, told what ``kind`` (one of ORACLES) says by reading the market's traces."""

    def __init__(self, market: ZoneSet, start: int, moves: Moves, kind: str) -> None:
        super().__init__(market.offers, moves, seed=start)
        self.avail, self.start, self.G, self.kind = market.avail, start, market.G, kind

    def _up_run(self, offer: Offer, obs: ZoneObservation, step: int, most: int | None = None) -> int:
        """Ticks ``offer`` stays up from now on (step 1) or has been up until now (step -1)."""
        series, i, n = self.avail[offer], self.start + round(obs.now_h / self.G), 0
        while 0 <= i < len(series) and series[i] and (most is None or n < most):
            i, n = i + step, n + 1
        return n

    def _per_progress(self, offer: Offer, obs: ZoneObservation, lost_h: float) -> float:
        """$ per hour of progress over the coming run on ``offer``, ``lost_h`` of it without progress."""
        use = min(self._up_run(offer, obs, 1) * self.G - lost_h, obs.remaining_h)
        return offer.price * (use + lost_h) / use if use > 0 else math.inf

    def _decide(self, obs: ZoneObservation, market) -> list[Offer]:
        plan = super()._decide(obs, market)
        on_spot = obs.running is not None and obs.running.spot
        launching = bool(plan) and plan[0].spot and plan[0] != obs.running
        if self.kind == "watch" and on_spot:
            return self._watch(obs, plan)
        if self.kind == "no-short":
            return [o for o in plan if not o.spot or o == obs.running
                    or self._up_run(o, obs, 1, SHORT_TICKS) >= SHORT_TICKS]
        if self.kind == "spot-runs" and not on_spot:
            return self._spot_run_pays(obs, plan)
        if self.kind in ("launch", "launch+move", "spot-runs") and launching:
            best = self._best_coming(obs, exclude=None)
            return [best[1]] if best else plan
        if self.kind in ("launch+move", "spot-runs") and on_spot:
            assert obs.running is not None
            best = self._best_coming(obs, exclude=obs.running)
            if best and best[0] < self._per_progress(obs.running, obs, 0.0) * (1 - MOVE_GAIN):
                return [best[1]]
        return plan

    def _spot_run_pays(self, obs: ZoneObservation, plan: list[Offer]) -> list[Offer]:
        """Off spot: launch the up offer whose coming run is cheapest per hour of progress if that run saves
        more than on-demand would cost for the same progress; else what ``default`` planned, on-demand or
        nothing (never a spot launch)."""
        best = self._best_coming(obs, exclude=None)
        od = obs.running if obs.running is not None else finishing_offer(obs, self.offers, self.moves)[0]
        if best is not None and best[0] < od.price:
            offer = best[1]
            lost = self.moves.launch_h(obs.changeover_h, obs.checkpoint_zone, offer.zone)
            use = min(self._up_run(offer, obs, 1) * self.G - lost, obs.remaining_h)
            back = od.price * obs.changeover_h if obs.running is not None else 0.0  # the launch back to on-demand
            if use * (od.price - best[0]) > back:
                return [offer]
        return [o for o in plan if not o.spot]

    def _watch(self, obs: ZoneObservation, plan: list[Offer]) -> list[Offer]:
        assert obs.running is not None
        cheaper = sorted((o for o in self.spot_offers() if o.zone != obs.running.zone
                          and o.price <= obs.running.price * (1 - WATCH_MARGIN)), key=lambda o: o.price)
        held = [o for o in cheaper if self._up_run(o, obs, -1, WATCH_TICKS + 1) > WATCH_TICKS]
        return [held[0], obs.running] if held and len(plan) == 1 else plan

    def _best_coming(self, obs: ZoneObservation, exclude: Offer | None) -> tuple[float, Offer] | None:
        """($ per hour of progress, offer) of the up spot offer whose coming run is cheapest (None: none up)."""
        rated = [(self._per_progress(o, obs, self.moves.launch_h(obs.changeover_h, obs.checkpoint_zone, o.zone)), o)
                 for o in self.spot_offers() if o != exclude and self._up_run(o, obs, 1, 1)]
        return min(rated, key=lambda x: x[0]) if rated else None


def bounds(traces, params: Params, moves: Moves) -> dict[str, float]:
    """Mean cost vs on-demand of default, each oracle and opt over the starts of ``params``."""
    market = zone_market(traces, params, moves)
    starts = zone_starts(market, params)
    cost = {name: 0.0 for name in ("default", *ORACLES, "opt")}
    for s in starts:
        cost["default"] += replay(market, s, params, moves, ZoneDefault(market.offers, moves, seed=s)).cost_vs_on_demand
        for kind in ORACLES:
            cost[kind] += replay(market, s, params, moves, Oracle(market, s, moves, kind)).cost_vs_on_demand
        cost["opt"] += simulate_opt_zones(market, s, params, moves).cost_vs_on_demand
    return {k: v / len(starts) for k, v in cost.items()}


def settings(traces) -> list[tuple[str, list, Params]]:
    """The GCP rows of bench/zones.py that miss 1.10 x opt, and its two reported synthetic rows that lose to
    the best zone's ``up`` (5 zones, 2 nodes, d = 4 ticks, R0 = 60 h)."""
    out = []
    for label, prefix in MARKETS:
        ts = [t for t in traces if prefix is None or t.name.startswith(prefix)]
        for deadline in (60.0, 72.0):
            out.append((f"{label}, N=16, R0={deadline:g}", ts,
                        Params(nodes=16, job_h=48.0, deadline_h=deadline, changeover_h=0.2, starts=8)))
    for seed in (11, 13):
        out.append((f"synthetic seed {seed}, d=4 ticks, R0=60", synthetic_set(seed), synthetic_params(4, 60.0)))
    return out


def main() -> None:
    args = replay_args.parse(__doc__)
    md = ["| setting | default | " + " | ".join(ORACLES) + " | opt |", "|---|" + "---:|" * (len(ORACLES) + 2)]
    out = {}
    for label, ts, params in settings(load_traces([args.traces])):
        cost = bounds(ts, params, Moves())
        out[label] = cost
        md.append(f"| {label} | " + " | ".join(
            f"{cost[k]:.4f} ({cost[k] / cost['opt']:.3f})" for k in ("default", *ORACLES)) + f" | {cost['opt']:.4f} |")
        print(md[-1], file=sys.stderr, flush=True)
    print("\n".join(["mean cost vs on-demand (× `opt`)", "", *md]))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""How much of ``default`` against ``failover`` is one draw of their shuffles, on rows of bench/zones.py.

    .venv/bin/python bench/zone_seeds.py [--region us-east4] [--nodes 4,1] [--seeds 10]   # ~1 min
    .venv/bin/python bench/zone_seeds.py --region '' --nodes 16 --per-start            # ~1 min

bench/zones.py replays each policy once per start, its random choices seeded by the start: ``failover``
shuffles the zones it tries (SkyPilot's EAGER_NEXT_REGION with the Spell seed's shuffle) and ``default``
breaks ties between equally ranked zones the same way. Where the two policies are within a few ten-thousandths
of on-demand of each other, that one draw decides which is "below". This replays both with ``--seeds``
seeds per start (the start's own, as bench/zones.py, and others) and prints, per row, the draw bench/zones.py
reports and the mean, least and greatest of the seeds' mean costs (``--traces``, the GCP H100 set unless
given; C0 = 48 h, d = 0.2 h, 8 starts). With ``--per-start``, each start of each row instead: ``opt`` and
``default``'s mean over the seeds of its cost, the hour its job was done, its launches, those of them whose
run ended before its changeover did (no progress), and what its changeovers and transfers cost, as a share of
the baseline (where a row's gap to ``opt`` comes from: launches wasted, or where the job ran).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import replay_args

from kit.policy.offers import Moves
from kit.policy.zones import make_zone_policy
from kit.simulate.single import Params
from kit.simulate.zones import ZoneRun, replay, simulate_opt_zones, zone_market, zone_starts
from kit.traces import Trace, load_traces

POLICIES = ("default", "failover")
SEED_STRIDE = 100_003  # seed k of a start: start + k x this (k = 0 is bench/zones.py's draw)


class Row:
    """One row of bench/zones.py: the market of ``traces`` for N = ``nodes`` and R0 = ``deadline``, and its starts."""

    def __init__(self, traces: list[Trace], nodes: int, deadline: float) -> None:
        self.params = Params(nodes=nodes, job_h=48.0, deadline_h=deadline, changeover_h=0.2, starts=8)
        self.moves = Moves()
        self.market = zone_market(traces, self.params, self.moves)
        self.starts = zone_starts(self.market, self.params)

    def replay(self, name: str, start: int, k: int) -> ZoneRun:
        """``name`` from ``start`` with seed k of that start."""
        policy = make_zone_policy(name, self.market.offers, self.moves, seed=start + k * SEED_STRIDE)
        return replay(self.market, start, self.params, self.moves, policy)


def seed_means(traces: list[Trace], nodes: int, deadline: float, seeds: int) -> dict[str, list[float]]:
    """Each policy's mean cost over the 8 starts, once per seed."""
    row = Row(traces, nodes, deadline)
    return {name: [statistics.mean(row.replay(name, s, k).cost_vs_on_demand for s in row.starts) for k in range(seeds)]
            for name in POLICIES}


def per_start(traces: list[Trace], nodes: int, deadline: float, seeds: int) -> list[str]:
    """A table row per start: ``opt``, and ``default``'s mean cost, end of the job and launches over the seeds."""
    row = Row(traces, nodes, deadline)
    rows = []
    for s in row.starts:
        runs = [row.replay("default", s, k) for k in range(seeds)]
        opt = simulate_opt_zones(row.market, s, row.params, row.moves).cost_vs_on_demand
        cost = statistics.mean(r.cost_vs_on_demand for r in runs)
        rows.append(f"| N={nodes} | {deadline:g} | {s} | {opt:.4f} | {cost:.4f} | {cost / opt:.3f} | "
                    f"{statistics.mean(r.done_h for r in runs):.1f} | {statistics.mean(r.launches for r in runs):.1f} | "
                    f"{statistics.mean(r.launches_without_progress for r in runs):.1f} | "
                    f"{statistics.mean(r.changeover_cost for r in runs) / row.market.baseline(row.params):.4f} |")
    return rows


def main() -> int:
    def extra(ap) -> None:
        ap.add_argument("--region", default="us-east4", help="the zones whose names start with this ('' for all)")
        ap.add_argument("--nodes", default="4,1")
        ap.add_argument("--seeds", type=int, default=10)
        ap.add_argument("--per-start", action="store_true",
                        help="each start: opt, default's cost, end, launches (those without progress) and changeovers")

    args = replay_args.parse(__doc__, extra)
    traces = [t for t in load_traces([args.traces]) if t.name.startswith(args.region)]
    if args.per_start:
        print(f"| {args.region or 'all zones'} | R0 | start | opt | default: mean of {args.seeds} seeds | / opt | "
              "done (h) | launches | without progress | changeovers |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for nodes in map(int, args.nodes.split(",")):
            for deadline in (60.0, 72.0):
                print("\n".join(per_start(traces, nodes, deadline, args.seeds)), flush=True)
        return 0
    print(f"| {args.region or 'all zones'} | R0 | " + " | ".join(
        f"{p}: bench/zones.py's draw | {p}: mean of {args.seeds} seeds (least-greatest)" for p in POLICIES)
        + " |\n|---|---:|" + "---:|---:|" * len(POLICIES))
    for nodes in map(int, args.nodes.split(",")):
        for deadline in (60.0, 72.0):
            means = seed_means(traces, nodes, deadline, args.seeds)
            cells = [f"{v[0]:.4f} | {statistics.mean(v):.4f} ({min(v):.4f}-{max(v):.4f})" for v in means.values()]
            print(f"| N={nodes} | {deadline:g} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

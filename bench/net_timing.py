"""When the deadline safety net fires, for the one-zone ``default`` and ``up``, on the bundled traces.

    .venv/bin/python bench/net_timing.py   # ~2 min on 2 cores

A job whose net fires early spent its slack early and runs on-demand from then to the end (the "slack
burn" a review of the earlier ``default`` found: the net at 15-30 % of the deadline, 0.965 of on-demand
where ``up`` cost 0.504). Replays the cells of bench/policies.py's GCP table (13 zones, 16 nodes, R0 = 60
and 72 h, d = 0.2 h) and of its AWS table (9 zones, 1 node, R0 = 53.3 / 60 / 72 h, d = 0.2 / 0.1 h), 8
starts each, and counts the runs whose net fired (slack at most one tick, ``kit.policy.safety_net``)
before 30 % and before 50 % of the deadline; then lists those runs with both policies' costs.
"""

from __future__ import annotations

import sys
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import replay_args

from kit.paths import SPOT_TRACES_DIR
from kit.policy import Observation, make_policy, safety_net
from kit.simulate.single import Params, simulate_policy, start_ticks
from kit.traces import load_traces

SETS = {  # name: (trace set, (R0, d) cells, nodes)
    "gcp": (replay_args.GCP, ((60.0, 0.2), (72.0, 0.2)), 16),
    "aws": (replay_args.AWS, replay_args.AWS_CELLS, 1),
}
POLICIES = ("default", "up")
SHARES = (0.3, 0.5)


class NetWatch:
    """A policy as it is, noting the share of the deadline at which the safety net first held."""

    def __init__(self, name: str) -> None:
        self.policy, self.name = make_policy(name), name
        self.net_share: float | None = None

    def decide(self, obs: Observation) -> str:
        if self.net_share is None and safety_net(obs):
            assert obs.deadline_h is not None
            self.net_share = obs.now_h / obs.deadline_h
        return self.policy.decide(obs)


def cell(args: tuple[str, int, float, float]) -> list[dict]:
    key, index, deadline, d = args
    name, _, nodes = SETS[key]
    trace = load_traces([SPOT_TRACES_DIR / name])[index]
    params = Params(nodes=nodes, job_h=48.0, deadline_h=deadline, changeover_h=d, starts=8)
    rows = []
    for start in start_ticks(trace, params):
        row: dict = {"trace": trace.name, "R0": deadline, "d": d, "start": start}
        for policy in POLICIES:
            watch = NetWatch(policy)
            cost = simulate_policy(trace, start, policy, params, policy=watch).cost_vs_on_demand
            row[policy] = (watch.net_share, cost)
        rows.append(row)
    return rows


def main() -> None:
    jobs = [(key, i, deadline, d) for key, (name, cells, _) in SETS.items()
            for i in range(len(load_traces([SPOT_TRACES_DIR / name]))) for deadline, d in cells]
    with Pool(2) as pool:
        rows = [r for rs in pool.map(cell, jobs) for r in rs]
    print("| policy | " + " | ".join(f"net before {s:.0%} of R0" for s in SHARES) + " |")
    print("|---|" + "---:|" * len(SHARES))
    for policy in POLICIES:
        counts = [sum(1 for r in rows if r[policy][0] is not None and r[policy][0] < s) for s in SHARES]
        print(f"| {policy} | " + " | ".join(f"{c} of {len(rows)}" for c in counts) + " |")
    print("\nruns where default's net fired before half the deadline:")
    for r in rows:
        share, cost = r["default"]
        if share is not None and share < SHARES[-1]:
            up_share, up_cost = r["up"]
            up_net = "never" if up_share is None else f"{up_share:.2f}"
            print(f"  {r['trace']} R0={r['R0']:g} d={r['d']:g} start {r['start']}: default net at {share:.2f} of R0, "
                  f"cost {cost:.3f}; up net {up_net}, cost {up_cost:.3f}")


if __name__ == "__main__":
    main()

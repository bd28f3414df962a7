"""How long the omniscient bound (``opt``) takes, against the compute-grid dynamic program it
replaced (the baseline, kept here and run in the same process on the same inputs).

    .venv/bin/python bench/opt.py [--baseline-limit-s 300]
    .venv/bin/python bench/opt.py --tiny          # part 3 only, ~1 min

1. the bundled GCP H100 set: 13 zones x 8 starts, N=16, C0=48 h, R0=60 h, with d = 0.2 h (a
   whole number of 2-minute grid units) and d = 0.2001 h (no grid up to 1/240 tick: the baseline
   rounds compute up there, so it is also *not exact*; the costs are printed side by side);
2. one start on a synthetic 32-second-tick market (on/off, mean spot run 5.3 h, mean outage
   1.8 h, seeded), C0=48 h, d=0.2 h with R0 = 60 h and 72 h, and d=0.2001 h with R0 = 60 h;
3. ``--tiny``: changeovers far below a tick (d = 1e-3, 1e-4, 1e-6 h; no unit of the tick makes them whole),
   one start of one bundled GCP zone and of the synthetic 32-s market, R0 = 60 h: ``opt`` as it runs now
   (kit.simulate.single.simulate_opt: waste arrays with at most one launch a tick, or Pareto fronts where
   the arrays would be large) against the waste arrays without that bound (the program before), which is
   not run where its arrays would pass 20 M states.

The baseline is stopped once a case has taken ``--baseline-limit-s`` (shown as "> limit"). Prints a Markdown table (docs/benchmarks.md, "opt runtime").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.zone_known import progress_grid
from kit.paths import SPOT_TRACES_DIR
from kit.simulate.single import Params, _Opt, _Waste, _Window, grid_states, simulate_opt, start_ticks
from kit.traces import Trace, load_traces


class GridOpt(_Opt):
    """The baseline: DP over (tick, market, ticks since launch, compute on a grid of G/m)."""

    stop_at = math.inf  # perf_counter() time after which run() gives up (TimeoutError)

    def __init__(self, w: _Window) -> None:  # its own state; run() is _Opt's
        self.w = w
        self.u, self.prog_units, self.target = progress_grid(w.G, w.d, w.C0, round_up=True)
        self.P = len(self.prog_units)
        self.idle = np.full(self.target, math.inf)
        self.idle[0] = 0.0
        self.spot = np.full((self.P, self.target), math.inf)
        self.od = np.full((self.P, self.target), math.inf)
        self.best = math.inf
        self.idx = np.arange(self.target)

    def advance(self, from_cost: np.ndarray, phase: int, price: float, now: float, dest: np.ndarray) -> None:
        w, target = self.w, self.target
        setup_h = min(w.G, max(0.0, w.d - phase * w.G))
        p = self.prog_units[phase]
        finishing = self.idx + p >= target
        if finishing.any():
            fc = from_cost[finishing]
            if np.isfinite(fc).any():
                rem_h = w.C0 - self.idx[finishing] * self.u
                ok = now + setup_h + rem_h <= w.R0 + 1e-7
                if ok.any():
                    self.best = min(self.best, float((fc[ok] + w.N * price * (setup_h + rem_h[ok])).min()))
        if p == 0:
            np.minimum(dest, from_cost + w.N * price * w.G, out=dest)
        else:
            np.minimum(dest[p:], from_cost[: target - p] + w.N * price * w.G, out=dest[p:])

    def tick(self, i: int) -> None:
        if time.perf_counter() > self.stop_at:
            raise TimeoutError
        w, P, now = self.w, self.P, i * self.w.G
        new_idle = np.full(self.target, math.inf)
        new_spot = np.full((P, self.target), math.inf)
        new_od = np.full((P, self.target), math.inf)
        if not w.avail[i]:
            self.idle = np.minimum(self.idle, self.spot.min(axis=0))
            self.spot = np.full((P, self.target), math.inf)
        np.minimum(new_idle, np.minimum(self.idle, np.minimum(self.spot.min(axis=0), self.od.min(axis=0))),
                   out=new_idle)
        self.advance(np.minimum(self.idle, self.spot.min(axis=0)), 0, w.q, now, new_od[min(1, P - 1)])
        for j in range(P):
            self.advance(self.od[j], j, w.q, now, new_od[min(j + 1, P - 1)])
        if w.avail[i]:
            price = w.spot_prices[i]
            self.advance(np.minimum(self.idle, self.od.min(axis=0)), 0, price, now, new_spot[min(1, P - 1)])
            for j in range(P):
                self.advance(self.spot[j], j, price, now, new_spot[min(j + 1, P - 1)])
        self.idle, self.spot, self.od = new_idle, new_spot, new_od


def markov_32s(seed: int = 0, ticks: int = 12000, zone: str = "markov-32s", spot_price: float = 1.0) -> Trace:
    """An on/off market of 32-second ticks: 16 nodes up for ~5.3 h, down for ~1.8 h (geometric, seeded)."""
    rng = np.random.default_rng(seed)
    data: list[int] = []
    up = True
    while len(data) < ticks:
        data += [16 if up else 0] * int(rng.geometric(1 / (600 if up else 200)))
        up = not up
    meta = {"gap_seconds": 32, "spot_price_per_hour": spot_price, "on_demand_price_per_hour": 3.0, "zone": zone}
    return Trace(path=Path(f"{zone}.json"), gap_seconds=32, data=tuple(data[:ticks]), metadata=meta)


def timed(cls, cases: list[tuple[Trace, int]], params: Params) -> tuple[float, float] | None:
    """(seconds, mean cost vs on-demand) of ``cls`` over ``cases``; None when it ran out of time."""
    started, costs = time.perf_counter(), []
    try:
        for trace, start in cases:
            costs.append(cls(_Window.of(trace, start, params)).run(trace.name, start).cost_vs_on_demand)
    except TimeoutError:
        return None
    return time.perf_counter() - started, float(np.mean(costs))


class UnboundedOpt(_Opt):
    """The baseline of part 3: waste arrays whose launches axis is as long as the slack over d."""

    def __init__(self, window: _Window) -> None:
        super().__init__(window)
        self.waste = _Waste(window.G, window.d, window.R0 - window.C0)
        self.idle = self.waste.start()
        self.spot = np.full_like(self.idle, math.inf)
        self.od = np.full_like(self.idle, math.inf)


UNBOUNDED_STATES_MAX = 20_000_000  # 3 arrays of 8-byte floats: about 0.5 GB


def tiny() -> None:
    """Part 3: changeovers far below a tick."""
    gcp = load_traces([SPOT_TRACES_DIR / "gcp-a3-h100-2025-10"])[0]
    rows = []
    for label, trace in ((f"GCP {gcp.name}, 10-min ticks", gcp), ("synthetic, 32-s ticks", markov_32s())):
        for d in (1e-3, 1e-4, 1e-6):
            params = Params(nodes=16, job_h=48.0, deadline_h=60.0, changeover_h=d, starts=1)
            start = start_ticks(trace, params)[0]
            window = _Window.of(trace, start, params)
            before = grid_states(window.G, d, window.R0 - window.C0)
            t0 = time.perf_counter()
            now = simulate_opt(trace, start, params)
            cells = [f"{time.perf_counter() - t0:.2f} s", f"{now.cost_vs_on_demand:.6f}"]
            if before <= UNBOUNDED_STATES_MAX:
                t0 = time.perf_counter()
                old = UnboundedOpt(window).run(trace.name, start)
                cells = [f"{before:,}", f"{time.perf_counter() - t0:.2f} s", f"{old.cost_vs_on_demand:.6f}", *cells]
            else:
                cells = [f"{before:,}", "not run", "-", *cells]
            rows.append(f"| {label} | {d:g} h | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    print("\n| market, 1 start | d | states before | before | its cost | now | its cost |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-limit-s", type=float, default=300.0)
    ap.add_argument("--tiny", action="store_true", help="part 3 only: changeovers far below a tick")
    args = ap.parse_args()
    if args.tiny:
        tiny()
        return
    gcp = load_traces([SPOT_TRACES_DIR / "gcp-a3-h100-2025-10"])
    synthetic = markov_32s()
    rows = []
    for label, traces, d, deadline, starts in (
            ("GCP 13 zones x 8 starts, 10-min ticks", gcp, 0.2, 60.0, 8),
            ("GCP 13 zones x 8 starts, 10-min ticks", gcp, 0.2001, 60.0, 8),
            ("synthetic, 32-s ticks, 1 start", [synthetic], 0.2, 60.0, 1),
            ("synthetic, 32-s ticks, 1 start", [synthetic], 0.2, 72.0, 1),
            ("synthetic, 32-s ticks, 1 start", [synthetic], 0.2001, 60.0, 1)):
        params = Params(nodes=16, job_h=48.0, deadline_h=deadline, changeover_h=d, starts=starts)
        cases = [(t, s) for t in traces for s in start_ticks(t, params)]
        new = timed(_Opt, cases, params)
        GridOpt.stop_at = time.perf_counter() + args.baseline_limit_s
        old = timed(GridOpt, cases, params)
        assert new is not None
        old_cells = (f"{old[0]:.1f} s | {old[1]:.6f}" if old else f"> {args.baseline_limit_s:g} s | -")
        rows.append(f"| {label} | {d:g} h | {deadline:g} h | {len(cases)} | {old_cells} | {new[0]:.1f} s | {new[1]:.6f} |")
        print(rows[-1], flush=True)
    print()
    print("| market | d | R0 | runs | grid DP (baseline) | its mean cost | exact DP | its mean cost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

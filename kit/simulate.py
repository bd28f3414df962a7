"""Replay spot capacity traces against the policies (an exact model, documented in docs/policies.md) and an omniscient bound.

Model (shared with other implementations, so results are comparable):

* Time moves in ticks of ``G = gap_seconds / 3600`` hours. A gang of ``N`` nodes has spot in tick
  ``i`` iff ``data[i] >= N``; a spot cluster is lost at the start of any tick where it is not
  usable (the policy then sees ``market=None, preempted=True``).
* Every launch (spot or on-demand, also a switch) first spends ``d`` hours billed without
  progress. The cost of a tick is ``N x price x time held in that tick``; the job stops being
  billed the moment its compute reaches ``C0``. It misses if not done by ``R0``.
* A policy answering ``spot`` in a tick without spot capacity holds nothing that tick.
* A run that is not done after the simulated window (``span`` ticks) is counted as a miss and
  finished on on-demand (one changeover + the remaining compute) for its cost.
* Starts: ``numpy.linspace(0, len(data) - span, K).astype(int)``, ``span = ceil(R0 / G) + 1``;
  traces shorter than ``span`` are skipped. Cost is relative to ``N x Q x (C0 + d)``.
* ``opt``: dynamic programming over (tick, market, ticks since launch, compute) with the whole
  trace known. Compute is tracked on a grid that holds every per-tick progress exactly when
  ``d`` and ``G`` are commensurable (as in all shared traces); otherwise progress is rounded *up*,
  so ``opt`` is always a true lower bound of this model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kit.errors import InputError
from kit.policy import DEFAULT_CHANGEOVER_H, ON_DEMAND, POLICY_NAMES, SPOT, WAIT, Observation, make_policy
from kit.traces import Trace

EPS = 1e-9
OPT = "opt"
ALL_POLICIES = POLICY_NAMES + (OPT,)
DEFAULT_SPOT_PRICE, DEFAULT_ON_DEMAND_PRICE = 1.0, 4.0
MAX_NODES = 1000  # a gang's size, as in the spec
MAX_STARTS = 10_000  # start ticks per trace: each is a whole replay of every policy


@dataclass(frozen=True)
class Params:
    nodes: int = 16
    job_h: float = 48.0
    deadline_h: float = 60.0
    changeover_h: float = DEFAULT_CHANGEOVER_H
    starts: int = 8
    spot_price: float = DEFAULT_SPOT_PRICE  # used when a trace has no prices
    on_demand_price: float = DEFAULT_ON_DEMAND_PRICE

    def check(self) -> None:
        """Every number finite and in range (NaN and infinity would overflow the tick arithmetic)."""
        finite = all(map(math.isfinite, (self.job_h, self.deadline_h, self.changeover_h, self.spot_price,
                                        self.on_demand_price)))
        problems = [(flag, what) for flag, bad, what in (
            ("--nodes", not 1 <= self.nodes <= MAX_NODES, f"must be 1 to {MAX_NODES}"),
            ("--job-hours", not (math.isfinite(self.job_h) and self.job_h > 0), "must be a finite number > 0"),
            ("--deadline-hours", not (math.isfinite(self.deadline_h) and self.deadline_h > 0),
             "must be a finite number > 0"),
            ("--changeover-hours", not (math.isfinite(self.changeover_h) and self.changeover_h >= 0),
             "must be a finite number >= 0"),
            ("--starts", not 1 <= self.starts <= MAX_STARTS, f"must be 1 to {MAX_STARTS}"),
            ("--spot-price/--on-demand-price", not (finite and self.spot_price > 0 and self.on_demand_price > 0),
             "must be finite numbers > 0"),
        ) if bad]
        if problems:
            where, what = problems[0]
            raise InputError(what, where=where, fix=f"see `kit simulate --help` for {where}")


@dataclass
class Run:
    """One (trace, start, policy) replay."""

    trace: str
    start: int
    policy: str
    cost: float  # $
    cost_vs_on_demand: float
    done_h: float | None  # when compute reached C0 (None: not within the window)
    missed: bool
    spot_h: float = 0.0  # hours held on spot (incl. changeovers)
    on_demand_h: float = 0.0
    launches: int = 0
    timeline: list[dict] = field(default_factory=list)  # per tick, only when recorded


def span_ticks(params: Params, tick_h: float) -> int:
    return math.ceil(params.deadline_h / tick_h - EPS) + 1


def start_ticks(trace: Trace, params: Params) -> list[int]:
    span = span_ticks(params, trace.tick_h)
    if len(trace) < span:
        return []
    return [int(s) for s in np.linspace(0, len(trace) - span, params.starts).astype(int)]


@dataclass(frozen=True)
class _Window:
    """What a replay from tick ``start`` sees: ``span`` ticks of one trace, and the job's terms."""

    G: float  # tick (hours)
    N: int  # nodes
    C0: float  # compute the job needs (hours)
    R0: float  # deadline (hours)
    d: float  # changeover (hours)
    span: int
    avail: list[bool]  # spot usable by the whole gang, per tick
    spot_prices: list[float]
    q: float  # on-demand price

    @classmethod
    def of(cls, trace: Trace, start: int, params: Params) -> _Window:
        G = trace.tick_h
        span = span_ticks(params, G)
        return cls(G=G, N=params.nodes, C0=params.job_h, R0=params.deadline_h, d=params.changeover_h, span=span,
                   avail=trace.spot_available(params.nodes)[start:start + span],
                   spot_prices=trace.spot_prices(params.spot_price)[start:start + span],
                   q=float(trace.on_demand_price(params.on_demand_price)))

    @property
    def baseline(self) -> float:
        """The cost of the job on on-demand from the start: one changeover, then the compute."""
        return self.N * self.q * (self.C0 + self.d)


class _PolicyReplay:
    """One policy, tick by tick: observe, decide, switch markets, hold (and pay) the tick."""

    def __init__(self, window: _Window, policy, policy_name: str, record: bool) -> None:
        self.w, self.policy, self.policy_name, self.record = window, policy, policy_name, record
        self.market: str | None = None
        self.setup_left = self.progress = self.cost = self.spot_h = self.od_h = 0.0
        self.done_h: float | None = None
        self.launches = 0
        self.timeline: list[dict] = []

    def decide(self, i: int) -> str:
        w = self.w
        preempted = False
        if self.market == SPOT and not w.avail[i]:
            self.market, preempted = None, True
        obs = Observation(now_h=i * w.G, progress_h=self.progress, job_h=w.C0, deadline_h=w.R0, changeover_h=w.d,
                          market=self.market, spot_available=bool(w.avail[i]), preempted=preempted, tick_h=w.G,
                          spot_price=float(w.spot_prices[i]), on_demand_price=w.q)
        decision = self.policy.decide(obs)
        if decision not in (SPOT, ON_DEMAND, WAIT):
            raise ValueError(f"policy {self.policy_name} answered {decision!r}")
        return WAIT if decision == SPOT and not w.avail[i] else decision

    def switch(self, decision: str) -> None:
        if decision == WAIT:
            self.market = None
        elif decision != self.market:  # every launch first spends the changeover, billed
            self.market, self.setup_left = decision, self.w.d
            self.launches += 1

    def hold(self, i: int) -> float:
        """Hours held in tick ``i`` (changeover first, then work until the job is done)."""
        w = self.w
        if self.market is None:
            return 0.0
        setup = min(self.setup_left, w.G)
        work = min(w.G - setup, w.C0 - self.progress)
        held = setup + work
        self.setup_left -= setup
        self.progress += work
        self.cost += w.N * (w.spot_prices[i] if self.market == SPOT else w.q) * held
        if self.market == SPOT:
            self.spot_h += held
        else:
            self.od_h += held
        return held

    def run(self, trace_name: str, start: int) -> Run:
        w = self.w
        for i in range(w.span):
            decision = self.decide(i)
            self.switch(decision)
            held = self.hold(i)
            if self.record:
                self.timeline.append({"t": i * w.G, "market": self.market, "progress": self.progress,
                                      "spot": bool(w.avail[i]), "decision": decision})
            if self.progress >= w.C0 - EPS:
                self.done_h = i * w.G + held
                break
        if self.done_h is None:  # finish on on-demand after the window, for the cost
            rest = w.d + (w.C0 - self.progress)
            self.cost += w.N * w.q * rest
            self.od_h += rest
        return Run(trace=trace_name, start=start, policy=self.policy_name, cost=self.cost,
                   cost_vs_on_demand=self.cost / w.baseline, done_h=self.done_h,
                   missed=self.done_h is None or self.done_h > w.R0 + 1e-7, spot_h=self.spot_h, on_demand_h=self.od_h,
                   launches=self.launches, timeline=self.timeline)


def simulate_policy(trace: Trace, start: int, policy_name: str, params: Params, *, record: bool = False,
                    policy_params: dict | None = None, policy=None) -> Run:
    """Replay one policy (by name, or a ready ``policy`` object) from tick ``start``."""
    if policy is None:
        policy = make_policy(policy_name, **(policy_params or {}))
    return _PolicyReplay(_Window.of(trace, start, params), policy, policy_name, record).run(trace.name, start)


# --------------------------------------------------------------------------------------- opt
def _grid(G: float, d: float, C0: float) -> tuple[float, list[int], int]:
    """Compute unit u and per-phase progress in units (phase j = ticks held since launch)."""
    phases = max(1, math.ceil(d / G - EPS)) if d > EPS else 0
    progress = [G - min(G, max(0.0, d - j * G)) for j in range(phases + 1)]
    for m in range(1, 241):
        u = G / m
        if all(abs(p / u - round(p / u)) < 1e-6 for p in progress) and abs(C0 / u - round(C0 / u)) < 1e-6:
            return u, [round(p / u) for p in progress], round(C0 / u)
    m = 240
    u = G / m
    return u, [math.ceil(p / u - 1e-9) for p in progress], math.floor(C0 / u + 1e-9)  # optimistic


class _Opt:
    """The omniscient bound, by dynamic programming: per tick, the least cost of every state
    (idle; spot or on-demand in phase j since launch; compute done, in grid units < target)."""

    def __init__(self, window: _Window) -> None:
        w = self.w = window
        self.u, self.prog_units, self.target = _grid(w.G, w.d, w.C0)
        self.P = len(self.prog_units)  # phases 0..P-1; the last one is "running"
        self.idle = np.full(self.target, math.inf)
        self.idle[0] = 0.0
        self.spot = np.full((self.P, self.target), math.inf)
        self.od = np.full((self.P, self.target), math.inf)
        self.best = math.inf
        self.idx = np.arange(self.target)

    def advance(self, from_cost: np.ndarray, phase: int, price: float, now: float, dest: np.ndarray) -> None:
        """Hold one tick in ``phase`` from states ``from_cost``; finish or land in ``dest`` (next phase)."""
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
        w, P, now = self.w, self.P, i * self.w.G
        new_idle = np.full(self.target, math.inf)
        new_spot = np.full((P, self.target), math.inf)
        new_od = np.full((P, self.target), math.inf)
        if not w.avail[i]:
            self.idle = np.minimum(self.idle, self.spot.min(axis=0))  # spot cluster lost
            self.spot = np.full((P, self.target), math.inf)
        # wait
        np.minimum(new_idle, np.minimum(self.idle, np.minimum(self.spot.min(axis=0), self.od.min(axis=0))),
                   out=new_idle)
        # launch on-demand from idle or spot; continue on-demand
        self.advance(np.minimum(self.idle, self.spot.min(axis=0)), 0, w.q, now, new_od[min(1, P - 1)])
        for j in range(P):
            self.advance(self.od[j], j, w.q, now, new_od[min(j + 1, P - 1)])
        if w.avail[i]:
            price = w.spot_prices[i]
            self.advance(np.minimum(self.idle, self.od.min(axis=0)), 0, price, now, new_spot[min(1, P - 1)])
            for j in range(P):
                self.advance(self.spot[j], j, price, now, new_spot[min(j + 1, P - 1)])
        self.idle, self.spot, self.od = new_idle, new_spot, new_od

    def run(self, trace_name: str, start: int) -> Run:
        w = self.w
        for i in range(w.span):
            if i * w.G >= w.R0 - EPS:
                break
            self.tick(i)
        missed = not math.isfinite(self.best)
        cost = w.baseline if missed else self.best
        return Run(trace=trace_name, start=start, policy=OPT, cost=cost, cost_vs_on_demand=cost / w.baseline,
                   done_h=None, missed=missed)


def simulate_opt(trace: Trace, start: int, params: Params) -> Run:
    """Cheapest way to finish by R0 knowing the whole trace (same model, DP)."""
    return _Opt(_Window.of(trace, start, params)).run(trace.name, start)


def simulate(traces: list[Trace], policies: list[str], params: Params, *, policy_params: dict | None = None) -> dict:
    """Every policy on every (trace, start); returns the summary (the ``--json`` document)."""
    params.check()
    for name in policies:
        if name not in ALL_POLICIES:
            raise InputError(f"unknown policy {name!r}", where="--policy", fix=f"use one of: {', '.join(ALL_POLICIES)}, all")
    runs: list[Run] = []
    skipped = []
    for trace in traces:
        starts = start_ticks(trace, params)
        if not starts:
            skipped.append(trace.name)
            continue
        for s in starts:
            for name in policies:
                if name == OPT:
                    runs.append(simulate_opt(trace, s, params))
                else:
                    runs.append(simulate_policy(trace, s, name, params,
                                                policy_params=(policy_params or {}).get(name)))
    return summarize(runs, policies, params, skipped)


def _per_policy(by: dict[str, list[Run]], value: Callable[[list[Run]], float],
                skip_opt: bool = False) -> dict[str, float | None]:
    """``value`` of each policy's runs (None for a policy without runs, or for OPT when skipped)."""
    return {p: (value(rs) if rs and not (skip_opt and p == OPT) else None) for p, rs in by.items()}


def summarize(runs: list[Run], policies: list[str], params: Params, skipped: list[str]) -> dict:
    by = {name: [r for r in runs if r.policy == name] for name in policies}
    traces = sorted({r.trace for r in runs})

    def cost(rs: list[Run]) -> list[float]:
        return [r.cost_vs_on_demand for r in rs]

    return {
        "runs": len(by[policies[0]]) if policies else 0,
        "cost_vs_on_demand": _per_policy(by, lambda rs: float(np.mean(cost(rs)))),
        "deadline_misses": {p: sum(r.missed for r in rs) for p, rs in by.items()},
        "cost_vs_on_demand_p75": _per_policy(by, lambda rs: float(np.percentile(cost(rs), 75))),
        "spot_hours": _per_policy(by, lambda rs: float(np.mean([r.spot_h for r in rs])), skip_opt=True),
        "on_demand_hours": _per_policy(by, lambda rs: float(np.mean([r.on_demand_h for r in rs])), skip_opt=True),
        "per_trace": {t: {p: float(np.mean([r.cost_vs_on_demand for r in rs if r.trace == t]))
                          for p, rs in by.items()} for t in traces},
        "skipped_traces": skipped,
        "params": {"nodes": params.nodes, "job_hours": params.job_h, "deadline_hours": params.deadline_h,
                   "changeover_hours": params.changeover_h, "starts": params.starts},
    }


# --------------------------------------------------------------------------------------- plot
def _shown_start(traces: list[Trace], policies: list[str], params: Params, summary: dict) -> tuple[Trace, int]:
    """On the trace where the policies' mean costs differ most (on-demand and opt left out), the
    start where they differ most."""
    usable = [t for t in traces if start_ticks(t, params)]
    if not usable:
        raise InputError("no trace is long enough to plot", where="--plot", fix="use longer traces or a shorter deadline")
    per_trace = summary.get("per_trace") or {}
    compared = [p for p in policies if p not in (OPT, ON_DEMAND)]

    def spread(costs: list[float]) -> float:
        return max(costs) - min(costs) if len(costs) > 1 else 0.0

    trace = max(usable, key=lambda t: spread([per_trace.get(t.name, {}).get(p, 0.0) for p in compared]))
    start = max(start_ticks(trace, params),
                key=lambda s: spread([simulate_policy(trace, s, p, params).cost_vs_on_demand for p in compared]))
    return trace, start


def _plot_progress(ax, trace: Trace, start: int, policies: list[str], params: Params) -> None:
    G = trace.tick_h
    for i, up in enumerate(trace.spot_available(params.nodes)[start:start + span_ticks(params, G)]):
        if up:
            ax.axvspan(i * G, (i + 1) * G, color="tab:green", alpha=0.08, lw=0)
    ax.plot([0, params.deadline_h], [0, params.job_h], "k--", lw=1, label="uniform progress")
    ax.axvline(params.deadline_h, color="tab:red", lw=1, ls=":", label="deadline")
    colors = {"spot": "tab:green", "on-demand": "tab:red"}
    for n, name in enumerate(p for p in policies if p != OPT):
        run = simulate_policy(trace, start, name, params, record=True)
        ts = [0.0] + [row["t"] + G for row in run.timeline]
        ps = [0.0] + [row["progress"] for row in run.timeline]
        line, = ax.plot(ts, ps, lw=1.5, label=f"{name} ({run.cost_vs_on_demand:.2f})")
        # market held per tick, as a thin band under the curves
        y0 = -1.5 - 1.2 * n
        for row in run.timeline:
            if row["market"]:
                ax.fill_between([row["t"], row["t"] + G], y0, y0 + 0.9, color=colors[row["market"]], lw=0)
        ax.text(-0.5, y0 + 0.2, name, ha="right", fontsize=7, color=line.get_color())
    ax.set_xlabel("hours since start")
    ax.set_ylabel("compute done (h)")
    ax.set_title(f"{trace.name}, start tick {start}: progress (green shade: spot up; bands: spot/on-demand)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def _plot_costs(bars, policies: list[str], summary: dict) -> None:
    names = [p for p in policies if summary["cost_vs_on_demand"].get(p) is not None]
    values = [summary["cost_vs_on_demand"][p] for p in names]
    bars.bar(names, values, color=["tab:gray" if p == OPT else "tab:blue" for p in names])
    for x, v in enumerate(values):
        bars.text(x, v, f"{v:.3f}", ha="center", va="bottom", fontsize=7)
    bars.set_ylabel("mean cost vs on-demand")
    misses = ", ".join(f"{p}={summary['deadline_misses'][p]}" for p in names if summary["deadline_misses"][p])
    bars.set_title(f"{summary['runs']} runs; deadline misses: {misses or 'none'}", fontsize=9)
    bars.tick_params(axis="x", rotation=30, labelsize=8)


def plot(traces: list[Trace], policies: list[str], params: Params, summary: dict, out: str) -> None:
    """Progress vs time for one start (``_shown_start``), and cost per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace, start = _shown_start(traces, policies, params, summary)
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [2, 1]})
    _plot_progress(ax, trace, start, policies, params)
    _plot_costs(bars, policies, summary)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)

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
* ``opt``: dynamic programming over (tick, market, waste: the hours that made no compute) with
  the whole trace known: exact for any ``d`` and ``G`` (compute is never rounded); a tick costs
  ``O((R0 - C0)/u)`` states, ``u`` the largest unit in which ``d`` and ``G`` are whole, or
  ``O((R0 - C0)^2 / (G d))`` when there is none (see ``_Opt`` and ``_Waste``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kit.errors import InputError
from kit.policy import DEFAULT_CHANGEOVER_H, ON_DEMAND, POLICY_NAMES, SPOT, WAIT, Observation, make_policy
from kit.policy.offers import MAX_HOURS, MAX_NODES, MAX_PRICE_PER_HOUR
from kit.traces import Trace, check_gang

EPS = 1e-9
OPT = "opt"
ALL_POLICIES = POLICY_NAMES + (OPT,)
DEFAULT_SPOT_PRICE, DEFAULT_ON_DEMAND_PRICE = 1.0, 4.0
MAX_STARTS = 10_000  # start ticks per trace: each is a whole replay of every policy


def _in_range(value: float, high: float, *, zero_ok: bool = False) -> bool:
    """> 0 (>= 0 with ``zero_ok``) and <= ``high``; False for NaN (every comparison with it is) and infinity."""
    return (value >= 0 if zero_ok else value > 0) and value <= high


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
        """Every number in range: NaN, infinity and finite values near the float limit (1e308) overflow the tick
        arithmetic (``span_ticks``, ``_common_units``) or make the costs inf or NaN."""
        hours = f"must be a number > 0 and <= {MAX_HOURS:g}"
        prices = (self.spot_price, self.on_demand_price)
        problems = [(flag, what) for flag, bad, what in (
            ("--nodes", not 1 <= self.nodes <= MAX_NODES, f"must be 1 to {MAX_NODES}"),
            ("--job-hours", not _in_range(self.job_h, MAX_HOURS), hours),
            ("--deadline-hours", not _in_range(self.deadline_h, MAX_HOURS), hours),
            ("--changeover-hours", not _in_range(self.changeover_h, MAX_HOURS, zero_ok=True),
             f"must be a number >= 0 and <= {MAX_HOURS:g}"),
            ("--starts", not 1 <= self.starts <= MAX_STARTS, f"must be 1 to {MAX_STARTS}"),
            ("--spot-price/--on-demand-price", not all(_in_range(p, MAX_PRICE_PER_HOUR) for p in prices),
             f"must be numbers > 0 and <= {MAX_PRICE_PER_HOUR:g} ($ per node-hour)"),
        ) if bad]
        if problems:
            where, what = problems[0]
            raise InputError(what, where=where, fix=f"see `kit simulate --help` for {where}")
        if self.deadline_h < self.job_h:  # no schedule meets it, and opt has no state to start from
            raise InputError(f"the deadline ({self.deadline_h:g} h) is shorter than the job's compute "
                             f"({self.job_h:g} h): no schedule can meet it", where="--deadline-hours",
                             fix=f"give --deadline-hours of at least --job-hours ({self.job_h:g}) plus the slack "
                                 f"to allow, e.g. {self.job_h * 1.25:g}")

    def check_tick(self, trace: Trace) -> None:
        """The trace's tick is shorter than the job's slack. The safety net keeps one tick of it (a tick
        without progress must not make the deadline unreachable), so with a tick as long as the slack every
        policy runs on-demand from the first tick and the replay compares nothing (a trace sampled daily,
        say, against a 12-hour slack)."""
        slack = self.deadline_h - self.job_h - self.changeover_h
        if slack > 0 and trace.tick_h >= slack - EPS:
            raise InputError(f"{trace.name}: its ticks ({trace.tick_h:g} h) are not shorter than the job's slack "
                             f"(deadline - compute - changeover = {slack:g} h): the deadline's safety net keeps one "
                             f"tick of slack, so every policy would run on-demand from the start",
                             where="--deadline-hours",
                             fix=f"give a deadline later than {self.job_h + self.changeover_h + trace.tick_h:g} h, "
                                 f"or traces with shorter ticks")


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


def split_tick(setup_left: float, tick_h: float, remaining_h: float) -> tuple[float, float]:
    """(changeover, work) hours of a tick held: the changeover left first, then work until the job is done."""
    setup = min(setup_left, tick_h)
    return setup, min(tick_h - setup, remaining_h)


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
        setup, work = split_tick(self.setup_left, w.G, w.C0 - self.progress)
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
class _Waste:
    """The hours a schedule has spent without making compute (idle ticks, changeovers and checkpoint
    transfers), as the trailing array index of a state array: ``shift_idle`` / ``shift_launch`` /
    ``shift_move`` move every state by one idle tick / one launch / one launch in another zone.

    When ``d`` (and the transfer time ``T``) are whole numbers of units ``u = G/m`` (m <= 240; every
    bundled trace, and the default 50 GB at 10 Gbit/s), states of equal waste are one state: one axis
    over ``k u``. Otherwise two axes (launches r, idle ticks W), waste ``W G + r d``: exact for any
    ``d``, at ``min((R0 - C0)/d, ticks)`` times the states: a schedule launches at most once a tick, so a
    window of ``ticks`` ticks (``max_launches``) makes no more launches than that, however small ``d`` is
    (a changeover of 1e-4 h took the axis to 120,000 launches where a 60-h window has 361 ticks). A
    transfer time that fits neither would be rounded down (to the unit, or to whole ticks), which keeps
    the bound a lower bound but not exact: ``exact`` is False then, and the multi-zone ``opt`` keeps its
    waste another way (kit.simulate.zones)."""

    def __init__(self, G: float, d: float, slack: float, move_h: float = 0.0, max_launches: int | None = None) -> None:
        units = self._units(G, d, move_h)
        lengths = self.lengths(G, d, slack, move_h, max_launches)
        self.exact = self.exact_for(G, d, move_h)
        self.idle_step: tuple[int, ...]
        self.launch_step: tuple[int, ...]
        self.move_step: tuple[int, ...]
        if units is not None:
            m, launch = units[0], units[1]
            u = G / m
            move = units[2] if len(units) > 2 else launch + math.floor(move_h / u + 1e-9)
            self.idle_step, self.launch_step, self.move_step = (m,), (launch,), (move,)
            self.hours = np.arange(lengths[0]) * u
        else:
            ticks = math.floor(move_h / G + 1e-9)
            self.idle_step, self.launch_step, self.move_step = (0, 1), (1, 0), (1, ticks)
            r, W = np.meshgrid(np.arange(lengths[0]), np.arange(lengths[1]), indexing="ij")
            self.hours = W * G + r * d
        # added after every step: +inf where the deadline can no longer be made
        self.bar = np.where(self.hours <= slack + 1e-7, 0.0, math.inf)

    @staticmethod
    def _units(G: float, d: float, move_h: float) -> tuple[int, ...] | None:
        return _common_units(G, d, d + move_h) or _common_units(G, d)

    @classmethod
    def lengths(cls, G: float, d: float, slack: float, move_h: float = 0.0,
                max_launches: int | None = None) -> tuple[int, ...]:
        """The lengths of the waste axes: (units,), or (launches, idle ticks) without a common unit."""
        units = cls._units(G, d, move_h)
        if units is not None:
            return (math.floor(slack / (G / units[0]) + 1e-9) + 1,)
        launches = math.floor(slack / d + 1e-9)
        if max_launches is not None:
            launches = min(launches, max_launches)
        return (launches + 1, math.floor(slack / G + 1e-9) + 1)

    @staticmethod
    def exact_for(G: float, d: float, move_h: float = 0.0) -> bool:
        """Whether these axes keep every waste exact: a unit of the tick makes d and d + T whole, or there
        is no transfer (the two axes are exact for any d)."""
        return move_h == 0.0 or _common_units(G, d, d + move_h) is not None

    def start(self) -> np.ndarray:
        """No state yet but the first (waste 0), at cost 0."""
        out = np.full(self.hours.shape, math.inf)
        out[(0,) * out.ndim] = 0.0
        return out

    def _shift(self, a: np.ndarray, steps: tuple[int, ...]) -> np.ndarray:
        """``a`` with its trailing waste axes moved up by ``steps`` (states pushed past the end drop)."""
        if not any(steps):  # no changeover: a launch wastes nothing
            return a.copy()
        out = np.full_like(a, math.inf)
        lead = (slice(None),) * (a.ndim - len(steps))
        shape = a.shape[a.ndim - len(steps):]
        if any(s >= n for s, n in zip(steps, shape)):
            return out
        dst = lead + tuple(slice(s, None) for s in steps)
        src = lead + tuple(slice(0, n - s) for s, n in zip(steps, shape))
        out[dst] = a[src]
        return out

    def shift_idle(self, a: np.ndarray) -> np.ndarray:
        return self._shift(a, self.idle_step)

    def shift_launch(self, a: np.ndarray) -> np.ndarray:
        return self._shift(a, self.launch_step)

    def shift_move(self, a: np.ndarray) -> np.ndarray:
        return self._shift(a, self.move_step)


def _common_units(G: float, *lengths: float) -> tuple[int, ...] | None:
    """(m, lengths in units of G/m...) for the smallest m <= 240 that makes every length whole; None if none does."""
    for m in range(1, 241):
        if all(abs(x * m / G - round(x * m / G)) < 1e-6 for x in lengths):
            return (m, *(round(x * m / G) for x in lengths))
    return None


class _Opt:
    """The omniscient bound, exact for any changeover and tick, by dynamic programming.

    A schedule is a sequence of runs (a launch, then ticks held on one market). A run of length
    ``L`` makes ``L - d`` of compute, so a schedule that has wasted ``w`` hours (idle ticks and
    changeovers) has made ``now - w`` of compute, exactly for every run longer than ``d``. A run
    not longer than ``d`` makes nothing and costs something, so no optimal schedule has one, and
    counting it as negative compute never makes a schedule look better than it is: the optimum
    over (market, waste) is the model's optimum. Only ``w <= R0 - C0`` can still make the deadline,
    whatever the tick, so a tick costs ``O((R0 - C0)/u)`` states per market (``_Waste``), without
    rounding compute to a grid."""

    def __init__(self, window: _Window) -> None:
        w = self.w = window
        self.waste = _Waste(w.G, w.d, w.R0 - w.C0, max_launches=w.span)
        self.idle = self.waste.start()
        self.spot = np.full_like(self.idle, math.inf)
        self.od = np.full_like(self.idle, math.inf)
        self.best = math.inf

    def _hold(self, held: np.ndarray, price: float, now: float) -> np.ndarray:
        """Hold one tick from states ``held`` at ``price``: the job finishes within it, or goes on."""
        w = self.w
        out = held + w.N * price * w.G
        out += self.waste.bar
        if now + w.G < w.C0 - EPS:  # no state can finish before compute C0 could be done
            return out
        rest = w.C0 - now + self.waste.hours  # compute + setup still to do (from this tick's start)
        ends = rest <= w.G + EPS
        finish = ends & np.isfinite(held) & (now + rest <= w.R0 + 1e-7)
        if finish.any():
            self.best = min(self.best, float((held[finish] + w.N * price * rest[finish]).min()))
        out[ends] = math.inf
        return out

    def tick(self, i: int) -> None:
        w, now = self.w, i * self.w.G
        if not w.avail[i]:  # the spot cluster is lost at the start of the tick
            self.idle = np.minimum(self.idle, self.spot)
            self.spot = np.full_like(self.spot, math.inf)
        stopped = np.minimum(self.idle, np.minimum(self.spot, self.od))  # stopping is free
        new_idle = self.waste.shift_idle(stopped)
        new_idle += self.waste.bar
        new_od = self._hold(np.minimum(self.od, self.waste.shift_launch(np.minimum(self.idle, self.spot))), w.q, now)
        new_spot = np.full_like(stopped, math.inf)
        if w.avail[i]:
            price = w.spot_prices[i]
            new_spot = self._hold(np.minimum(self.spot, self.waste.shift_launch(np.minimum(self.idle, self.od))),
                                  price, now)
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


# Above this many waste states per market, ``opt`` runs over exact Pareto fronts of (waste, cost) instead of
# waste arrays (kit.simulate.zones._ZoneOptFront): exact too, and its time does not grow with the states.
# Two axes (launches x idle ticks) grow as the changeover shrinks: d = 1e-4 h on 32-second ticks made 9 M
# states per market and hours of work; the fronts take seconds (docs/benchmarks.md, "opt runtime").
GRID_STATES_MAX = 50_000


def grid_states(G: float, d: float, slack: float, move_h: float = 0.0, max_launches: int | None = None) -> int:
    """The waste states per market of ``opt``'s array program (:class:`_Waste`)."""
    return math.prod(_Waste.lengths(G, d, slack, move_h, max_launches))


def simulate_opt(trace: Trace, start: int, params: Params) -> Run:
    """Cheapest way to finish by R0 knowing the whole trace (same model, DP): over waste arrays, or, where
    they would hold more than :data:`GRID_STATES_MAX` states, the multi-zone program's fronts on this one zone."""
    window = _Window.of(trace, start, params)
    if grid_states(window.G, window.d, window.R0 - window.C0, max_launches=window.span) > GRID_STATES_MAX:
        from kit.simulate.zones import one_zone_opt  # (kit.simulate.zones builds on this module)

        return one_zone_opt(trace, start, params)
    return _Opt(window).run(trace.name, start)


def simulate(traces: list[Trace], policies: list[str], params: Params, *, policy_params: dict | None = None) -> dict:
    """Every policy on every (trace, start); returns the summary (the ``--json`` document)."""
    params.check()
    check_gang(traces, params.nodes)
    for name in policies:
        if name not in ALL_POLICIES:
            raise InputError(f"unknown policy {name!r}", where="--policy", fix=f"use one of: {', '.join(ALL_POLICIES)}, all")
    runs: list[Run] = []
    skipped = []
    for trace in traces:
        params.check_tick(trace)
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

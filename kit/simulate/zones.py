"""A trace set replayed as one multi-zone market: offers, probes, moves, and the omniscient bound.

Model (docs/policies.md, "Many zones"; the single-zone rules of :mod:`kit.simulate.single` hold):

* One trace per zone, all with the same ticks. An offer is (zone, shape, market); a spot offer has
  capacity in tick ``i`` iff its zone's trace has ``data[i] >= shape.nodes`` (and the trace measured
  that instance type); on-demand always has capacity. Its price is the gang's: nodes x $/h per instance.
* A plan is tried in order at the start of a tick: the running offer continues; a spot offer without
  capacity is a failed launch (free; the policy is told next tick); the first other offer with
  capacity is launched. A launch spends ``d`` billed without progress; a launch in another zone than
  the newest checkpoint's also spends the transfer time ``T`` (billed) and pays egress across regions.
* Probes: a policy may probe any offer (a launch released at once): billed ``PROBE_H`` of the offer's
  price when it has capacity, free when not. A probe that the same tick's plan then launches is that
  launch, kept: billed as the run, not once more. What a policy learns is exactly: its own zone's capacity
  each tick, its launch attempts and its probes (``revealed``, checked by the no-leak test).
* Cost is relative to the whole job on the cheapest on-demand offer: ``Q_min x (C0 + d)``.
* ``opt``: dynamic programming over (offer or idle zone, waste) with the whole trace set known.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.errors import InputError
from kit.policy import ON_DEMAND, POLICY_NAMES, SPOT, make_policy
from kit.policy.offers import EACH, MAX_NODES, MAX_PRICE_PER_HOUR, PROBE_H, Moves, Offer, Shape, check_shapes
from kit.policy.zones import ZONE_POLICY_NAMES, Pinned, ZoneObservation, ZonePolicy, make_zone_policy
from kit.simulate.single import (
    EPS,
    GRID_STATES_MAX,
    OPT,
    Params,
    Run,
    _Waste,
    grid_states,
    span_ticks,
    split_tick,
)
from kit.traces import Trace, check_gang
from kit.validation import Finite, NotBool, input_error, require_mapping

ZONE_ALL = (OPT, "default", "failover", "up@each", "default@each")
OFFERS_DOC = 'docs/policies.md ("Offers file")'
OFFERS_FIX = f"see {OFFERS_DOC} for the format"


# --------------------------------------------------------------------------------------- market
@dataclass(frozen=True)
class ZoneSet:
    """The offers of one job over a trace set: per spot offer its capacity and price per tick."""

    G: float
    ticks: int
    offers: tuple[Offer, ...]
    avail: dict[Offer, np.ndarray]  # spot offers only
    prices: dict[Offer, np.ndarray]  # spot offers only (on-demand: Offer.price)

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o.zone for o in self.offers))

    @property
    def q_min(self) -> float:
        return min(o.price for o in self.offers if o.market == ON_DEMAND)

    def baseline(self, params: Params) -> float:
        """What every cost is relative to: the whole job on-demand in the cheapest zone, N x Q_min x (C0 + d)."""
        return self.q_min * (params.job_h + params.changeover_h)

    @classmethod
    def of(cls, traces: list[Trace], shapes: list[Shape], params: Params,
           prices: dict[tuple[str, str, str], float] | None = None) -> ZoneSet:
        """``prices``: $/h per instance by (zone or "*", instance type, market), overriding the traces'."""
        _check_set(traces)
        offers, avail, series = [], {}, {}
        for trace in traces:
            for shape in shapes:
                for market in shape.markets:
                    per_tick = _instance_prices(trace, shape, market, params, prices or {})
                    offer = Offer(zone=trace.name, shape=shape, market=market, price=shape.nodes * float(per_tick[0]))
                    offers.append(offer)
                    if market == SPOT:
                        avail[offer] = (np.array(trace.data) >= shape.nodes if _measures(trace, shape)
                                        else np.zeros(len(trace), bool))
                        series[offer] = shape.nodes * per_tick
        return cls(G=traces[0].tick_h, ticks=len(traces[0]), offers=tuple(offers), avail=avail, prices=series)


def _measures(trace: Trace, shape: Shape) -> bool:
    """Whether ``trace`` measured ``shape``'s spot capacity: its instance type (or it names none). A shape
    of another type has no spot capacity in the replay (the trace says nothing about it)."""
    return trace.metadata.get("instance_type") in (None, shape.instance_type)


def _check_set(traces: list[Trace]) -> None:
    names = [t.name for t in traces]
    if len(set(names)) != len(names):
        raise InputError(f"two traces for one zone ({', '.join(sorted({n for n in names if names.count(n) > 1}))})",
                         where="traces", fix="give one trace per zone")
    first = traces[0]
    for t in traces[1:]:
        if t.gap_seconds != first.gap_seconds or len(t) != len(first):
            raise InputError(f"{t.name}: {len(t)} ticks of {t.gap_seconds:g} s, but {first.name} has {len(first)} "
                             f"of {first.gap_seconds:g} s", where=str(t.path),
                             fix="a multi-zone market needs traces with the same ticks (or use --zones each)")
    _check_same_window(traces)


def _check_same_window(traces: list[Trace]) -> None:
    """Traces that say when they start (``metadata.start_utc``) start within one tick of each other: the replay
    takes a set's zones as simultaneous, and zones of different weeks would make a market that never was."""
    from datetime import datetime

    starts = []
    for t in traces:
        try:
            starts.append((datetime.fromisoformat(str(t.metadata["start_utc"]).replace("Z", "+00:00")), t))
        except (KeyError, ValueError):
            continue
    if not starts:
        return
    first_start, first = starts[0]
    for start, t in starts[1:]:
        if abs((start - first_start).total_seconds()) >= t.gap_seconds:
            raise InputError(f"{t.name} starts at {start:%Y-%m-%dT%H:%MZ}, {first.name} at {first_start:%Y-%m-%dT%H:%MZ}",
                             where=f"{t.path}: metadata.start_utc",
                             fix="a multi-zone market needs traces of the same window (or use --zones each)")


def _instance_prices(trace: Trace, shape: Shape, market: str, params: Params,
                     prices: dict[tuple[str, str, str], float]) -> np.ndarray:
    """$/h per instance of ``shape`` in the trace's zone: the offers file's, else the trace's price
    per instance scaled by GPUs per instance (the bundled prices are the 8-GPU list price / 8)."""
    for key in ((trace.name, shape.instance_type, market), ("*", shape.instance_type, market)):
        if key in prices:
            return np.full(len(trace), prices[key])
    scale = shape.gpus_per_node / float(trace.metadata.get("gpus_per_instance") or shape.gpus_per_node)
    if market == SPOT:
        return np.array(trace.spot_prices(params.spot_price)) * scale
    return np.full(len(trace), trace.on_demand_price(params.on_demand_price) * scale)


# --------------------------------------------------------------------------------------- offers file
class _ShapeFile(BaseModel):
    """One shape of an offers file or a ``--shape`` flag (whose numbers are strings: not strict, but no bool;
    the spec's bounds, kit.spec and kit.policy.offers)."""

    model_config = ConfigDict(extra="forbid")
    instance_type: str = Field(min_length=1)
    nodes: Annotated[int, NotBool] = Field(ge=1, le=MAX_NODES)
    gpus_per_node: Annotated[int, NotBool] = Field(default=1, ge=1, le=64)
    markets: list[str] = Field(default_factory=lambda: [SPOT, ON_DEMAND])
    spot_price: Finite | None = Field(default=None, gt=0, le=MAX_PRICE_PER_HOUR)  # $/h per instance, every zone
    on_demand_price: Finite | None = Field(default=None, gt=0, le=MAX_PRICE_PER_HOUR)


class _OffersFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shapes: list[_ShapeFile] = Field(min_length=1)


Offers = tuple[list[Shape], dict[tuple[str, str, str], float]]  # shapes, and list prices by (zone, type, market)


def check_market_shapes(shapes: list[Shape], where: str = "shapes") -> None:
    """:func:`check_shapes`, and one shape at least sold on-demand: in the model on-demand is always
    available (the deadline's safety net runs there), and costs are relative to the cheapest on-demand
    offer, N x Q_min x (C0 + d)."""
    check_shapes(shapes, where=where)
    if not any(ON_DEMAND in s.markets for s in shapes):
        raise InputError("no shape is sold on-demand: the replay's safety net runs the job on-demand, and costs "
                         "are relative to the cheapest on-demand offer", where=where,
                         fix="add on-demand to one shape's markets (markets: [spot, on-demand] in an offers file, "
                             "or --shape TYPE:NODES:GPUS_PER_NODE:on-demand)")


def _validated(model: type[BaseModel], raw: object, where: str, fallback_fix: str):
    """``raw`` as ``model``, or an InputError naming the first bad field at ``where`` (kit.validation's format)."""
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        raise input_error(error, where, doc=OFFERS_DOC, fallback_fix=fallback_fix) from None


def _offers(raw: object, where: str, fix: str) -> Offers:
    """Shapes (and list prices) from the offers file's content, or from ``--shape`` flags: validated once."""
    parsed = _validated(_OffersFile, raw, where, fix)
    shapes = [Shape(s.instance_type, s.nodes, s.gpus_per_node, tuple(s.markets)) for s in parsed.shapes]
    check_market_shapes(shapes, where=f"{where}: shapes")
    prices = {("*", s.instance_type, m): p for s in parsed.shapes
              for m, p in ((SPOT, s.spot_price), (ON_DEMAND, s.on_demand_price)) if p is not None}
    return shapes, prices


def load_offers(path: Path) -> Offers:
    """Shapes (and list prices) from an offers file: ``shapes: [{instance_type, nodes, gpus_per_node,
    markets, spot_price?, on_demand_price?}]``."""
    from kit.yamlfile import read_yaml

    raw = read_yaml(path, what="offers file", fix=OFFERS_FIX)
    require_mapping(raw, str(path), what="offers file", fix=f"write shapes: [...] in it; {OFFERS_FIX}")
    return _offers(raw, str(path), OFFERS_FIX)


SHAPE_FLAG_FIX = ("--shape TYPE:NODES[:GPUS_PER_NODE[:MARKETS]], MARKETS spot, on-demand or spot+on-demand "
                  "(e.g. --shape a3-highgpu-1g:16:1:spot --shape a3-highgpu-8g:2:8:on-demand)")


def shapes_from_flags(values: list[str]) -> Offers:
    """Shapes from ``--shape TYPE:NODES[:GPUS_PER_NODE[:MARKETS]]`` flags, in the order given (the order an
    offers file's shapes are tried in within a zone), priced as without a file (the traces' prices,
    scaled by GPUs per instance), and validated as an offers file is."""
    shapes = []
    for value in values:
        parts = value.split(":")
        if not 2 <= len(parts) <= 4:
            raise InputError(f"--shape {value!r} is not TYPE:NODES[:GPUS_PER_NODE[:MARKETS]]", where="--shape",
                             fix=SHAPE_FLAG_FIX)
        shape: dict[str, object] = {"instance_type": parts[0], "nodes": parts[1]}
        if len(parts) > 2:
            shape["gpus_per_node"] = parts[2]
        if len(parts) > 3:
            shape["markets"] = parts[3].split("+")
        shapes.append(_validated(_ShapeFile, shape, f"--shape {value}", SHAPE_FLAG_FIX).model_dump())
    return _offers({"shapes": shapes}, "--shape", SHAPE_FLAG_FIX)


def default_shapes(traces: list[Trace], nodes: int) -> list[Shape]:
    """One shape when no offers file is given: ``nodes`` x the traces' instance type, spot and on-demand."""
    meta = traces[0].metadata
    return [Shape(str(meta.get("instance_type") or "instance"), nodes, int(meta.get("gpus_per_instance") or 1))]


# --------------------------------------------------------------------------------------- replay
@dataclass
class ZoneRun:
    """One (start, policy) replay on the multi-zone market."""

    policy: str
    start: int
    cost: float
    cost_vs_on_demand: float
    done_h: float | None
    missed: bool
    spot_h: float = 0.0
    on_demand_h: float = 0.0
    launches: int = 0
    launches_without_progress: int = 0  # of them, those whose run ended before its changeover did: paid for nothing
    moves: int = 0
    probes: int = 0
    egress: float = 0.0  # $
    changeover_cost: float = 0.0  # $ billed in changeovers and checkpoint transfers, without progress
    timeline: list[dict] = field(default_factory=list)
    revealed: set[tuple[str, int]] = field(default_factory=set)  # (zone, tick) the policy learned about


class _View:
    """The market as one policy sees it in one tick: the offers, the move costs, and probes."""

    def __init__(self, replay: _ZoneReplay, tick: int) -> None:
        self.offers, self.moves = replay.market.offers, replay.moves
        self._replay, self._tick = replay, tick

    def probe(self, offer: Offer) -> bool:
        return self._replay.probe(offer, self._tick)

    def price(self, offer: Offer) -> float:
        self._replay.known(offer, "priced")
        return self._replay.price(offer, self._tick)


class _ZoneReplay:
    """One multi-zone policy, tick by tick: observe, plan, try the plan, hold (and pay) the tick."""

    def __init__(self, market: ZoneSet, start: int, params: Params, moves: Moves, policy: ZonePolicy,
                 record: bool = False) -> None:
        self.market, self.start, self.p, self.moves, self.policy, self.record = market, start, params, moves, policy, record
        self.span = span_ticks(params, market.G)
        self.running: Offer | None = None
        self.zone: str | None = policy.start_zone
        self.checkpoint_zone: str | None = None
        self.setup_left = self.progress = self.cost = 0.0
        self.unproven = False  # the latest launch has made no progress yet
        self.failed: tuple[Offer, ...] = ()
        self.probed: list[Offer] = []  # this tick's probes that found capacity, billed once the plan is tried
        self.run_ = ZoneRun(policy=policy.name, start=start, cost=0.0, cost_vs_on_demand=0.0, done_h=None, missed=False)

    def has_capacity(self, offer: Offer, i: int) -> bool:
        self.run_.revealed.add((offer.zone, i))
        return offer.market == ON_DEMAND or bool(self.market.avail[offer][self.start + i])

    def price(self, offer: Offer, i: int) -> float:
        return float(self.market.prices[offer][self.start + i]) if offer.spot else offer.price

    def known(self, offer: Offer, what: str) -> None:
        if offer not in self.market.offers:
            raise ValueError(f"policy {self.policy.name} {what} an unknown offer {offer}")

    def probe(self, offer: Offer, i: int) -> bool:
        self.known(offer, "probed")
        ok = self.has_capacity(offer, i)
        if ok:
            self.probed.append(offer)
        return ok

    def bill_probes(self, launched: Offer | None, i: int) -> None:
        """Bill this tick's probes that found capacity, each released at once (``PROBE_H``), except one of
        the offer the plan launched: that launch attempt is the instance the job keeps, and the clouds bill it
        as the run it becomes (the real loop's capacity search is its launch), not as a probe and a launch."""
        probed, self.probed = self.probed, []
        if launched is not None and launched in probed:
            probed.remove(launched)
        for offer in probed:
            self.run_.probes += 1
            self.cost += self.price(offer, i) * PROBE_H

    def observe(self, i: int) -> ZoneObservation:
        preempted = False
        if self.running is not None and self.running.spot and not self.has_capacity(self.running, i):
            self.running, preempted = None, True
        here = {}
        if self.zone is not None:
            here = {o.shape.name: self.has_capacity(o, i) for o in self.market.offers if o.spot and o.zone == self.zone}
        return ZoneObservation(now_h=i * self.market.G, progress_h=self.progress, job_h=self.p.job_h,
                               deadline_h=self.p.deadline_h, changeover_h=self.p.changeover_h, tick_h=self.market.G,
                               running=self.running, zone=self.zone, checkpoint_zone=self.checkpoint_zone, here=here,
                               preempted=preempted, failed=self.failed)

    def act(self, plan: list[Offer], i: int) -> None:
        failed, launched = [], None
        for offer in plan:
            self.known(offer, "planned")
            if offer == self.running:
                break
            if not self.has_capacity(offer, i):
                failed.append(offer)
                continue
            self.launch(offer)
            launched = offer
            break
        else:
            self.running = None
        self.failed = tuple(failed)
        self.bill_probes(launched, i)

    def launch(self, offer: Offer) -> None:
        self.setup_left = self.moves.launch_h(self.p.changeover_h, self.checkpoint_zone, offer.zone)
        egress = self.moves.egress(self.checkpoint_zone, offer.zone)
        self.cost += egress
        self.run_.egress += egress
        self.run_.launches += 1
        self.run_.launches_without_progress += self.unproven  # the run before this launch ended, never progressing
        self.unproven = True
        if self.checkpoint_zone is not None and self.checkpoint_zone != offer.zone:
            self.run_.moves += 1
        # The newest checkpoint stays where it was made until the run here makes progress (``hold``): a
        # launch copies it, and a run lost before its first step leaves the original as new as the copy.
        self.running, self.zone = offer, offer.zone

    def hold(self, i: int) -> float:
        G, offer = self.market.G, self.running
        if offer is None:
            return 0.0
        setup, work = split_tick(self.setup_left, G, self.p.job_h - self.progress)
        self.setup_left -= setup
        self.progress += work
        if work > 0:
            self.checkpoint_zone, self.unproven = offer.zone, False
        self.cost += self.price(offer, i) * (setup + work)
        self.run_.changeover_cost += self.price(offer, i) * setup
        if offer.spot:
            self.run_.spot_h += setup + work
        else:
            self.run_.on_demand_h += setup + work
        return setup + work

    def run(self) -> ZoneRun:
        r, G = self.run_, self.market.G
        for i in range(self.span):
            obs = self.observe(i)
            self.act(self.policy.decide(obs, _View(self, i)), i)
            held = self.hold(i)
            if self.record:
                r.timeline.append({"t": i * G, "zone": self.zone, "offer": self.running.name if self.running else None,
                                   "market": self.running.market if self.running else None, "progress": self.progress})
            if self.progress >= self.p.job_h - EPS:
                r.done_h = i * G + held
                break
        if r.done_h is None:  # finish on the cheapest on-demand after the window, for the cost
            rest = self.p.changeover_h + self.p.job_h - self.progress
            self.cost += self.market.q_min * rest
            r.on_demand_h += rest
        r.launches_without_progress += self.unproven  # the last run, if it never progressed before the window ended
        baseline = self.market.baseline(self.p)
        r.cost, r.cost_vs_on_demand = self.cost, self.cost / baseline
        r.missed = r.done_h is None or r.done_h > self.p.deadline_h + 1e-7
        return r


def replay(market: ZoneSet, start: int, params: Params, moves: Moves, policy: ZonePolicy, *,
           record: bool = False) -> ZoneRun:
    """Replay one multi-zone policy from tick ``start``."""
    return _ZoneReplay(market, start, params, moves, policy, record).run()


def policies_for(name: str, market: ZoneSet, moves: Moves, seed: int) -> list[ZonePolicy]:
    """The policy objects a name stands for: ``default`` / ``failover`` (one), ``up@each`` (one per
    zone), ``up@us-east4-a`` (one, pinned)."""
    if "@" not in name:
        if name not in ZONE_POLICY_NAMES:
            raise InputError(f"unknown multi-zone policy {name!r}", where="--policy",
                             fix=f"use one of: {', '.join((OPT, *ZONE_POLICY_NAMES))}, or POLICY@each / POLICY@ZONE "
                                 f"with POLICY one of {', '.join(POLICY_NAMES)}")
        return [make_zone_policy(name, market.offers, moves, seed=seed)]
    single, _, where = name.partition("@")
    zones = list(market.zones) if where == EACH else [where]
    if where != EACH and where not in market.zones:
        raise InputError(f"zone {where!r} is not in the market", where="--policy",
                         fix=f"use one of: {', '.join(market.zones)}, or {single}@{EACH}")
    return [Pinned(market.offers, moves, zone, make_policy(single), seed=seed) for zone in zones]


# --------------------------------------------------------------------------------------- opt
def _move_h(market: ZoneSet, moves: Moves) -> float:
    """The checkpoint transfer of a move, T: the same between any two zones (none with one zone)."""
    return moves.transfer_h("a", "b") if len(market.zones) > 1 else 0.0


class _ZoneProgram(ABC):
    """The omniscient bound's dynamic program, tick by tick (``tick``), with the cheapest finish (``best``)."""

    def __init__(self, market: ZoneSet, start: int, params: Params, moves: Moves) -> None:
        self.m, self.start, self.p = market, start, params
        self.T = _move_h(market, moves)
        self.best = math.inf

    @abstractmethod
    def tick(self, i: int) -> None:
        """Every state one tick on, from tick ``i`` of the start (finishes within it go to ``best``)."""

    def solve(self) -> ZoneRun:
        p = self.p
        for i in range(span_ticks(p, self.m.G)):
            if i * self.m.G >= p.deadline_h - EPS:
                break
            self.tick(i)
        baseline = self.m.baseline(p)
        missed = not math.isfinite(self.best)
        cost = baseline if missed else self.best
        return ZoneRun(policy=OPT, start=self.start, cost=cost, cost_vs_on_demand=cost / baseline, done_h=None,
                       missed=missed)


class _ZoneOpt(_ZoneProgram):
    """The omniscient bound over every offer, moves included, by dynamic programming.

    States per tick: idle with the checkpoint in zone z (``idle[z]``), running offer o (``run[o]``),
    and not yet started (``fresh``), each over the waste axes of :class:`_Waste` (the proof that
    waste and market are a sufficient state is :class:`kit.simulate.single._Opt`'s; a move only adds
    ``T`` to the waste and egress to the cost). A tick costs O(offers + zones^2) x states. Exact when
    ``waste.exact`` (a unit of the tick makes d and d + T whole); else :class:`_ZoneOptFront` is."""

    def __init__(self, market: ZoneSet, start: int, params: Params, moves: Moves) -> None:
        super().__init__(market, start, params, moves)
        zones = market.zones
        self.zi = np.array([zones.index(o.zone) for o in market.offers])
        self.spot = np.array([o.spot for o in market.offers])
        self.waste = _Waste(market.G, params.changeover_h, params.deadline_h - params.job_h, move_h=self.T,
                            max_launches=span_ticks(params, market.G))
        egress = np.array([[moves.egress(a, b) for b in zones] for a in zones])
        np.fill_diagonal(egress, math.inf)
        self.egress = egress[:, :, None] if self.waste.hours.ndim == 1 else egress[:, :, None, None]
        self.fresh = self.waste.start()
        shape = self.fresh.shape
        self.idle = np.full((len(zones), *shape), math.inf)
        self.run = np.full((len(market.offers), *shape), math.inf)

    def _hold(self, held: np.ndarray, prices: np.ndarray, now: float) -> np.ndarray:
        """Hold one tick from ``held`` (offers x waste): finish within it, or go on."""
        p, G, hours = self.p, self.m.G, self.waste.hours
        price = prices.reshape((-1,) + (1,) * hours.ndim)
        out = held + price * G + self.waste.bar
        if now + G < p.job_h - EPS:
            return out
        rest = p.job_h - now + hours
        ends = rest <= G + EPS
        finish = ends & np.isfinite(held) & (now + rest <= p.deadline_h + 1e-7)
        if finish.any():
            self.best = min(self.best, float((held + price * rest)[finish].min()))
        out[:, ends] = math.inf
        return out

    def tick(self, i: int) -> None:
        m, now, t = self.m, i * self.m.G, self.start + i
        up = np.array([bool(m.avail[o][t]) if o.spot else True for o in m.offers])
        lost = self.spot & ~up
        np.minimum.at(self.idle, self.zi[lost], self.run[lost])
        self.run[lost] = math.inf
        stopped = self.idle.copy()
        np.minimum.at(stopped, self.zi, self.run)  # stopping is free
        moved = (stopped[:, None] + self.egress).min(axis=0)  # into zone b from any other zone a
        enter = np.minimum(self.waste.shift_launch(stopped), self.waste.shift_move(moved))
        enter = np.minimum(enter, self.waste.shift_launch(self.fresh)[None])
        self.idle = self.waste.shift_idle(stopped) + self.waste.bar
        self.fresh = self.waste.shift_idle(self.fresh) + self.waste.bar
        prices = np.array([m.prices[o][t] if o.spot else o.price for o in m.offers])
        held = np.minimum(self.run, enter[self.zi])
        held[~up] = math.inf  # a spot offer down in this tick can neither run nor finish the job in it
        self.run = self._hold(held, prices, now)


Front = tuple[np.ndarray, np.ndarray]  # (waste hours, $) pairs, waste ascending, $ strictly descending
_EMPTY: Front = (np.empty(0), np.empty(0))


def _front(waste: np.ndarray, cost: np.ndarray) -> Front:
    """The pairs of (``waste``, ``cost``) that no other pair beats on both: less waste is never worse (the
    same decisions from less waste finish no later, at no more cost), so a pair with more waste and no
    lower cost than another cannot be part of a cheapest schedule."""
    ok = np.isfinite(cost)
    waste, cost = waste[ok], cost[ok]
    if waste.size <= 1:
        return waste, cost
    order = np.lexsort((cost, waste))
    waste, cost = waste[order], cost[order]
    keep = np.ones(waste.size, dtype=bool)
    keep[1:] = cost[1:] < np.minimum.accumulate(cost)[:-1] - 1e-9
    return waste[keep], cost[keep]


def _union(*fronts: Front) -> Front:
    return _front(np.concatenate([f[0] for f in fronts]), np.concatenate([f[1] for f in fronts]))


class _ZoneOptFront(_ZoneProgram):
    """:class:`_ZoneOpt` for a changeover and transfer that no unit of the tick makes whole (d = 0.2001 h;
    a 100 GB checkpoint at 1.9 Gbit/s): each state's waste is kept as a Pareto front of (waste, cost) pairs
    (:func:`_front`) instead of an array over waste units, so every waste W G + r d + k T stays exact,
    however many launches r and moves k made it. The fronts stay small: a pair is kept only while more
    waste has bought a lower cost."""

    def __init__(self, market: ZoneSet, start: int, params: Params, moves: Moves) -> None:
        super().__init__(market, start, params, moves)
        zones = market.zones
        self.zi = [zones.index(o.zone) for o in market.offers]
        self.slack = params.deadline_h - params.job_h
        self.egress = [[moves.egress(a, b) for b in zones] for a in zones]
        self.idle: list[Front] = [_EMPTY] * len(zones)
        self.run: list[Front] = [_EMPTY] * len(market.offers)

    def _later(self, front: Front, hours: float, dollars: float = 0.0) -> Front:
        """``front`` after ``hours`` more waste and ``dollars`` more cost (pairs past the slack drop)."""
        waste = front[0] + hours
        ok = waste <= self.slack + 1e-7
        return waste[ok], front[1][ok] + dollars

    def _hold_front(self, front: Front, price: float, now: float) -> Front:
        """Hold one tick at ``price``: the pairs whose job ends within it finish (``best``), the rest go on."""
        waste, cost = front
        p, G = self.p, self.m.G
        if waste.size and now + G >= p.job_h - EPS:
            rest = p.job_h - now + waste
            ends = rest <= G + EPS
            finish = ends & (now + rest <= p.deadline_h + 1e-7)
            if finish.any():
                self.best = min(self.best, float((cost + price * rest)[finish].min()))
            waste, cost = waste[~ends], cost[~ends]
        return waste, cost + price * G

    def tick(self, i: int) -> None:
        m, now, t, d = self.m, i * self.m.G, self.start + i, self.p.changeover_h
        zones = range(len(m.zones))
        up = [bool(m.avail[o][t]) if o.spot else True for o in m.offers]
        for k in (k for k, o in enumerate(m.offers) if not up[k]):  # lost at the start of the tick
            self.idle[self.zi[k]], self.run[k] = _union(self.idle[self.zi[k]], self.run[k]), _EMPTY
        stopped = [_union(self.idle[z], *(r for r, zk in zip(self.run, self.zi) if zk == z)) for z in zones]
        moved = [_union(*(self._later(stopped[a], 0.0, self.egress[a][b]) for a in zones if a != b), _EMPTY)
                 for b in zones]
        fresh = self._later((np.array([now]), np.array([0.0])), 0.0)  # not started yet: waste = the time so far
        enter = [_union(self._later(stopped[z], d), self._later(moved[z], d + self.T), self._later(fresh, d))
                 for z in zones]
        self.idle = [self._later(front, m.G) for front in stopped]
        self.run = [self._hold_front(_union(self.run[k], enter[self.zi[k]]), m.prices[o][t] if o.spot else o.price, now)
                    if up[k] else _EMPTY for k, o in enumerate(m.offers)]


def opt_program(market: ZoneSet, start: int, params: Params, moves: Moves) -> _ZoneProgram:
    """``opt``'s program for one start: over waste arrays where a unit of the tick makes d and d + T whole
    (the bundled traces with the default transfer) and the arrays stay small (:data:`GRID_STATES_MAX`), else
    over exact Pareto fronts (:class:`_ZoneOptFront`)."""
    G, d, T = market.G, params.changeover_h, _move_h(market, moves)
    small = grid_states(G, d, params.deadline_h - params.job_h, T, span_ticks(params, G)) <= GRID_STATES_MAX
    return (_ZoneOpt if small and _Waste.exact_for(G, d, T) else _ZoneOptFront)(market, start, params, moves)


def one_zone_opt(trace: Trace, start: int, params: Params) -> Run:
    """The one-zone ``opt`` (kit.simulate.single.simulate_opt) by this module's program over Pareto fronts:
    the same model on a market of that one zone, where no move can happen."""
    market = ZoneSet.of([trace], default_shapes([trace], params.nodes), params)
    run = _ZoneOptFront(market, start, params, Moves()).solve()
    return Run(trace=trace.name, start=start, policy=OPT, cost=run.cost, cost_vs_on_demand=run.cost_vs_on_demand,
               done_h=None, missed=run.missed)


def simulate_opt_zones(market: ZoneSet, start: int, params: Params, moves: Moves) -> ZoneRun:
    return opt_program(market, start, params, moves).solve()


# --------------------------------------------------------------------------------------- summary
def zone_starts(market: ZoneSet, params: Params) -> list[int]:
    span = span_ticks(params, market.G)
    if market.ticks < span:
        return []
    return [int(s) for s in np.linspace(0, market.ticks - span, params.starts).astype(int)]


def _stats(runs: list[ZoneRun]) -> dict:
    costs = [r.cost_vs_on_demand for r in runs]
    return {"cost_vs_on_demand": float(np.mean(costs)), "cost_vs_on_demand_p75": float(np.percentile(costs, 75)),
            "deadline_misses": sum(r.missed for r in runs),
            "moves": float(np.mean([r.moves for r in runs])), "probes": float(np.mean([r.probes for r in runs])),
            "egress": float(np.mean([r.egress for r in runs])), "launches": float(np.mean([r.launches for r in runs])),
            "launches_without_progress": float(np.mean([r.launches_without_progress for r in runs])),
            "changeover_cost": float(np.mean([r.changeover_cost for r in runs])),
            "spot_hours": float(np.mean([r.spot_h for r in runs])),
            "on_demand_hours": float(np.mean([r.on_demand_h for r in runs]))}


# What a replay counts of a policy's schedule; ``opt``'s program finds its cost without rebuilding its
# schedule, so these are null (None) for it rather than zeros that read as "no launch".
SCHEDULE_FIELDS = ("moves", "probes", "egress", "launches", "launches_without_progress", "changeover_cost", "spot_hours",
                   "on_demand_hours")
# The per-policy figures of a summary (:func:`simulate_market`): {field: {policy: value}}
POLICY_FIELDS = ("cost_vs_on_demand", "deadline_misses", "cost_vs_on_demand_p75", *SCHEDULE_FIELDS)


def _rows(name: str, market: ZoneSet, starts: list[int], params: Params, moves: Moves) -> dict[str, dict]:
    """Summary rows of one policy name: one row, or for POLICY@each the mean over zones and the best zone."""
    if name == OPT:
        bound = _stats([simulate_opt_zones(market, s, params, moves) for s in starts])
        return {OPT: {**bound, **dict.fromkeys(SCHEDULE_FIELDS)}}
    by: dict[str, list[ZoneRun]] = {}
    for s in starts:
        for policy in policies_for(name, market, moves, seed=s):
            by.setdefault(policy.name, []).append(replay(market, s, params, moves, policy))
    if not name.endswith("@" + EACH):
        return {n: _stats(rs) for n, rs in by.items()}
    per_zone = {n: _stats(rs) for n, rs in by.items()}
    best = min(per_zone, key=lambda n: per_zone[n]["cost_vs_on_demand"])
    mean = _stats([r for rs in by.values() for r in rs])
    # misses as its cost: the mean over zones of each zone's missed starts, out of ``runs`` as every row's
    # (their sum counted each start once per zone)
    mean["deadline_misses"] = float(np.mean([v["deadline_misses"] for v in per_zone.values()]))
    single = name.partition("@")[0]
    return {f"{single}@mean-zone": {**mean, "per_zone": {n.partition('@')[2]: v["cost_vs_on_demand"]
                                                          for n, v in per_zone.items()}},
            f"{single}@best-zone": {**per_zone[best], "zone": best.partition("@")[2]}}


def zone_market(traces: list[Trace], params: Params, moves: Moves, shapes: list[Shape] | None = None,
                prices: dict | None = None) -> ZoneSet:
    """The checked multi-zone market of a trace set (one shape from the traces when none is given)."""
    params.check()
    moves.check()
    given = shapes is not None
    shapes = shapes or default_shapes(traces, params.nodes)
    check_market_shapes(shapes)
    params.check_tick(traces[0])  # the set's traces share their ticks (_check_set)
    for shape in shapes:
        measured = [t for t in traces if _measures(t, shape)]
        if SPOT in shape.markets and not measured:  # its spot offers would never have capacity
            types = sorted({str(t.metadata.get("instance_type")) for t in traces})
            raise InputError(f"no trace measured spot capacity for {shape.instance_type} (they measured "
                             f"{', '.join(types)}), so its spot offers would never be available",
                             where=f"shapes: {shape.name}",
                             fix="sell that shape on-demand only, or give traces measured for its instance type")
        check_gang(measured, shape.nodes, where=f"shapes: {shape.name}" if given else "--nodes")
    return ZoneSet.of(traces, shapes, params, prices)


def simulate_zones(traces: list[Trace], policies: list[str], params: Params, moves: Moves,
                   shapes: list[Shape] | None = None, prices: dict | None = None) -> dict:
    """Every policy on every start of the multi-zone market; returns the ``--json`` document."""
    return simulate_market(zone_market(traces, params, moves, shapes, prices), policies, params, moves)


def simulate_market(market: ZoneSet, policies: list[str], params: Params, moves: Moves) -> dict:
    """:func:`simulate_zones` on a market already built."""
    starts = zone_starts(market, params)
    rows: dict[str, dict] = {}
    for name in policies if starts else []:
        rows.update(_rows(name, market, starts, params, moves))
    names = list(rows)
    return {
        "runs": len(starts), "policies": names, "zones": list(market.zones),
        "offers": [{"offer": o.name, "price_per_hour": round(o.price, 4)} for o in market.offers],
        **{key: {n: rows[n][key] for n in names} for key in POLICY_FIELDS},
        "best_zone": {n: rows[n]["zone"] for n in names if "zone" in rows[n]},
        "per_zone": {n: rows[n]["per_zone"] for n in names if "per_zone" in rows[n]},
        "params": {"nodes": params.nodes, "job_hours": params.job_h, "deadline_hours": params.deadline_h,
                   "changeover_hours": params.changeover_h, "starts": params.starts,
                   "checkpoint_gb": moves.checkpoint_gb, "transfer_gbps": moves.transfer_gbps,
                   "egress_per_gb": moves.egress_per_gb,
                   "shapes": list(dict.fromkeys(o.shape.name for o in market.offers))},
    }

"""Multi-zone policies: which offer (zone x shape x market) the job runs on, and when it moves.

A :class:`ZonePolicy` is called once per tick with a :class:`ZoneObservation` and a :class:`Market`.
It answers a *plan*: offers to try in order. The first one that can be had runs (the one already
running continues without a new changeover); a spot offer without capacity is a failed launch attempt,
free, and is reported back in the next observation; an empty plan holds nothing.

What a policy may know (docs/policies.md, "Many zones"): the spot capacity of the zone it is in
(``here``), the results of its own launch attempts, and what it learns from ``Market.probe``: a
launch attempt that is released at once, billed one minute of the offer's price when it succeeds
and free when it fails, as SkyNomad and the clouds bill it. Nothing else about other zones.

* ``pinned``: a single-zone :class:`~kit.policy.market.Policy` in one zone (the baselines ``up``,
  ``default``, ... per zone).
* ``failover``: SkyPilot's ``EAGER_NEXT_REGION`` recovery: relaunch spot in another zone after a
  preemption, zones in shuffled order with the one that just preempted last; on-demand only from the
  safety net.
* ``default``: kit's multi-zone policy (:class:`ZoneDefault`).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from kit.policy.market import (
    EPS,
    ON_DEMAND,
    SPOT,
    WAIT,
    DefaultPolicy,
    Observation,
    Policy,
    censored_mean,
    launch_can_progress,
)
from kit.policy.offers import Moves, Offer

ZONE_POLICY_NAMES = ("failover", "default")


@dataclass(frozen=True)
class ZoneObservation:
    """What a multi-zone policy sees at the start of a tick (times in hours)."""

    now_h: float
    progress_h: float
    job_h: float
    deadline_h: float | None
    changeover_h: float
    tick_h: float
    running: Offer | None  # what holds now (None: nothing)
    zone: str | None  # the zone the job is in: running there, or last ran there (None: not yet anywhere)
    checkpoint_zone: str | None  # where the newest checkpoint is (None: no progress yet)
    here: Mapping[str, bool] = field(default_factory=dict)  # spot capacity in ``zone``, by shape name
    preempted: bool = False  # the spot offer that was running was lost at the start of this tick
    failed: tuple[Offer, ...] = ()  # launch attempts of the last tick that found no capacity

    @property
    def remaining_h(self) -> float:
        return max(0.0, self.job_h - self.progress_h)


class Market(Protocol):
    """The replay's (or the watcher's) side of the conversation."""

    offers: tuple[Offer, ...]
    moves: Moves

    def probe(self, offer: Offer) -> bool:
        """Try to launch ``offer`` and release it at once: True when it could be had."""

    def price(self, offer: Offer) -> float:
        """``offer``'s $/h in this tick (the clouds publish spot prices, so this says nothing about capacity):
        its spot price now, or its list price on-demand."""


def finishing_offer(obs: ZoneObservation, offers: tuple[Offer, ...], moves: Moves) -> tuple[Offer, float]:
    """The on-demand offer to finish the job on from here, and the hours it needs (remaining compute
    + changeover + checkpoint transfer): the cheapest that can still meet the deadline, else the
    fastest. The fastest (no transfer) has the most slack, so when this offer's slack is one tick
    the fastest's is too, and the net (below) never lets every offer become too late."""
    rated = []
    for offer in offers:
        if offer.market != ON_DEMAND:
            continue
        hours = obs.remaining_h + obs.changeover_h  # as the single-zone net: a relaunch stays affordable
        if obs.running != offer:
            hours += moves.transfer_h(obs.checkpoint_zone, offer.zone)
        cost = offer.price * hours + moves.egress(obs.checkpoint_zone, offer.zone)
        rated.append((cost, hours, offer))
    if not rated:
        raise ValueError("no on-demand offer: the deadline safety net needs one")
    left = None if obs.deadline_h is None else obs.deadline_h - obs.now_h
    feasible = [r for r in rated if left is None or r[1] <= left + EPS]
    cost, hours, offer = (min(feasible, key=lambda r: r[:2]) if feasible
                          else min(rated, key=lambda r: (r[1], r[0])))
    return offer, hours


def search_order(offers: tuple[Offer, ...], market: str, rng: random.Random, *, current: Offer | None = None,
                 preempted_zone: str | None = None) -> list[Offer]:
    """Where to try a launch on ``market``, in order: SkyPilot's ``EAGER_NEXT_REGION``
    (sky/jobs/recovery_strategy.py) with the Spell seed's "shuffle the zones and try each in turn": the
    zones in shuffled order, the one that just preempted last; the zone the job runs in first unless
    it is that one (no checkpoint to move). Within a zone, the running shape first, then the given
    order. The watcher's capacity search and ``failover`` both use it.

    On-demand: the zone the job is in first (its running shape, then the cheapest) even if its spot
    capacity was just lost: a spot preemption says nothing about on-demand capacity, and a launch
    elsewhere would move the checkpoint (transfer, egress, new disks) for nothing, which the simulated
    policies' on-demand choice (:func:`finishing_offer`, the checkpoint's zone at equal prices) does not
    do. Then the other zones' offers, the running shape first, then the cheapest."""
    mine = [o for o in offers if o.market == market]
    zones = sorted({o.zone for o in mine})
    rng.shuffle(zones)
    if market == ON_DEMAND:
        here = current.zone if current is not None else None
        tie = {z: i for i, z in enumerate(zones)}
        return sorted(mine, key=lambda o: (o.zone != here, current is not None and o.shape != current.shape,
                                           o.price, tie[o.zone]))
    if preempted_zone in zones:
        zones.remove(preempted_zone)
        zones.append(preempted_zone)
    here = current.zone if current is not None else None
    if here in zones and here != preempted_zone:
        zones.remove(here)
        zones.insert(0, here)
    out: list[Offer] = []
    for zone in zones:
        in_zone = [o for o in mine if o.zone == zone]
        if current is not None:
            in_zone.sort(key=lambda o: o.shape != current.shape)
        out += in_zone
    return out


DEFAULT_PRIOR_RUN_H = 4.0  # a spot offer without history is assumed to run this long between losses
# How cautious ``default`` is when it waits for the best spot offer it knows instead of running a dearer
# one now: every estimate behind that choice is taken this many standard errors on the side that
# argues against waiting (UCB, "optimism in the face of uncertainty": Auer, Cesa-Bianchi and Fischer,
# "Finite-time analysis of the multiarmed bandit problem", Machine Learning 47, 2002). One standard
# error, the textbook choice, not tuned.
CONFIDENCE_SE = 1.0
# How many of an offer's latest spot runs its estimates use. Spot markets change regime: on the bundled
# GCP traces us-east4-a gives runs of hours for days, then capacity that comes and goes every other tick;
# over the whole history its mean run fell only from 1.6 to 1.1 h after 44 such losses, and the job kept
# launching into it. A sliding window forgets the old regime after this many runs (sliding-window UCB:
# Garivier and Moulines, "On Upper-Confidence Bound Policies for Switching Bandit Problems", ALT 2011).
# Chosen on the development markets (docs/policy-rounds.md): 6 to 16 all fix the us-east4 rows;
# 12 changes no stationary synthetic market measurably.
RUN_WINDOW = 12
# How much of Uniform Progress's slack the multi-zone ``default`` keeps from waiting: idle in an outage,
# it runs on-demand rather than wait once its slack is below PACE x the slack ``up`` would have now
# (``uniform_slack``). What the job has learned of "the best spot offer it can find" says little about
# the zones it has not yet seen up: on the synthetic markets the zone with long runs is often down for
# the first 10-20 hours, and a job that had spent its slack waiting through flicker elsewhere could not
# use it (Uniform Progress rations slack over the deadline for the same reason: Wu et al., "Can't Be
# Late", NSDI 2024). Not in the one-zone ``default``, whose learned market is the market (there it lost
# synthetic rows). Chosen on the development markets (docs/policy-rounds.md): 0.4 to 0.75
# all helped; 1 (``up``'s own line) lost rows.
PACE = 0.5
# How many of the latest runs and outages of "the best spot offer the job can get now" the inner market
# policy of a job that may move learns from (one-zone ``default``: all of them). That market changes
# regime as the job's zones do (the bundled GCP us-east4 zones give runs of hours for days, then capacity
# that comes and goes every other tick), and its slack budget and launch rule are means over it; a
# sliding window as for each offer's runs (RUN_WINDOW; Garivier and Moulines, ALT 2011). Chosen on the GCP
# rows of docs/benchmarks.md ("Many zones"; docs/policy-rounds.md) among 6-24: each lowers us-east4 at R0 = 72 h (0.5172 ->
# 0.496-0.507, most of it one start that ended on 11 h of on-demand); 16 is the one that leaves no GCP row
# more than 0.001 dearer. Held out: the AWS rows are unchanged, seeds 21-30 not worse (mean 0.4059 ->
# 0.4052); the stationary synthetic markets of seeds 11-13 are 0.0018 dearer on average (none above a
# baseline).
MARKET_WINDOW = 16
# How many runs' worth of weight the pooled mean run has in each offer's own mean run (:func:`mean_runs`):
# the offer's estimate is shrunk towards the pool as an empirical-Bayes posterior is (a Gamma prior on the
# offer's loss rate, of this shape, centred on the pooled rate). The less zones resemble each other, the
# smaller that weight should be: the development markets' zones differ in mean run from 20 min to 12 h, and
# with a weight of one run, a zone whose runs were far shorter than the pool's still looked half as good as
# the pool after its first loss, so a job whose changeover was longer than those runs tried it again and again
# (test_default_gives_up_sooner_on_a_zone_whose_runs_cannot_pay_their_changeover). Chosen on the development
# markets among 0.5-1 (docs/policy-rounds.md): 0.5-0.8 all win more rows than 1; 0.7 the most.
POOL_WEIGHT = 0.7
# On spot, the multi-zone ``default`` leaves its offer only for one at least this much cheaper per hour of progress
# than the running one's bare price (its changeover, transfer and short runs included there): the watcher's
# tries to move (:func:`try_move`) use the same margin.
MOVE_MARGIN = 0.3


def move_ceiling(price: float, margin: float = MOVE_MARGIN) -> float:
    """The most an hour of progress on another spot offer may cost for a job on a spot offer at ``price`` $/h
    to move there (:data:`MOVE_MARGIN` below that bare price): the simulated ``default``'s move rule, the
    watcher's move tries, and the stay a cheaper offer's return cuts short (:meth:`ZoneDefault.stay_h`)."""
    return price * (1 - margin)


def moving_market_policy(**params) -> DefaultPolicy:
    """The market decision (spot, on-demand or wait) of a job that may move between offers: the one-zone
    ``default`` on the market "the best spot offer the job can get now", with one changeover of lookahead,
    not the one-zone policy's two (when a run ends the job mostly launches another zone's spot, not
    on-demand, so a short run costs one launch more, not a round trip; with two, the job waited out the
    tail of short runs and spent the slack that kept it off a pricey zone: the pricey-zone test in
    tests/unit/kit/simulate/test_zones.py), pacing (:data:`PACE`), and learning from the latest
    :data:`MARKET_WINDOW` runs and outages. :class:`ZoneDefault` decides with it, and so does the watcher
    for a spec with several zones or shapes (``kit.watch.session``)."""
    return DefaultPolicy(**{"lookahead_changeovers": 1.0, "pace": PACE, "window": MARKET_WINDOW, "budget_se": CONFIDENCE_SE,
                            **params})


class RunRecord:
    """The job's spot runs on each offer, the latest :data:`RUN_WINDOW` of each: ``hours`` held on them and
    ``losses``, how many a preemption ended (a run the job left is censored, not a loss). The multi-zone
    ``default`` and the watcher's capacity search learn from the same record."""

    def __init__(self, offers: Iterable[Offer]) -> None:
        offers = list(offers)
        self.runs: dict[Offer, deque[tuple[float, bool]]] = {o: deque(maxlen=RUN_WINDOW) for o in offers}
        self.hours: dict[Offer, float] = {o: 0.0 for o in offers}
        self.losses: dict[Offer, int] = {o: 0 for o in offers}

    def add(self, offer: Offer, hours: float, *, lost: bool) -> None:
        runs = self.runs.setdefault(offer, deque(maxlen=RUN_WINDOW))
        runs.append((hours, lost))
        self.hours[offer] = sum(h for h, _ in runs)
        self.losses[offer] = sum(1 for _, lost_ in runs if lost_)


def mean_runs(hours: Mapping[Offer, float], losses: Mapping[Offer, int], *, prior_run_h: float = DEFAULT_PRIOR_RUN_H,
              weight: float = 1.0, held: Offer | None = None, age: float = 0.0,
              pool_weight: float = POOL_WEIGHT) -> dict[Offer, float]:
    """Mean length of a spot run on each offer of ``hours``: hours held over losses, with a prior of
    ``pool_weight`` runs of the length pooled over all offers (itself with a prior run of ``prior_run_h``,
    weight ``weight``); the run going on now (on ``held``, ``age`` hours so far) counts with its age. This is
    the maximum-likelihood mean of an exponential from censored runs (voluntary leaves are censored)."""
    pooled = (weight * prior_run_h + sum(hours.values()) + age) / (weight + sum(losses.values()))
    return {offer: (pool_weight * pooled + (held_h + (age if held == offer else 0.0))) / (pool_weight + losses.get(offer, 0))
            for offer, held_h in hours.items()}


def probing_runs(runs: Mapping[Offer, float], losses: Mapping[Offer, float], *,
                 prior_run_h: float = DEFAULT_PRIOR_RUN_H) -> dict[Offer, float]:
    """The mean runs of :func:`mean_runs` as a search for capacity ranks them: an offer the job has never
    seen lose keeps at least the prior run. Its pooled estimate is only the other offers' record, and
    after a bad start in a few zones it ranked an untried zone below every other (and, in the
    simulator, below on-demand, so it was never tried); optimistic initial values, Sutton and Barto,
    "Reinforcement Learning", 2nd ed., 2018, section 2.6. Moves between running offers keep the pooled
    means."""
    return {o: max(m, prior_run_h) if losses.get(o, 0) == 0 else m for o, m in runs.items()}


def progress_price(offer: Offer, m: float, *, changeover_h: float, moves: Moves, checkpoint_zone: str | None,
                   price: float | None = None) -> float:
    """$ per hour of progress on ``offer`` with mean run ``m``, moving there from ``checkpoint_zone``: a run
    that first loses c = d + T makes E[(L - c)+] = m exp(-c/m) hours of progress for m hours paid
    (exponential runs), so the price is multiplied by exp(c/m), and the egress is spread over the progress.
    ``price``: its $/h now (default: its list price, ``offer.price``)."""
    lost = moves.launch_h(changeover_h, checkpoint_zone, offer.zone)
    if lost / m > 50:
        return float("inf")
    useful = m * math.exp(-lost / m)
    return (offer.price if price is None else price) * m / useful + moves.egress(checkpoint_zone, offer.zone) / useful


def learned_order(offers: tuple[Offer, ...], market: str, rng: random.Random, *, hours: Mapping[Offer, float],
                  losses: Mapping[Offer, int], changeover_h: float, moves: Moves, current: Offer | None = None,
                  preempted_zone: str | None = None, ceiling: float | None = None) -> list[Offer]:
    """:func:`search_order` with the spot offers ranked as ``default`` ranks them: by price per hour of
    progress (:func:`progress_price`) over the runs the job has had on each (``hours`` held, ``losses``),
    changeover, transfer and egress from the checkpoint's zone included; ties in shuffled zone order. The
    zone the job runs in still comes first and the one that just preempted last. With a ``ceiling`` ($ per
    hour of progress; :func:`spot_ceiling`), the spot offers at or above it are left out, as the multi-zone
    ``default`` never launches them (:meth:`ZoneDefault.ranked`). On-demand: as :func:`search_order`
    (the zone the job is in first)."""
    if market != SPOT:
        return search_order(offers, market, rng, current=current, preempted_zone=preempted_zone)
    mine = [o for o in offers if o.market == market]
    zones = sorted({o.zone for o in mine})
    rng.shuffle(zones)
    tie = {z: i for i, z in enumerate(zones)}
    here = current.zone if current is not None else None
    price = progress_prices(mine, hours=hours, losses=losses, changeover_h=changeover_h, moves=moves,
                            checkpoint_zone=here)
    stay = here if here != preempted_zone else None  # the zone it runs in, unless it just preempted

    def key(o: Offer) -> tuple:
        as_now = current is not None and o.zone == stay and o.shape == current.shape  # nothing changes
        return (o.zone == preempted_zone, o.zone != stay, not as_now, price[o], tie[o.zone])

    return sorted((o for o in mine if ceiling is None or price[o] < ceiling), key=key)


def progress_prices(offers: Iterable[Offer], *, hours: Mapping[Offer, float], losses: Mapping[Offer, int],
                    changeover_h: float, moves: Moves, checkpoint_zone: str | None) -> dict[Offer, float]:
    """Each offer's price per hour of progress (:func:`progress_price`) over the job's runs on it, as a search
    for capacity ranks them (:func:`probing_runs`), moving there from ``checkpoint_zone``."""
    mine = list(offers)
    runs = probing_runs(mean_runs({o: hours.get(o, 0.0) for o in mine}, {o: losses.get(o, 0) for o in mine}), losses)
    return {o: progress_price(o, runs[o], changeover_h=changeover_h, moves=moves, checkpoint_zone=checkpoint_zone)
            for o in mine}


def try_move(price_here: float, price_there: float, *, launch_h: float, held_h: float) -> bool:
    """Whether a job on a spot run at ``price_here`` $/h should try to move to an offer whose progress costs
    ``price_there`` $/h, having paid the difference for ``held_h`` hours (since its run began, or since its last
    try). The simulated ``default`` looks at the other offers for free and moves when one is up; a real job can
    look only by launching there, and a try that finds no capacity has replaced the running nodes for nothing:
    they are relaunched where they ran, ``launch_h`` billed at ``price_here``. So it tries once the extra it has
    paid by staying equals what a try that fails costs, the break-even rule of ski rental (Karlin, Manasse,
    Rudolph and Sleator, "Competitive snoopy caching", Algorithmica 3, 1988): the tries that fail never cost
    more than staying did meanwhile. A job on on-demand trying spot is the same case (``price_here`` the
    on-demand price: a switch replaces the on-demand nodes first)."""
    gain = price_here - price_there
    return gain > 0 and held_h * gain >= launch_h * price_here - EPS


def spot_ceiling(offers: Iterable[Offer]) -> float | None:
    """What an hour of progress on spot may cost at most: an hour on the cheapest on-demand offer (None
    without one). A spot offer whose runs are so short that, changeovers included, its progress costs more
    is not worth launching: the multi-zone ``default`` ranks only the offers below it. An on-demand price
    not known (0: a type the catalog does not price and the spec does not either) sets no ceiling."""
    prices = [o.price for o in offers if o.market == ON_DEMAND and o.price > 0]
    return min(prices) if prices else None


class OutageLog:
    """The outages of each spot offer, as far as the job has looked: the zone it runs in, its failed
    launches and its probes. An outage is counted only when it was watched without a gap (a look every
    tick from its first failed look to the look that found capacity); after a gap it starts again."""

    def __init__(self, offers: list[Offer]) -> None:
        self.ended: dict[Offer, list[float]] = {o: [] for o in offers}
        self.since: dict[Offer, float] = {}  # offers seen without capacity: since when (watched)
        self.looked: dict[Offer, float] = {}

    def seen(self, offer: Offer, up: bool, now_h: float, tick_h: float) -> None:
        watched = now_h - self.looked.get(offer, -math.inf) <= tick_h + EPS
        self.looked[offer] = now_h
        since = self.since.pop(offer, None)
        if up:
            if since is not None and watched:
                self.ended[offer].append(now_h - since)
        else:
            self.since[offer] = since if since is not None and watched else now_h

    def rest(self, offer: Offer, now_h: float, prior_h: float, weight: float) -> float:
        """E[rest of the offer's outage now] (:func:`censored_mean` with the age of the one going on);
        the mean when it is up."""
        age = now_h - self.since[offer] if offer in self.since else 0.0
        return censored_mean(self.ended[offer], prior_h, weight, age)

    def mean(self, offer: Offer, prior_h: float, weight: float) -> float:
        return censored_mean(self.ended[offer], prior_h, weight)


def zone_slack(obs: ZoneObservation, hours: float) -> float | None:
    if obs.deadline_h is None:
        return None
    return obs.deadline_h - obs.now_h - hours


class ZonePolicy(ABC):
    """What the replay (or the watcher) calls: ``decide`` once per tick, answering a plan."""

    name = "?"

    def __init__(self, offers: tuple[Offer, ...], moves: Moves, seed: int = 0) -> None:
        self.offers, self.moves = tuple(offers), moves
        self.rng = random.Random(seed)
        self.start_zone: str | None = None  # a zone whose capacity the policy knows before its first launch

    @abstractmethod
    def decide(self, obs: ZoneObservation, market: Market) -> list[Offer]:
        """The offers to try this tick, in order ([]: hold nothing)."""

    def spot_offers(self) -> list[Offer]:
        return [o for o in self.offers if o.spot]

    def __repr__(self) -> str:
        return f"<zone policy {self.name}>"


class NettedZonePolicy(ZonePolicy):
    """Thrift and the deadline safety net around ``_decide``.

    The net: when the time left, less what finishing on the cheapest on-demand offer needs from here
    (transfer included), is one tick or less, run on that offer (or stay on the on-demand offer
    already running)."""

    sticky_net = True

    def __init__(self, offers: tuple[Offer, ...], moves: Moves, seed: int = 0) -> None:
        super().__init__(offers, moves, seed)
        self.net_fired = False

    def decide(self, obs: ZoneObservation, market: Market) -> list[Offer]:
        self._observe(obs)
        if obs.remaining_h <= EPS:
            return []
        net_offer, hours = finishing_offer(obs, self.offers, self.moves)
        slack = zone_slack(obs, hours)
        if (self.sticky_net and self.net_fired) or (slack is not None and slack <= obs.tick_h + EPS):
            self.net_fired = True
            if obs.running is not None and obs.running.market == ON_DEMAND:
                return [obs.running]
            return [net_offer]
        return self._decide(obs, market)

    def _observe(self, obs: ZoneObservation) -> None:
        """Bookkeeping every tick (learning), net or not."""

    @abstractmethod
    def _decide(self, obs: ZoneObservation, market: Market) -> list[Offer]:
        """The plan when the safety net does not decide."""


class Pinned(ZonePolicy):
    """A single-zone policy in one zone: the first spot and the first on-demand offer of that zone.
    The one-zone policy keeps its own safety net (no move can be needed from its zone)."""

    def __init__(self, offers: tuple[Offer, ...], moves: Moves, zone: str, inner: Policy, seed: int = 0) -> None:
        super().__init__(offers, moves, seed)
        self.name, self.inner, self.start_zone = f"{inner.name}@{zone}", inner, zone
        mine = [o for o in offers if o.zone == zone]
        self.spot = next((o for o in mine if o.spot), None)
        on_demand = next((o for o in mine if o.market == ON_DEMAND), None)
        if on_demand is None:
            raise ValueError(f"zone {zone} has no on-demand offer")
        self.on_demand: Offer = on_demand

    def decide(self, obs: ZoneObservation, market: Market) -> list[Offer]:
        spot_ok = self.spot is not None and bool(obs.here.get(self.spot.shape.name))
        single = Observation(
            now_h=obs.now_h, progress_h=obs.progress_h, job_h=obs.job_h, deadline_h=obs.deadline_h,
            changeover_h=obs.changeover_h, market=obs.running.market if obs.running else None,
            spot_available=spot_ok, preempted=obs.preempted, tick_h=obs.tick_h,
            # this tick's prices, as the one-zone replay gives them (Offer.price is the trace's first)
            spot_price=market.price(self.spot) if self.spot else None, on_demand_price=market.price(self.on_demand))
        answer = self.inner.decide(single)
        if answer == SPOT and self.spot is not None:
            return [self.spot]
        if answer == ON_DEMAND:
            return [self.on_demand]
        return []


class Failover(NettedZonePolicy):
    """SkyPilot managed jobs' ``EAGER_NEXT_REGION`` (sky/jobs/recovery_strategy.py): stay on a spot
    cluster until it is preempted; then relaunch, trying the zones in shuffled order (the Spell seed's
    "shuffle the zones and try each in turn") with the zone that just preempted tried last, every
    tick until a launch succeeds (SkyPilot retries with a back-off capped at 5 minutes, under one
    tick). On-demand comes only from the deadline safety net."""

    name = "failover"

    def __init__(self, offers: tuple[Offer, ...], moves: Moves, seed: int = 0) -> None:
        super().__init__(offers, moves, seed)
        self.last_preempted: str | None = None

    def _observe(self, obs: ZoneObservation) -> None:
        if obs.preempted:
            self.last_preempted = obs.zone
        elif obs.running is not None:
            self.last_preempted = None

    def _decide(self, obs: ZoneObservation, market: Market) -> list[Offer]:
        if obs.running is not None and obs.running.spot:
            return [obs.running]
        return search_order(self.offers, SPOT, self.rng, preempted_zone=self.last_preempted)


class ZoneDefault(NettedZonePolicy):
    """kit's multi-zone policy: the single-zone ``default`` decides *whether* to run spot, on-demand or
    wait, on the market "the best spot offer we can get now"; a learned ranking decides *where*.

    * Ranking: each spot offer's price per hour of progress, price x E[L] / E[(L - d - T)+] plus
      its egress spread over E[(L - d - T)+], over the lengths L of the runs the job has had on that
      offer (launch to loss; a run still going counts with its age) and one prior run of
      ``prior_run_h``: a zone is assumed good until it has shown otherwise, and a zone whose runs are
      too short to pay their changeover and transfer falls behind on-demand and is no longer tried.
    * Knowing: on spot, the zone it runs in; otherwise it probes the ranked offers in order and stops
      at the first that has capacity (failed probes are free; at most one is billed per tick), so it
      learns where spot is without paying to look at every zone.
    * Staying: an offer is not launched for a stay that the return of a cheaper one found down would cut
      so short that its progress costs as much as on-demand (:meth:`stay_h`).
    * Waiting for the best zone (:meth:`worth_now`): with the job off spot and the best offer it has
      run on in an outage, a dearer offer is launched only if its extra price per hour of progress is
      paid for by the slack its progress saves; with slack to spare and the best zone able to finish
      the job in time, the job waits for that zone instead of filling each of its outages with a
      shorter, dearer run elsewhere (the one-zone ``up`` in the best zone in hindsight does the
      same, and beat the earlier ``default`` on many synthetic markets). The outages of each offer are
      learned from what the job sees of it (:class:`OutageLog`); every estimate in this choice is
      taken one standard error on the cautious side.
    * Deciding: the single-zone ``default`` (learned price of slack, optimal-stopping launch rule)
      sees spot as available when a ranked offer was found; its spot runs are the job's runs wherever
      they were. The deadline net includes the transfer to the on-demand zone.
    * Pacing (:data:`PACE`): idle in an outage, the job runs on-demand instead of waiting once its slack
      is below ``pace`` x what Uniform Progress would keep, so a zone that comes up late with long runs
      still finds slack to use.
    """

    name = "default"
    sticky_net = False

    def __init__(self, offers: tuple[Offer, ...], moves: Moves, seed: int = 0, prior_run_h: float = DEFAULT_PRIOR_RUN_H,
                 prior_weight: float = 1.0, move_margin: float = MOVE_MARGIN, pace: float = PACE) -> None:
        super().__init__(offers, moves, seed)
        self.move_margin = move_margin
        self.inner = moving_market_policy(prior_spot_run_h=prior_run_h, prior_weight=prior_weight, pace=pace)
        self.prior_run_h, self.w = prior_run_h, prior_weight
        self.record = RunRecord(self.spot_offers())
        self.hours, self.losses = self.record.hours, self.record.losses  # the latest runs on each spot offer
        self.launched_at: float | None = None
        self.held: Offer | None = None
        self.asked: tuple[Offer, ...] = ()  # spot offers the last plan would launch, in order
        self.outages = OutageLog(self.spot_offers())
        self.prices: dict[Offer, float] = {}  # each spot offer's $/h this tick (Market.price), set as it decides
        order = sorted({o.zone for o in self.spot_offers()})
        self.rng.shuffle(order)  # ties between equally ranked zones: shuffled, as failover
        self.tie = {z: i for i, z in enumerate(order)}

    def _observe(self, obs: ZoneObservation) -> None:
        # the spot offer the last plan launched, if any: the first one it asked for that had capacity
        launched = next((o for o in self.asked if o not in obs.failed), None)
        self.asked = ()
        for offer in obs.failed:
            self.outages.seen(offer, False, obs.now_h, obs.tick_h)
        if self.held is not None and obs.running != self.held:  # the spot run ended: lost or left
            assert self.launched_at is not None
            lost = obs.preempted and launched is None
            if lost:
                self.outages.seen(self.held, False, obs.now_h, obs.tick_h)
            self._ended(self.held, obs.now_h - self.launched_at, lost=lost)
            self.held = None
        if obs.running is not None and obs.running.spot:
            self.outages.seen(obs.running, True, obs.now_h, obs.tick_h)
        if launched is not None and obs.preempted and obs.running != launched:
            # launched in the last tick and lost at once: a run too (else a zone whose runs end within
            # a tick would never be learned about, and be tried again and again)
            self._ended(launched, obs.tick_h, lost=True)
        if obs.running is not None and obs.running.spot and self.held is None:
            self.held, self.launched_at = obs.running, obs.now_h - obs.tick_h  # launched in the last tick

    def _ended(self, offer: Offer, hours: float, *, lost: bool) -> None:
        self.record.add(offer, hours, lost=lost)

    def mean_runs(self, now_h: float, pool_weight: float = POOL_WEIGHT) -> dict[Offer, float]:
        """Mean spot run on each spot offer (:func:`mean_runs`), the run going on now with its age."""
        age = now_h - self.launched_at if self.held is not None and self.launched_at is not None else 0.0
        return mean_runs(self.hours, self.losses, prior_run_h=self.prior_run_h, weight=self.w, held=self.held, age=age,
                         pool_weight=pool_weight)

    def price(self, offer: Offer) -> float:
        """``offer``'s $/h this tick: spot prices move (the clouds publish them; the AWS traces' change every
        tick), and a ranking by the list price would prefer a zone whose price has since risen."""
        return self.prices.get(offer, offer.price)

    def rate(self, offer: Offer, obs: ZoneObservation, m: float) -> float:
        """$ per hour of progress on ``offer`` (:func:`progress_price`) from the checkpoint's zone, at this
        tick's price."""
        return progress_price(offer, m, changeover_h=obs.changeover_h, moves=self.moves,
                              checkpoint_zone=obs.checkpoint_zone, price=self.price(offer))

    def ranked(self, obs: ZoneObservation, ceiling: float, *, probing: bool = False) -> list[Offer]:
        """Spot offers cheaper per hour of progress than ``ceiling``, best first; for ``probing`` (where
        to look for capacity), with the mean runs of :func:`probing_runs`."""
        runs = self.mean_runs(obs.now_h)
        if probing:
            runs = probing_runs(runs, self.losses, prior_run_h=self.prior_run_h)
        rated = [(self.rate(o, obs, m), self.tie[o.zone], o) for o, m in runs.items()]
        return [o for r, _, o in sorted(rated, key=lambda x: x[:2]) if r < ceiling]

    def _find(self, obs: ZoneObservation, market: Market, ranked: list[Offer], ceiling: float) -> Offer | None:
        """The first of ``ranked`` that has spot capacity (looked at in the zone the job is in, probed elsewhere),
        leaving out an offer whose stay the return of a cheaper one found down would cut so short
        (:meth:`stay_h`) that its progress costs ``ceiling`` or more (on-demand's price)."""
        down: list[Offer] = []
        runs = self.mean_runs(obs.now_h)
        for offer in ranked:
            stay = self.stay_h(obs, offer, runs, down)
            if stay < runs[offer] and self.rate(offer, obs, stay) >= ceiling:
                continue
            if offer.zone == obs.zone and offer.shape.name in obs.here:
                up = bool(obs.here[offer.shape.name])
            else:
                up = market.probe(offer)
            self.outages.seen(offer, up, obs.now_h, obs.tick_h)
            if up:
                return offer
            down.append(offer)
        return None

    def stay_h(self, obs: ZoneObservation, offer: Offer, runs: Mapping[Offer, float], down: list[Offer]) -> float:
        """How long the job would hold ``offer`` launched now: until its run ends or, if sooner, until one of
        ``down`` (offers found without capacity) that it would move to from there comes back: one that ranks
        cheaper per hour of progress than ``offer``'s bare price by the move margin (the rule on spot, with the
        prices of :meth:`ranked`, from where the checkpoint is now). ``runs``: each offer's mean run from the
        job's record (:meth:`mean_runs`), not the optimistic one a search ranks with, which decides where to
        look, not how long the job stays. The rest of each outage (:class:`OutageLog`) is taken one
        confidence width long, the side that argues for launching. Exponential run and outages: the first
        of them ends at the sum of their rates. A pricey zone launched while a cheap one flickers is left
        in the next tick, so its launch buys a changeover and the transfers there and back for no progress:
        at N = 16 on the bundled GCP traces the job paid asia-south2-b's spot price (0.85 x on-demand) for
        one-tick gaps of us-central1-a."""
        back = 0.0  # the rate at which one of them comes back
        for other in down:
            if self.rate(other, obs, runs[other]) < move_ceiling(self.price(offer), self.move_margin):
                longer = 1 + self._error(len(self.outages.ended[other]))
                back += 1 / max(EPS, longer * self.outages.rest(other, obs.now_h, self.inner.prior_down, self.w))
        return runs[offer] if back == 0 else 1 / (1 / runs[offer] + back)

    def _error(self, n: float) -> float:
        """One confidence width (CONFIDENCE_SE standard errors) of a mean over ``n`` exponential lengths
        and the prior's weight: the standard error of such a mean is the mean / sqrt(n)."""
        return CONFIDENCE_SE / math.sqrt(n + self.w)

    def run_bounds(self, offer: Offer, m: float) -> tuple[float, float]:
        """The mean run ``m`` on ``offer`` one confidence width short (kept above 0) and one long."""
        error = self._error(self.losses[offer])
        return max(EPS, m * (1 - error)), m * (1 + error)

    def waiting_fits(self, obs: ZoneObservation, pool: list[Offer], runs: Mapping[Offer, float]) -> bool:
        """Would the job finish by the deadline running only on the offers of ``pool``: waiting out the rest
        of the outage now (until the first of them is back) and each later one, then a run on the one that
        came back? Each offer's mean run (``runs``) and outages as the job has seen them, each taken one
        confidence width on the cautious side. Outages of different offers are taken as independent
        exponentials, so the first of them ends at the sum of their rates, and it is offer i's with
        probability a_i / sum(a) (a_i: 1 / its mean outage). A changeover (and the transfer there) per run;
        exponential runs: E[(L - c)+] = m exp(-c/m). With one offer: its own outages and runs."""
        if obs.deadline_h is None:
            return True
        prior, back, rate, held, useful = self.inner.prior_down, 0.0, 0.0, 0.0, 0.0
        for offer in pool:
            longer = 1 + self._error(len(self.outages.ended[offer]))
            a = 1 / max(EPS, longer * self.outages.mean(offer, prior, self.w))
            back += 1 / max(EPS, longer * self.outages.rest(offer, obs.now_h, prior, self.w))
            m = self.run_bounds(offer, runs[offer])[0]
            c = self.moves.launch_h(obs.changeover_h, obs.checkpoint_zone, offer.zone)
            rate, held, useful = rate + a, held + a * m, useful + a * m * math.exp(-c / m)
        cycles = (obs.deadline_h - obs.now_h - 1 / back) / ((1 + held) / rate)  # a cycle: an outage, a run
        return cycles * useful / rate >= obs.remaining_h

    def worth_now(self, obs: ZoneObservation, single: Observation, ranked: list[Offer]) -> list[Offer]:
        """The ranked offers worth launching now rather than waiting for a better one.

        Running a dearer offer B now instead of waiting for the best offer A the job has run on makes
        progress that would otherwise be bought on A later, at (rate B - rate A) more per hour of it, and
        saves as many hours of slack. So B is worth it when its extra price per hour of progress is below the
        value of an hour of slack, lambda (the inner policy's, in A's price). When the slack is abundant for
        the job, the wait is bounded by a reservation rate as well: the best offers the job has run on, as
        few as will finish the job in time waiting only for them (:meth:`waiting_fits`), are worth it, and
        a dearer one is not. So lambda counts as 0 when A alone would finish in time, and a pricey offer is
        not run just because A alone would not, while a few good zones together would. Being wrong about
        the better offers is what makes waiting costly, so their rates are taken one confidence width high
        (mean runs low) and B's low (UCB): an offer seen to lose once or twice is not ruled out, and a zone
        looks better than another only once the difference is larger than the noise."""
        known = [o for o in ranked if self.hours[o] > 0]
        if not known:
            return ranked
        # The pool keeps the prior's weight here (not POOL_WEIGHT): the job sees a zone it joins when another
        # goes down late in that zone's runs, and with the smaller weight two zones that together would
        # finish the job looked too short to wait for (the few-good-zones test in tests/unit/kit/simulate/
        # test_zones.py: a pricey zone run in their outages again, 0.58 of on-demand vs 0.50)
        runs = self.mean_runs(obs.now_h, pool_weight=self.w)
        high = {o: self.rate(o, obs, self.run_bounds(o, runs[o])[0]) for o in known}
        lam, abundant = self.inner.slack_value(replace(single, spot_price=self.price(known[0])))
        ceiling = high[known[0]] + lam * self.price(known[0])
        if abundant:
            fits = next((k for k in range(1, len(known) + 1) if self.waiting_fits(obs, known[:k], runs)), None)
            if fits is not None:
                ceiling = min(ceiling, max(high[o] for o in known[:fits]))
        return [o for o in ranked if self.rate(o, obs, self.run_bounds(o, runs[o])[1]) <= ceiling + EPS]

    def _decide(self, obs: ZoneObservation, market: Market) -> list[Offer]:
        self.prices = {o: market.price(o) for o in self.spot_offers()}
        od, hours = finishing_offer(obs, self.offers, self.moves)
        single = Observation(
            now_h=obs.now_h, progress_h=obs.progress_h, job_h=obs.job_h, deadline_h=obs.deadline_h,
            changeover_h=obs.changeover_h, market=obs.running.market if obs.running else None,
            spot_available=False, preempted=obs.preempted, tick_h=obs.tick_h, on_demand_price=od.price)
        if obs.running is not None and obs.running.spot:
            # The inner policy sees the tick on spot (as the watcher's sees every tick): its wait in an
            # outage counts from the last time the job held something, not from its first idle tick.
            self.inner.observe(replace(single, spot_available=True, spot_price=self.price(obs.running)))
            # Stay, unless an offer is cheaper per hour of progress (its changeover, transfer and
            # short runs included) than this one's bare price: try those first (a failed try is free).
            # No move whose changeover and transfer would end at the safety net.
            slack = zone_slack(obs, hours)
            better = [o for o in self.ranked(obs, move_ceiling(self.price(obs.running), self.move_margin)) if o != obs.running
                      and launch_can_progress(slack, self.moves.launch_h(obs.changeover_h, obs.checkpoint_zone, o.zone),
                                              obs.tick_h)]
            self.asked = tuple(better)
            return [*better, obs.running]
        best = self._find(obs, market, self.worth_now(obs, single, self.ranked(obs, od.price, probing=True)),
                          od.price)
        single = replace(single, spot_available=best is not None, spot_price=self.price(best) if best else None)
        if obs.preempted:  # the job's spot run ended here, even if another zone has spot right now
            self.inner.observe(replace(single, spot_available=False))
        answer = self.inner.decide(single)
        if answer == SPOT and best is not None:
            self.asked = (best,)
            return [best]
        if answer == ON_DEMAND:
            return [obs.running] if obs.running is not None and obs.running.market == ON_DEMAND else [od]
        assert answer in (WAIT, SPOT, ON_DEMAND)
        return []


_ZONE_POLICIES: dict[str, type[NettedZonePolicy]] = {"failover": Failover, "default": ZoneDefault}


def make_zone_policy(name: str, offers: tuple[Offer, ...], moves: Moves, seed: int = 0, **params) -> ZonePolicy:
    """A fresh multi-zone policy by name (``ZONE_POLICY_NAMES``)."""
    return _ZONE_POLICIES[name](offers, moves, seed=seed, **params)


__all__ = ["MARKET_WINDOW", "PACE", "POOL_WEIGHT", "RUN_WINDOW", "ZONE_POLICY_NAMES", "Failover", "Market", "NettedZonePolicy", "Pinned", "RunRecord", "ZoneDefault", "ZoneObservation", "ZonePolicy",
           "finishing_offer", "learned_order", "make_zone_policy", "mean_runs", "move_ceiling", "moving_market_policy", "probing_runs", "progress_price",
           "search_order", "spot_ceiling"]

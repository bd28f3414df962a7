"""Spot vs on-demand in one zone: the single-market policies, shared by the watcher (``kit watch``) and the simulator.

A policy is stateful and called once per tick, in order, with an :class:`Observation`; it answers
``"spot"``, ``"on-demand"`` or ``"wait"`` (hold nothing). Every policy keeps the deadline **safety
net** when a deadline is given: when the time left is no more than what finishing on on-demand
needs (remaining compute + one changeover) plus one tick, it runs on on-demand (waiting one more
tick could make the deadline unreachable). Policies (docs/policies.md):

* ``on-demand``: always on-demand.
* ``spot``: always spot, wait while none is available (+ safety net).
* ``threshold``: spot until K preemptions within W hours, then on-demand for a cooldown H, then
  spot again; each further trip doubles the cooldown, so it never flaps forever.
* ``up``: Uniform Progress (Wu et al., "Can't Be Late", NSDI'24) with its hysteresis.
* ``greedy``: spot whenever available, otherwise wait, on-demand only from the safety net on.
* ``default``: spot-first with a learned price for slack: Greedy where on-demand excursions cannot
  pay, on-demand through long outages when the slack is scarce (see :class:`DefaultPolicy`).
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass

from kit.errors import InputError
from training.contract import ON_DEMAND, SPOT

WAIT = "wait"  # the third answer: run nothing now (SPOT and ON_DEMAND are the markets)
DEFAULT_CHANGEOVER_H = 0.2  # d: billed hours per launch without progress, unless the spec says
POLICY_NAMES = ("on-demand", "spot", "threshold", "up", "greedy", "default")
EPS = 1e-9


@dataclass(frozen=True)
class Observation:
    """What a policy sees at the start of a tick (all times in hours)."""

    now_h: float  # time since the job started
    progress_h: float  # compute done so far
    job_h: float  # total compute of the job (C0)
    deadline_h: float | None  # R0, measured from the job's start; None = no deadline
    changeover_h: float  # d: a launch spends this long billed without progress
    market: str | None  # what is running now (None: nothing, or the gang is broken)
    spot_available: bool  # can a spot gang be had this tick
    preempted: bool  # a node was lost (or a spot launch failed for capacity) since the last tick
    tick_h: float  # length of one tick
    # $/h of the spot and on-demand capacity (any unit, the same for both); None = unknown. Only
    # their ratio is used (by ``default``); a policy falls back to its own assumption without them.
    spot_price: float | None = None
    on_demand_price: float | None = None

    @property
    def remaining_h(self) -> float:
        return max(0.0, self.job_h - self.progress_h)

    def slack_h(self) -> float | None:
        """Time left minus what finishing on on-demand from now needs (compute + one changeover)."""
        if self.deadline_h is None:
            return None
        return (self.deadline_h - self.now_h) - (self.remaining_h + self.changeover_h)


def safety_net(obs: Observation) -> bool:
    """True when the job must be on on-demand now to be sure of meeting the deadline.

    Waiting one more tick on anything else may make no progress, so the net fires as soon as the
    slack left for that (time left - remaining compute - changeover) is at most one tick.
    """
    slack = obs.slack_h()
    return slack is not None and slack <= obs.tick_h + EPS


def launch_can_progress(slack_h: float | None, changeover_h: float, tick_h: float) -> bool:
    """Whether a launch now could make progress before the safety net fires. Its changeover spends d of
    the slack; with at most one tick left after it, the net moves the job to on-demand as soon as the
    changeover ends, so the launch would only pay for its changeover (and an on-demand job loses nothing
    by waiting for the net instead: it pays the same changeover and compute then)."""
    return slack_h is None or slack_h - changeover_h > tick_h + EPS


class Policy(ABC):
    """Base class: subclasses implement ``_decide``; the safety net is applied around it."""

    name = "?"
    sticky_net = True  # once the net fired, stay on on-demand until the end (Can't Be Late)

    def __init__(self) -> None:
        self.net_fired = False

    def decide(self, obs: Observation) -> str:
        self._observe(obs)
        if obs.remaining_h <= EPS:
            return WAIT  # thrifty: nothing left to run
        if (self.sticky_net and self.net_fired) or safety_net(obs):
            self.net_fired = True
            return ON_DEMAND
        return self._decide(obs)

    def snapshot(self) -> dict:
        """A copy of everything the policy has learned, for :meth:`restore`: a caller that asked on a guess
        (the watcher asks with spot available before its capacity search has run) takes the answer back
        and asks again on what it found, as if the first question had not been put."""
        return copy.deepcopy(self.__dict__)

    def restore(self, state: dict) -> None:
        """Back to a :meth:`snapshot` (a copy of it: one snapshot may be restored more than once)."""
        self.__dict__.clear()
        self.__dict__.update(copy.deepcopy(state))

    def _observe(self, obs: Observation) -> None:
        """Bookkeeping every tick, net or not. Stateless policies have none; threshold and default
        override it to count preemptions / learn spot run lengths."""

    @abstractmethod
    def _decide(self, obs: Observation) -> str:
        """The policy's own answer when the safety net does not decide: spot, on-demand or wait."""

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


class OnDemandPolicy(Policy):
    name = "on-demand"

    def _decide(self, obs: Observation) -> str:
        return ON_DEMAND


class SpotPolicy(Policy):
    """Always spot; wait while none can be had (with a deadline: the safety net, like greedy)."""

    name = "spot"

    def _decide(self, obs: Observation) -> str:
        return SPOT if obs.spot_available else WAIT


class GreedyPolicy(SpotPolicy):
    """Can't Be Late's Greedy: Exploitation (stay on spot) + Safety Net (sticky) + Thrifty. The
    net and thrift are in ``Policy.decide`` for every policy, so its decisions are ``spot``'s; the
    name stays because the paper's results (and the benchmarks here) are reported under it."""

    name = "greedy"


class ThresholdPolicy(Policy):
    """After ``k`` preemptions within ``window_hours`` move to on-demand for ``cooldown_hours``.

    Only preemptions inside the sliding window count. After a cooldown the history is cleared
    and spot is tried again; every further trip to on-demand doubles the cooldown, so a job on a
    bad market spends ever longer stretches on on-demand instead of flapping forever.
    """

    name = "threshold"

    def __init__(self, k: int = 3, window_hours: float = 6.0, cooldown_hours: float = 6.0) -> None:
        super().__init__()
        if int(k) < 1 or window_hours <= 0 or cooldown_hours < 0:
            raise InputError(f"threshold needs k >= 1, window_hours > 0, cooldown_hours >= 0 "
                             f"(got k={k}, window_hours={window_hours}, cooldown_hours={cooldown_hours})",
                             where="policy.threshold")
        self.k, self.window_h, self.cooldown_h = int(k), float(window_hours), float(cooldown_hours)
        self.preemptions: deque[float] = deque()
        self.on_demand_until: float | None = None
        self.trips = 0

    def _observe(self, obs: Observation) -> None:
        if self.on_demand_until is not None and obs.now_h >= self.on_demand_until - EPS:
            self.on_demand_until = None  # cooldown over: back to spot with a clean history
            self.preemptions.clear()
        if obs.preempted and self.on_demand_until is None:
            self.preemptions.append(obs.now_h)
        while self.preemptions and self.preemptions[0] <= obs.now_h - self.window_h + EPS:
            self.preemptions.popleft()
        if self.on_demand_until is None and len(self.preemptions) >= self.k:
            self.on_demand_until = obs.now_h + self.cooldown_h * (2 ** self.trips)
            self.trips += 1
            self.preemptions.clear()

    def _decide(self, obs: Observation) -> str:
        if self.on_demand_until is not None:
            return ON_DEMAND
        return SPOT if obs.spot_available else WAIT


class UniformProgressPolicy(Policy):
    """Uniform Progress (Can't Be Late, NSDI'24).

    Expected progress ep(t) = t * C0 / R0. Whenever spot is available take it (even when behind),
    except that once on on-demand it stays there until spot is available and cp(t) >= ep(t + 2d)
    (hysteresis; it never releases on-demand to go idle, as in the reference implementation
    ``sky_spot/strategies/*rc_cr_threshold.py``); when idle and behind (cp < ep(t)) go
    on-demand; otherwise wait. Without a deadline there is no schedule to keep: it behaves like
    ``spot``.
    """

    name = "up"

    def _expected(self, obs: Observation, t: float) -> float:
        return obs.job_h * min(1.0, t / obs.deadline_h) if obs.deadline_h else 0.0

    def _decide(self, obs: Observation) -> str:
        if obs.deadline_h is None or obs.deadline_h <= 0:
            return SPOT if obs.spot_available else WAIT
        cp = obs.progress_h
        if obs.market == ON_DEMAND and (not obs.spot_available
                                        or cp < self._expected(obs, obs.now_h + 2 * obs.changeover_h) - EPS):
            return ON_DEMAND
        if obs.spot_available:
            return SPOT
        if cp < self._expected(obs, obs.now_h) - EPS:
            return ON_DEMAND
        return WAIT


def uniform_slack(obs: Observation) -> float | None:
    """The slack a job on Uniform Progress's schedule (progress C0 t / R0, t from the job's start) has at
    ``obs.now_h``: the starting slack R0 - C0 - d shrunk in proportion to the time left, (R0 - C0 - d)
    (R0 - t) / R0. None without a deadline."""
    if not obs.deadline_h or obs.deadline_h <= 0:
        return None
    start = obs.deadline_h - obs.job_h - obs.changeover_h
    return max(0.0, start) * max(0.0, obs.deadline_h - obs.now_h) / obs.deadline_h


def censored_mean(lengths: list[float], prior_h: float, weight: float, age: float = 0.0) -> float:
    """Mean length (of outages, here) with a prior of ``prior_h`` at ``weight``; with ``age``, the mean
    rest of one going on for that long (the maximum-likelihood mean of an exponential from the ended
    lengths and the censored one: all time over the ended ones)."""
    return (sum(lengths) + age + weight * prior_h) / (len(lengths) + weight)


def _since(start: float | None, now_h: float) -> float:
    """Hours from ``start`` to ``now_h``; zero for a period that has not begun."""
    return 0.0 if start is None else now_h - start


class DefaultPolicy(Policy):
    """Spot-first with an explicit price for slack, learned from the market the job is seeing.

    Every decision compares money with *slack* (time left minus what finishing on on-demand needs).
    Waiting spends slack for free; on-demand spends money and keeps slack; a spot run buys progress
    cheaply but every launch costs a changeover d. The policy learns, while the job runs, the
    lengths of the spot runs (periods with a spot gang) and of the outages between them, starting
    from one pseudo-cycle (``prior_spot_run_h`` = 4 h of spot, ``prior_outage_h`` = 15 min of outage,
    weight ``prior_weight``: "assume a good market until shown otherwise"), and from them:

    * k = on-demand / spot price, from the observation's prices when it has them (the simulator
      passes the trace's, the watcher the spec's), else ``price_ratio``;
    * the value of an hour of slack, lambda = r (k - c) / (1 - r), r = spot progress per hour of
      market time, c = spot hours paid per hour of spot progress (changeovers and runs shorter than
      d included). It is what one more hour of slack saves when the job would otherwise end with an
      on-demand block: that hour lets it wait for spot r / (1 - r) hours longer at k - c saved per
      hour of progress (Can't Be Late's Greedy tail). It is 0 when spot cannot even pay for its
      changeovers (c >= k) and when the slack is abundant (below);
    * a slack budget: waiting up to ``a`` hours in each outage and taking every spot run uses, per
      market cycle, E[min(outage, a)] + E[min(run, d)] + d P(outage > a) hours of slack. If even
      waiting out every outage fits in the slack left over the cycles until the deadline, the slack
      is abundant: lambda = 0 and the policy is Greedy (wait, never on-demand before the net).

    Decisions (the safety net, slack <= one tick, always wins, every tick):

    * no spot launch once the slack left after its changeover would be one tick or less: the net would
      send the job to on-demand as soon as the changeover ends (``launch_can_progress``);
    * on spot: stay (a changeover is already paid);
    * idle, spot available: take it if a run is worth its changeover, E[(k + lambda)(L - d)+ - L] > 0
      over the learned lengths L of runs at least as old as the current one (Can't Be Late's
      break-even kd/(k - 1) for lambda = 0, generalised to a distribution), unless deciding later is
      worth more: waiting s and launching if the run still goes on, for s in whole ticks up to two
      changeovers (optimal stopping over a horizon that is a time, so the rule does not change with
      the tick; where many runs are short, a run must first prove itself, over the round trip of a
      launch to spot and one back);
    * on on-demand, spot available: switch if E[k(L - d)+ - L] > lambda d + min(kd, lambda E[outage])
      (the slack of a spot changeover now, and at the next outage either a new on-demand launch or a
      wait: the paper's 2kd/(k - 1) when slack is dear, kd/(k - 1) when it is free), with the same
      lookahead;
    * idle in an outage (or with spot not worth taking): go on-demand only when the budget cannot
      afford waiting this long in every remaining outage *and* the on-demand excursion pays for its
      changeover, lambda E[(rest of outage - d)+] > kd. The rest of the outage is the mean residual
      of the learned outages longer than its age; beyond them it is a censored-exponential estimate
      (all outage time, including this one's age, over the outages seen), so a long outage is
      expected to go on;
    * on on-demand in an outage: stay (it never releases on-demand to go idle, like ``up``);
    * with ``pace`` > 0 (the multi-zone policy's inner one, not the one-zone ``default``): idle in an
      outage, it runs on-demand instead of waiting once the slack is below ``pace`` x the slack Uniform
      Progress would keep now (``uniform_slack``), so waiting out outages never spends the slack much
      faster than ``up`` would (a wait for a run to prove itself is not an outage, and stays a wait);
    * with ``window`` (the multi-zone policy's inner one): everything above is learned from the latest
      ``window`` runs and outages only, as the market the job sees changes with its zones;
    * with ``budget_se`` > 0 (the multi-zone policy's inner one): the slack budget's forecast (the slack
      waiting would use until the deadline, in the abundance test and in the test that sends the job to
      on-demand in an outage) is taken ``budget_se`` standard errors low, :meth:`_budget`.

    So the policy is Greedy on markets where on-demand excursions cannot pay (short outages,
    spot worth little, slack to spare) and moves to on-demand during long outages, one outage at
    a time, when the slack is scarce. Without a deadline it is ``spot``.

    It replaces a Uniform Progress variant (schedule stretched into the slack, a run-length gate only
    on leaving on-demand, k fixed at 4) that beat ``greedy`` and ``up`` on the GCP traces but not on
    synthetic markets with short spot runs, where its schedule paid a changeover for every short
    outage. The three prior constants were chosen on 7 of the 13 GCP zones and on synthetic markets
    with other seeds than the ones reported; docs/benchmarks.md ("Policies") has the held-out results.
    """

    name = "default"
    sticky_net = False
    LAMBDA_CAP = 100.0

    def __init__(self, price_ratio: float = 4.0, prior_spot_run_h: float = 4.0, prior_outage_h: float = 0.25,
                 prior_weight: float = 1.0, lookahead_changeovers: float = 2.0, pace: float = 0.0,
                 window: int | None = None, budget_se: float = 0.0) -> None:
        super().__init__()
        if not (price_ratio > 1 and min(prior_spot_run_h, prior_outage_h, prior_weight, lookahead_changeovers) > 0):
            raise InputError(f"default needs price_ratio > 1 and prior_spot_run_h, prior_outage_h, prior_weight, "
                             f"lookahead_changeovers > 0 (got {price_ratio}, {prior_spot_run_h}, {prior_outage_h}, "
                             f"{prior_weight}, {lookahead_changeovers})", where="policy")
        if window is not None and int(window) < 1:
            raise InputError(f"default needs window >= 1 (got {window})", where="policy",
                             fix="window is how many of the latest spot runs and outages the policy learns from")
        if not budget_se >= 0.0:
            raise InputError(f"default needs budget_se >= 0 (got {budget_se})", where="policy",
                             fix="budget_se is how many standard errors the slack budget's forecast is taken low")
        if not 0.0 <= pace <= 1.0:
            raise InputError(f"default needs 0 <= pace <= 1 (got {pace})", where="policy",
                             fix="pace is the share of Uniform Progress's slack that waiting may not go below")
        # The share of Uniform Progress's slack (``uniform_slack``) that waiting out outages may not spend:
        # below pace x that line the job runs on-demand instead of waiting. 0 (off) in one zone, where the
        # learned market is the market; the multi-zone policy sets it (kit/policy/zones.py, PACE).
        self.pace = float(pace)
        # How far ahead (in changeovers) a launch is compared with launching later. Two by default: a
        # short run taken from on-demand costs two launches (to spot, and back when it ends), so a run
        # must be able to prove itself over that round trip; ``_later`` picks the best wait within it.
        self.lookahead_d = float(lookahead_changeovers)
        self.k = float(price_ratio)
        self.prior_up = float(prior_spot_run_h)
        self.prior_down = float(prior_outage_h)
        self.w = float(prior_weight)
        # Only the latest ``window`` runs and outages are learned from (None: all of them). None in one zone; the
        # multi-zone policy's inner one sets it (kit/policy/zones.py, MARKET_WINDOW).
        self.window = None if window is None else int(window)
        # How many standard errors low the slack budget's forecast is taken (:meth:`_budget`). 0 in one zone;
        # the multi-zone policy's inner one sets it (kit/policy/zones.py, CONFIDENCE_SE).
        self.budget_se = float(budget_se)
        self.runs: list[float] = []  # lengths of completed spot runs (hours)
        self.outages: list[float] = []  # lengths of completed outages
        self.run_start: float | None = None
        self.outage_start: float | None = None
        self.idle_since: float | None = None

    # ------------------------------------------------------------------ learning
    def observe(self, obs: Observation) -> None:
        """Learn from ``obs`` without deciding: a multi-zone policy, whose market is "the best spot
        offer it can get now", reports the end of each of its spot runs this way."""
        self._observe(obs)

    def _observe(self, obs: Observation) -> None:
        if obs.spot_available:
            if self.outage_start is not None:
                self._learn(self.outages, obs.now_h - self.outage_start)
                self.outage_start = None
            if self.run_start is None:
                self.run_start = obs.now_h
        else:
            if self.run_start is not None:
                self._learn(self.runs, obs.now_h - self.run_start)
                self.run_start = None
            if self.outage_start is None:
                self.outage_start = obs.now_h
        if obs.market is None:
            if self.idle_since is None:
                self.idle_since = obs.now_h
        else:
            self.idle_since = None

    def _learn(self, lengths: list[float], length: float) -> None:
        """Add a completed run or outage to ``lengths``, keeping the latest ``window`` of them."""
        lengths.append(length)
        if self.window is not None:
            del lengths[:-self.window]

    def price_ratio(self, obs: Observation) -> float:
        """k = on-demand / spot price: from the observation when it has both prices."""
        if obs.spot_price and obs.on_demand_price and obs.spot_price > 0:
            return max(1.0 + 1e-6, obs.on_demand_price / obs.spot_price)
        return self.k

    def _run_mean(self, age: float, value, shift: float = 0.0) -> float:
        """E[value(rest)] over the spot runs that outlast ``age`` (+ the prior run); with ``shift``,
        the rest after ``shift`` more hours, counting runs that end before then as 0."""
        num, den = 0.0, self.w
        if self.prior_up > shift + EPS:
            num += self.w * value(self.prior_up - shift)
        for r in self.runs:
            if r > age + EPS:
                den += 1
                if r > age + shift + EPS:
                    num += value(r - age - shift)
        return num / den

    def _later(self, age: float, value, tick: float, d: float) -> float:
        """The best value of deciding later instead: waiting s hours, then launching if the run still
        goes on, for every s in whole ticks up to ``lookahead_d`` changeovers (at least one tick).
        The horizon is a time, not a number of ticks, so the rule does not change with the tick."""
        horizon = max(tick, self.lookahead_d * d)
        steps = max(1, math.floor(horizon / tick + 1e-9))
        return max(self._run_mean(age, value, shift=j * tick) for j in range(1, steps + 1))

    def _rest_of_outage(self, age: float, d: float) -> float:
        """E[(rest of the current outage - d)+] given its age (censored-exponential beyond the data)."""
        tail = censored_mean(self.outages, self.prior_down, self.w, age)
        num, den = self.w * max(0.0, tail - d), self.w
        for x in self.outages:
            if x > age + EPS:
                num += max(0.0, x - age - d)
                den += 1
        return num / den

    def market_stats(self, obs: Observation, k: float) -> dict:
        """Learned market: spot progress rate r, cost c, slack value lambda, mean run / outage."""
        d, w = obs.changeover_h, self.w
        runs = self.runs + ([obs.now_h - self.run_start] if self.run_start is not None else [])
        outages = self.outages + ([obs.now_h - self.outage_start] if self.outage_start is not None else [])
        held = sum(runs) + w * self.prior_up
        progress = sum(max(0.0, r - d) for r in runs) + w * max(0.0, self.prior_up - d)
        time = sum(runs) + sum(outages) + w * (self.prior_up + self.prior_down)
        rate = min(progress / time, 1 - 1e-6) if time > 0 else 0.0
        cost = held / progress if progress > EPS else math.inf
        lam = 0.0 if cost >= k else min(self.LAMBDA_CAP, rate * (k - cost) / (1 - rate))
        n_up = len(self.runs) + w
        return {
            "rate": rate, "cost": cost, "lambda": lam,
            "run_h": (sum(self.runs) + w * self.prior_up) / n_up,
            "outage_h": censored_mean(self.outages, self.prior_down, w),
            "run_waste_h": (sum(min(r, d) for r in self.runs) + w * min(self.prior_up, d)) / n_up,
        }

    # ------------------------------------------------------------------ deciding
    @staticmethod
    def _cycles(obs: Observation, m: dict) -> float:
        """Market cycles (a spot run and an outage) left until the deadline."""
        assert obs.deadline_h is not None
        return max(0.0, obs.deadline_h - obs.now_h) / max(m["run_h"] + m["outage_h"], EPS)

    def _budget(self, obs: Observation, m: dict, wait_h: float) -> float:
        """The slack the job would use until the deadline waiting up to ``wait_h`` in each outage, then running
        on-demand: per market cycle left, the runs' waste and the mean over the n learned outages (and the
        prior's, at its weight) of min(outage, wait) + d [outage > wait]; taken ``budget_se`` standard errors
        low, the standard error of that mean being their spread / sqrt(n) (none when the outages and the
        prior's are all alike). Low, because the forecast decides between waiting, which the deadline net
        can still undo, and paying for on-demand now, which nothing undoes (the confidence bound on the side
        of the reversible choice, as the multi-zone search takes its estimates: kit/policy/zones.py,
        CONFIDENCE_SE)."""
        d, cycles = obs.changeover_h, self._cycles(obs, m)
        used = [min(x, wait_h) + (d if x > wait_h + EPS else 0.0) for x in (*self.outages, self.prior_down)]
        weights = [1.0] * len(self.outages) + [self.w]
        n = sum(weights)
        mean = sum(w * u for w, u in zip(weights, used)) / n
        spread = math.sqrt(sum(w * (u - mean) ** 2 for w, u in zip(weights, used)) / n)
        return max(0.0, cycles * (m["run_waste_h"] + mean - self.budget_se * spread / math.sqrt(n)))

    def _abundant(self, obs: Observation, m: dict) -> bool:
        """Does waiting out every outage until the deadline fit in the slack left?"""
        slack = obs.slack_h()
        assert slack is not None
        return self._budget(obs, m, math.inf) <= slack

    def slack_value(self, obs: Observation) -> tuple[float, bool]:
        """(lambda, abundant): what one more hour of slack saves when the job ends with an on-demand block,
        in spot-price units (``market_stats``), and whether the slack is abundant, in which case the
        policy prices it at 0. A multi-zone policy weighs a dearer offer now against waiting with it."""
        if obs.deadline_h is None:
            return 0.0, True
        m = self.market_stats(obs, self.price_ratio(obs))
        return m["lambda"], self._abundant(obs, m)

    def _decide(self, obs: Observation) -> str:
        answer = self._choose(obs)
        if answer == WAIT and obs.market is None and not obs.spot_available and self._below_pace(obs):
            return ON_DEMAND
        if answer == SPOT and obs.market != SPOT and not launch_can_progress(obs.slack_h(), obs.changeover_h,
                                                                           obs.tick_h):
            return ON_DEMAND if obs.market == ON_DEMAND else WAIT
        return answer

    def _below_pace(self, obs: Observation) -> bool:
        """Is the slack below ``pace`` x the slack Uniform Progress would keep now?"""
        slack, line = obs.slack_h(), uniform_slack(obs)
        return self.pace > 0 and slack is not None and line is not None and slack < self.pace * line

    def _choose(self, obs: Observation) -> str:
        if obs.deadline_h is None:
            return SPOT if obs.spot_available else WAIT
        d, k, tick = obs.changeover_h, self.price_ratio(obs), obs.tick_h
        m = self.market_stats(obs, k)
        slack = obs.slack_h()
        assert slack is not None  # a deadline is given
        lam = 0.0 if self._abundant(obs, m) else m["lambda"]
        if obs.spot_available:
            if obs.market == SPOT:
                return SPOT
            age = _since(self.run_start, obs.now_h)
            if obs.market == ON_DEMAND:
                fixed = lam * d + min(k * d, lam * m["outage_h"])
                value = lambda rest: k * max(0.0, rest - d) - rest - fixed
                now = self._run_mean(age, value)
                if now > 0 and now >= self._later(age, value, tick, d):
                    return SPOT
                return ON_DEMAND
            value = lambda rest: (k + lam) * max(0.0, rest - d) - rest
            now = self._run_mean(age, value)
            if now > 0:
                return SPOT if now >= self._later(age, value, tick, d) else WAIT
            excursion_pays = lam > 0  # spot is not worth its changeover: this is an outage for us
        else:
            if obs.market == ON_DEMAND:
                return ON_DEMAND
            excursion_pays = lam * self._rest_of_outage(_since(self.outage_start, obs.now_h), d) > k * d
        if not excursion_pays:  # never with lambda = 0 (abundant slack, or spot that cannot pay)
            return WAIT
        return ON_DEMAND if self._budget(obs, m, _since(self.idle_since, obs.now_h)) > slack else WAIT


_POLICIES: dict[str, type[Policy]] = {
    "on-demand": OnDemandPolicy,
    "spot": SpotPolicy,
    "threshold": ThresholdPolicy,
    "up": UniformProgressPolicy,
    "greedy": GreedyPolicy,
    "default": DefaultPolicy,
}


def make_policy(name: str, **params) -> Policy:
    """A fresh policy by name (``POLICY_NAMES``); unknown names and parameters are InputErrors."""
    cls = _POLICIES.get(name)
    if cls is None:
        raise InputError(f"unknown policy {name!r}", where="policy.name",
                         fix=f"use one of: {', '.join(POLICY_NAMES)}")
    try:
        return cls(**params)
    except TypeError as error:
        raise InputError(f"bad parameters for policy {name!r}: {error}", where="policy") from None


__all__ = [
    "DEFAULT_CHANGEOVER_H",
    "ON_DEMAND",
    "POLICY_NAMES",
    "SPOT",
    "WAIT",
    "DefaultPolicy",
    "Observation",
    "Policy",
    "censored_mean",
    "launch_can_progress",
    "make_policy",
    "safety_net",
    "uniform_slack",
]

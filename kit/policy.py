"""Spot vs on-demand policies, shared by the watcher (``kit watch``) and the simulator (``kit simulate``).

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
* ``default``: forecast-paced greedy: spot whenever a launch pays off, on-demand only when the
  spot share seen so far cannot finish the job in the time left (see :class:`DefaultPolicy`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kit.errors import InputError

SPOT, ON_DEMAND, WAIT = "spot", "on-demand", "wait"
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


class Policy:
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

    def _observe(self, obs: Observation) -> None:  # bookkeeping every tick, net or not
        pass

    def _decide(self, obs: Observation) -> str:
        raise NotImplementedError

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


class GreedyPolicy(Policy):
    """Can't Be Late's Greedy: Exploitation (stay on spot) + Safety Net (sticky) + Thrifty."""

    name = "greedy"

    def _decide(self, obs: Observation) -> str:
        return SPOT if obs.spot_available else WAIT


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
    except that once on on-demand it stays there until cp(t) >= ep(t + 2d) (hysteresis); when
    idle and behind (cp < ep(t)) go on-demand; otherwise wait. Without a deadline there is no
    schedule to keep: it behaves like ``spot``.
    """

    name = "up"

    def _expected(self, obs: Observation, t: float) -> float:
        return obs.job_h * min(1.0, t / obs.deadline_h) if obs.deadline_h else 0.0

    def _decide(self, obs: Observation) -> str:
        if obs.deadline_h is None or obs.deadline_h <= 0:
            return SPOT if obs.spot_available else WAIT
        cp = obs.progress_h
        if obs.market == ON_DEMAND and cp < self._expected(obs, obs.now_h + 2 * obs.changeover_h) - EPS:
            return ON_DEMAND
        if obs.spot_available:
            return SPOT
        if cp < self._expected(obs, obs.now_h) - EPS:
            return ON_DEMAND
        return WAIT


class DefaultPolicy(Policy):
    """Forecast-paced greedy: spot whenever it pays, on-demand only for what spot cannot cover.

    It learns the market while the job runs (share of ticks with spot, lengths of spot runs;
    both start from a weak prior: share 0.5 worth ``prior_weight_h`` hours, runs of ``prior_run_h``)
    and each tick asks: at the spot share seen so far, will spot alone finish the remaining
    compute in the time left, ``f * (R - t - d) >= C - margin``? The margin
    (``margin_h + margin_slack * slack``) leans towards waiting while slack is plentiful, since
    waiting only spends slack while on-demand spends money.

    * Spot is up: stay on spot; from idle launch spot when the expected rest of the current
      spot run (mean of the longer runs seen, given its age) beats the changeover ``d``; from
      on-demand only when it beats Can't Be Late's break-even lifetime ``2 k d / (k - 1)`` and
      the slack can absorb one more round trip (``> 2 d + tick``).
    * Spot is down (or not worth a launch): on-demand when the forecast says spot alone falls
      short, else wait (spending slack instead of money). Once on on-demand it stays there while
      spot is down (a release and relaunch costs two changeovers).
    * The safety net (slack <= one tick) always wins. Without a deadline it is ``spot``.

    Unlike UP it never runs on-demand just to keep a straight-line schedule when the market has
    been good enough to catch up later, and unlike greedy it does not burn all its slack waiting
    on a poor market before the net forces it onto on-demand for the rest of the job.
    """

    name = "default"
    sticky_net = False

    def __init__(self, price_ratio: float = 4.0, prior_share: float = 0.5, prior_weight_h: float = 24.0,
                 margin_h: float = 6.0, margin_slack: float = 0.5, prior_run_h: float = 2.0) -> None:
        super().__init__()
        self.k = max(1.0 + 1e-6, float(price_ratio))
        self.prior_share, self.prior_weight_h = float(prior_share), float(prior_weight_h)
        self.margin_h, self.margin_slack = float(margin_h), float(margin_slack)
        self.prior_run_h = float(prior_run_h)
        self.ticks = self.up_ticks = 0
        self.runs: list[float] = []  # lengths of completed spot-availability runs
        self.run_start: float | None = None

    def _observe(self, obs: Observation) -> None:
        self.ticks += 1
        if obs.spot_available:
            self.up_ticks += 1
            if self.run_start is None:
                self.run_start = obs.now_h
        elif self.run_start is not None:
            self.runs.append(obs.now_h - self.run_start)
            self.run_start = None

    def spot_share(self, tick_h: float) -> float:
        """Share of time spot was available so far, shrunk towards the prior."""
        w = self.prior_weight_h
        return (self.up_ticks * tick_h + self.prior_share * w) / (self.ticks * tick_h + w)

    def expected_rest_of_run_h(self, now_h: float) -> float:
        """Mean remaining length of the current spot run, from the runs seen that lasted longer."""
        age = now_h - self.run_start if self.run_start is not None else 0.0
        longer = [r - age for r in self.runs if r > age + EPS]
        return (sum(longer) + self.prior_run_h) / (len(longer) + 1)

    def _decide(self, obs: Observation) -> str:
        if obs.deadline_h is None:
            return SPOT if obs.spot_available else WAIT
        d, tick = obs.changeover_h, obs.tick_h
        window = obs.deadline_h - obs.now_h - d
        slack = max(0.0, obs.slack_h() or 0.0)
        margin = self.margin_h + self.margin_slack * slack
        spot_falls_short = self.spot_share(tick) * window < obs.remaining_h - margin
        if obs.spot_available:
            if obs.market == SPOT:
                return SPOT
            rest = self.expected_rest_of_run_h(obs.now_h)
            if obs.market == ON_DEMAND:
                if slack <= 2 * d + tick + EPS:
                    return ON_DEMAND
                return SPOT if rest > 2 * self.k * d / (self.k - 1) else ON_DEMAND
            if rest > d:
                return SPOT
        if obs.market == ON_DEMAND:
            return ON_DEMAND
        return ON_DEMAND if spot_falls_short else WAIT


_POLICIES = {
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


__all__ = ["ON_DEMAND", "POLICY_NAMES", "SPOT", "WAIT", "Observation", "Policy", "make_policy", "safety_net"]

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
* ``default``: UP with a schedule stretched into the slack and a learned spot-lifetime gate on
  leaving on-demand (see :class:`DefaultPolicy`).
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


class DefaultPolicy(Policy):
    """Uniform Progress with a relaxed schedule and a learned spot-lifetime gate.

    Like ``up`` (take spot whenever it is available; when idle and behind the schedule go
    on-demand; on on-demand stay while spot is down or until ahead of the schedule at t + 2d),
    with two changes:

    * the schedule is stretched into the slack: ep(t) = C0 * t / (C0 + d + s * (R0 - C0 - d)) with
      ``pace_stretch`` s = 1.15, i.e. it aims to finish slightly *after* the deadline and lets the
      safety net absorb the end. Waiting only spends slack, on-demand spends money;
    * leaving on-demand for spot needs, besides being ahead of the schedule, a spot run expected to
      outlast Can't Be Late's break-even lifetime ``2 k d / (k - 1)`` (k = on-demand / spot price,
      4 by default). The expected rest of the current run is learned while the job runs: the mean
      remaining length of the spot runs seen that lasted longer than the current one, plus one
      prior run of ``prior_run_h``. On markets whose spot runs are short it stays on on-demand
      instead of paying two changeovers for a few minutes of spot.

    The safety net (slack <= one tick) always wins. Without a deadline it is ``spot``.
    """

    name = "default"
    sticky_net = False

    def __init__(self, price_ratio: float = 4.0, pace_stretch: float = 1.15, prior_run_h: float = 2.0) -> None:
        super().__init__()
        if price_ratio <= 1 or pace_stretch <= 0 or prior_run_h < 0:
            raise InputError(f"default needs price_ratio > 1, pace_stretch > 0, prior_run_h >= 0 (got "
                             f"{price_ratio}, {pace_stretch}, {prior_run_h})", where="policy")
        self.k = float(price_ratio)
        self.pace_stretch = float(pace_stretch)
        self.prior_run_h = float(prior_run_h)
        self.runs: list[float] = []  # lengths of completed spot-availability runs
        self.run_start: float | None = None

    def _observe(self, obs: Observation) -> None:
        if obs.spot_available and self.run_start is None:
            self.run_start = obs.now_h
        elif not obs.spot_available and self.run_start is not None:
            self.runs.append(obs.now_h - self.run_start)
            self.run_start = None

    def expected_rest_of_run_h(self, now_h: float) -> float:
        """Mean remaining length of the current spot run, from the runs seen that lasted longer."""
        age = now_h - self.run_start if self.run_start is not None else 0.0
        longer = [r - age for r in self.runs if r > age + EPS]
        return (sum(longer) + self.prior_run_h) / (len(longer) + 1)

    def expected_progress(self, obs: Observation, t: float) -> float:
        c0, d = obs.job_h, obs.changeover_h
        horizon = c0 + d + self.pace_stretch * max(0.0, obs.deadline_h - c0 - d)
        return c0 * min(1.0, t / horizon) if horizon > 0 else c0

    def _decide(self, obs: Observation) -> str:
        if obs.deadline_h is None:
            return SPOT if obs.spot_available else WAIT
        d, cp = obs.changeover_h, obs.progress_h
        if obs.market == ON_DEMAND:
            if not obs.spot_available or cp < self.expected_progress(obs, obs.now_h + 2 * d) - EPS:
                return ON_DEMAND
            break_even = 2 * self.k * d / (self.k - 1)
            return SPOT if self.expected_rest_of_run_h(obs.now_h) > break_even else ON_DEMAND
        if obs.spot_available:
            return SPOT
        return ON_DEMAND if cp < self.expected_progress(obs, obs.now_h) - EPS else WAIT


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

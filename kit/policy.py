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
* ``default``: greedy with a *reversible* safety net: on-demand while the slack is short, back to
  spot when spot is up, the slack can afford another changeover and the spot runs seen so far
  are long enough for the changeover to pay off (the paper's next-spot-lifetime rule, with the
  lifetime estimated online).
"""

from __future__ import annotations

import math
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
    """Greedy with a reversible safety net and a learned spot-lifetime test.

    * Spot whenever it is available and the slack is comfortable; wait otherwise (spot costs a
      fraction of on-demand, so every spot hour that fits before the deadline is worth taking).
    * On-demand when the slack is at most one tick (the safety net, not sticky here).
    * On on-demand, go back to spot only when (a) the slack still covers one more changeover to
      spot and, if that spot run is lost at once, one back to on-demand plus a tick
      (``slack > 2 d + tick``, so the deadline stays safe), and (b) the spot gang has been up
      for ``confirm_h`` (a fresh launch on a flickering market wastes a changeover) and (c) the
      typical spot run seen so far (median of completed runs, prior ``prior_run_h``) exceeds the
      break-even lifetime ``2 k d / (k - 1)`` (Can't Be Late's next-spot-lifetime rule).
    """

    name = "default"
    sticky_net = False

    def __init__(self, price_ratio: float = 4.0, prior_run_h: float = 2.0, confirm_h: float = 0.0) -> None:
        super().__init__()
        self.k = max(1.0 + 1e-6, float(price_ratio))
        self.prior_run_h = float(prior_run_h)
        self.confirm_h = float(confirm_h)
        self.runs: list[float] = []  # lengths of completed spot-availability runs
        self.run_start: float | None = None
        self.last_now: float | None = None

    def _observe(self, obs: Observation) -> None:
        if obs.spot_available and self.run_start is None:
            self.run_start = obs.now_h
        elif not obs.spot_available and self.run_start is not None:
            self.runs.append(obs.now_h - self.run_start)
            self.run_start = None
        self.last_now = obs.now_h

    def typical_run_h(self) -> float:
        runs = sorted(self.runs)
        if not runs:
            return self.prior_run_h
        # shrink towards the prior while few runs were seen
        n = len(runs)
        median = runs[n // 2] if n % 2 else 0.5 * (runs[n // 2 - 1] + runs[n // 2])
        return (median * n + self.prior_run_h) / (n + 1)

    def _decide(self, obs: Observation) -> str:
        if not obs.spot_available:
            return ON_DEMAND if obs.market == ON_DEMAND and self._tight(obs) else WAIT
        if obs.market == SPOT:
            return SPOT
        if obs.market == ON_DEMAND:
            slack = obs.slack_h()
            if slack is not None and slack <= 2 * obs.changeover_h + obs.tick_h + EPS:
                return ON_DEMAND
            up_for = obs.now_h - self.run_start if self.run_start is not None else 0.0
            if up_for + EPS < self.confirm_h:
                return ON_DEMAND
            break_even = 2 * self.k * obs.changeover_h / (self.k - 1)
            return SPOT if self.typical_run_h() > break_even else ON_DEMAND
        return SPOT

    def _tight(self, obs: Observation) -> bool:
        slack = obs.slack_h()
        return slack is not None and slack <= 2 * obs.changeover_h + obs.tick_h + EPS


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


__all__ = ["SPOT", "ON_DEMAND", "WAIT", "POLICY_NAMES", "Observation", "Policy", "make_policy", "safety_net"]

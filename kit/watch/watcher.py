"""The watch loop: poll -> ledger -> observation -> policy -> act.

Every ``interval_s`` (15 s by default, SkyPilot's controller cadence) or at once when an agent
reports a preemption notice, one ``tick``:

1. polls the cloud (``EventSource``) and records which nodes of the current deployment are gone
   (the cloud API confirms a loss; an agent's notice alone only wakes the loop early);
2. builds a ``kit.policy.Observation`` from the ledger: progress and job size from the trainer's
   heartbeats (step / total and the measured step time), whether losses since the last tick interrupted
   the job (a preemption: a gang's nodes lost over several polls count once, ``_market_losses``), and
   whether spot is usable (not in a tick where a spot node was lost, as in the one-zone simulator's
   model, unless the job may move: then the tick first tells the policy the run ended and the search
   tries the other offers at once, as the multi-zone simulator's ``default`` does; not while a spot
   launch is backing off after a capacity error; and, for a job that may move and is not on spot, not
   while no spot offer is worth trying: every one's runs too short to be worth its price, nor, on
   on-demand, until a try of spot is due: ``Actor.spot_try_due``, ski rental, as a failed try costs the
   on-demand nodes);
3. asks the policy, turns its answer into an action (``launch``/``switch``/``recover``/
   ``release``; on spot with nothing else to do, a ``move`` to a cheaper offer when one is due) and commits it
   as a pending decision;
4. carries out the pending decision when its backoff allows (``acting.Actor``).

Until the first heartbeat there is no job size to reason about: the watcher keeps the spec's
market and only recovers lost nodes. The policy's history (e.g. preemption times for
``threshold``) is rebuilt on restart by replaying the recorded ticks.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kit.policy import WAIT, Observation, Policy
from kit.policy.market import DefaultPolicy
from kit.watch.acting import MOVE, Actor, Outcome
from kit.watch.disks import DiskKeeper
from kit.watch.events import BY_KIT, CAPACITY_ERROR, LOSS_KINDS, STOPPED_BY_KIT, Event
from kit.watch.ledger import INTERRUPTED_AT, Ledger, NodeRow
from kit.watch.sources.base import EventSource, SourceError, loss_events
from kit.watch.status import changeover_of, prices_of
from training.contract import ON_DEMAND, SPOT

if TYPE_CHECKING:
    from kit.spec import SpecBase

log = logging.getLogger("kit.watch")
# An observation's mark (recorded with it) for a tick that lost the spot run of a job that may move.
LOST_SPOT = "lost_spot"
WATCHER_MARKS = (LOST_SPOT, INTERRUPTED_AT)  # recorded with an observation, never shown to the policy



@dataclass
class TickResult:
    now: float
    market: str | None
    nodes_up: int
    nodes_lost: int
    step: int | None = None
    total_steps: int | None = None
    decision: str | None = None
    action: str | None = None
    outcome: Outcome | None = None
    done: bool = False
    new_events: list[Event] = field(default_factory=list)
    source_error: str | None = None


class Watcher:
    def __init__(self, spec: SpecBase, ledger: Ledger, actor: Actor, policy: Policy, *, source: EventSource | None = None,
                 interval_s: float = 15.0, clock: Callable[[], float] = time.time, time_scale: float = 1.0):
        self.spec = spec
        # ``clock`` seconds per wall second (the local cloud's compressed clock): one interval of
        # the loop lasts interval_s * time_scale on the ledger's clock.
        self.time_scale = float(time_scale)
        self.ledger = ledger
        self.actor = actor
        self.policy = policy
        self.source = source
        self.interval_s = interval_s
        self.clock = clock
        self.wake = threading.Event()  # set by the HTTP server on a notice
        self.keeper = DiskKeeper(actor.backend, ledger, spec, clock=clock)

    # ------------------------------------------------------------------ start-up
    def start(self) -> None:
        now = self.clock()
        self.job_started = self.ledger.job_started(now)
        replayed = 0
        for tick in self.ledger.ticks():  # rebuild the policy's memory of past preemptions
            self._decide(tick["observation"])
            replayed += 1
        if replayed:
            log.info("replayed %d recorded ticks into policy %s", replayed, self.policy.name)
        self.actor.resume()
        self._adopt_deployment(now)

    def _adopt_deployment(self, now: float) -> None:
        """First start on an applied cluster (``kit apply`` ran before ``kit watch``): record its nodes."""
        if self.ledger.all_nodes() or self.ledger.decisions(limit=1):
            return
        deployed = self.actor.backend.nodes()
        if deployed:
            market = deployed[0].market or self.spec.market
            self.ledger.adopt_deployment([n.to_dict() for n in deployed], market, self._policy_name(), now)
        else:
            self.ledger.begin_decision(policy=self._policy_name(), decision=self.spec.market, action="launch",
                                       market_before=None, market_after=self.spec.market,
                                       reason="nothing deployed yet: launch on the spec's market", now=now)

    def _policy_name(self) -> str:
        return self.policy.name

    def _as_zone_default(self) -> bool:
        """Whether this job's ticks follow the simulated multi-zone ``default`` (``ZoneDefault``): a job that
        may move, with that policy's market policy. It searches the other offers in the tick its spot run is
        lost (the lost zone last), and a search that finds no spot is that tick's probe (:meth:`_ask_again`).
        A job in one place sees spot unavailable in the tick of a loss, as the one-zone simulator does."""
        return isinstance(self.policy, DefaultPolicy) and self.actor.learns() and self.spec.can_move

    def _ask_again(self, now: float, observation: dict, before: dict, result: TickResult) -> None:
        """The tick's capacity search was its probe, and it found no spot offer with capacity. The simulated
        multi-zone ``default`` probes first and decides on what it found; so the policy forgets its answer
        (its state as before it) and decides the tick again with spot unavailable: it learns an outage, not a
        run, and may take on-demand at once (pacing) instead of idling until the search's backoff ends. The
        ledger keeps that observation, so a restarted watcher's replay learns the same. What runs is read
        again: the search's applies may have ended the nodes it was to replace (``Actor._end_replaced``),
        and those are relaunched now, not a tick later."""
        deployed_market, any_lost = self.ledger.market(), bool(self.ledger.nodes(("lost",)))
        self.policy.restore(before)
        observation = {**observation, "spot_available": False}
        decision = self._decide(observation)
        self.ledger.amend_last_tick(observation, decision)
        result.decision = decision
        if decision == SPOT:  # not an answer to spot unavailable; the pending search keeps its backoff
            return
        result.action = self._plan(decision, deployed_market, any_lost, now)
        result.outcome = self._act(now) or result.outcome

    def _decide(self, observation: dict) -> str:
        """The policy's answer to a tick's observation (as recorded: the replay at start-up calls this too).
        A tick that lost a spot run of a job that may move (``LOST_SPOT``) first tells the policy the run
        ended (spot unavailable), then asks it with spot as the search finds it, as ``ZoneDefault`` does."""
        seen = self._seen(observation)
        if observation.get(LOST_SPOT) and isinstance(self.policy, DefaultPolicy):
            self.policy.observe(replace(seen, spot_available=False))
        return self.policy.decide(seen)

    # ------------------------------------------------------------------ one tick
    def tick(self) -> TickResult:
        now = self.clock()
        result = TickResult(now=now, market=None, nodes_up=0, nodes_lost=0)
        self._poll(now, result)
        cursor = self.ledger.observed_event_id()
        fresh = self.ledger.events(after_id=cursor)
        self._mark_losses(fresh)
        up = self.ledger.nodes(("up",))
        lost = self.ledger.nodes(("lost",))
        deployed_market = self.ledger.market()
        result.nodes_up, result.nodes_lost = len(up), len(lost)
        result.market = deployed_market if up and not lost else None

        progress = self.ledger.latest_progress()
        if progress:
            result.step, result.total_steps = progress["step"], progress["total_steps"]
            if progress["state"] == "done" or progress["step"] >= progress["total_steps"]:
                result.done = True
                return result

        incarnations = self.ledger.all_nodes()  # the newest incarnation of an instance last
        losses, preempted = self._market_losses(fresh, progress, incarnations)
        markets = {n.instance_id: n.market for n in incarnations}
        spot_lost = any(markets.get(e["instance"]) == SPOT for e in losses)
        capacity_blocked = now < self.ledger.spot_blocked_until()
        observation = self._observation(now, progress, result.market, preempted, spot_available=False)
        # A spot run that holds goes on whatever its zone's record (the simulated default never leaves one
        # for the ceiling); only a launch needs an offer worth trying (asked last: it reads the ledger).
        moving = self._as_zone_default()
        if observation is not None:
            observation["spot_available"] = not capacity_blocked and (not spot_lost or moving) and (
                result.market == SPOT or self.actor.spot_worth_trying()) and (
                result.market != ON_DEMAND or not moving or self.actor.spot_try_due())
            if spot_lost and moving:
                observation[LOST_SPOT] = True
            if preempted and progress:
                observation[INTERRUPTED_AT] = progress["step"]
        observed = max([cursor] + [e["id"] for e in fresh])
        # policy state before it decides, for a tick whose capacity search may turn out to be a failed probe
        before = (self.policy.snapshot() if moving and observation is not None
                  and observation["spot_available"] and result.market != SPOT else None)
        if observation is not None:
            decision = self._decide(observation)
        else:  # no heartbeat yet: keep the market, recover what was lost
            decision = deployed_market or self.spec.market
        # The observation and the events it covered are committed together (a crash in between
        # would make the restarted watcher replay this tick and then see its events again).
        self.ledger.record_tick(now, observation, decision if observation is not None else None,
                                observed_event_id=observed)
        result.decision = decision
        result.action = self._plan(decision, deployed_market, bool(lost), now,
                                   spot_just_lost=spot_lost and not capacity_blocked)
        result.action = result.action or self._plan_move(now, observation, decision, result.market)
        result.outcome = self._act(now)
        if before is not None and observation is not None and decision == SPOT and result.outcome is not None \
                and result.outcome.capacity_error:
            self._ask_again(now, observation, before, result)
        if self.ledger.pending_decision() is None:  # settled: the disks of zones left long enough ago may go
            self.keeper.tick()
        return result

    def _market_losses(self, fresh: list[dict], progress: dict | None,
                       incarnations: list[NodeRow]) -> tuple[list[dict], bool]:
        """What the market did among a tick's new events: the losses (not the agents' notices, nor the nodes
        kit stopped itself: an interrupted local run's, recovered, but neither a preemption nor the end of the
        zone's spot run), and whether they interrupt the job, a preemption to the policy.

        A cloud reclaims a gang's nodes one by one, seconds or minutes apart, and a poll can fall between two
        of them; the simulator, and with it the policies' statistics (threshold's k preemptions, the spot
        runs ``default`` learns), count the gang's loss once. So a loss of nodes that were up when an earlier
        tick counted an interruption, while the job has not trained past the step it had reached then,
        completes that interruption; a node launched since (a relaunch lost again), or a loss after the job
        went on, is a new one. (After a restart from an older checkpoint the job may take a while to pass
        that step: a survivor lost in between counts with the interruption before.) A loss dated before that
        interruption is no news at all: a late report of one counted then (a GCP preempted operation listed
        after the instance was seen gone)."""
        losses = [e for e in fresh if e["kind"] in LOSS_KINDS and e["source"] != "agent" and not e["detail"].get(BY_KIT)]
        last = self.ledger.last_interruption() if losses and progress is not None else None
        if last is None or progress is None:
            return losses, bool(losses)
        when, step = last
        losses = [e for e in losses if e["time"] > when]
        started = {n.instance_id: n.since for n in incarnations}
        went_on = progress["step"] > step
        return losses, any(went_on or started.get(e["instance"], when) >= when for e in losses)

    def record_losses(self) -> None:
        """Poll once and record the nodes the source reports lost, without asking the policy. The loop calls
        it on its way out, after the backend stopped what cannot outlive it (the local nodes save and stop):
        the ledger then says at once that they stopped, and when, so `kit status` stops charging them. The
        next tick's policy still sees those events (the observed cursor does not move), as it did when the
        next run's first poll recorded them."""
        now = self.clock()
        self._poll(now, TickResult(now=now, market=None, nodes_up=0, nodes_lost=0))
        self._mark_losses(self.ledger.events(after_id=self.ledger.observed_event_id()))

    def _poll(self, now: float, result: TickResult) -> None:
        if self.source is None:
            return
        try:
            poll = self.source.poll()
        except SourceError as error:  # transient: the next tick polls again
            log.warning("polling %s failed: %s", self.source.name, error)
            result.source_error = str(error)
            return
        up = self.ledger.nodes(("up",))
        current = {n.instance_id: n.rank for n in up}
        events = loss_events(poll, current, self.source.name, now, since={n.instance_id: n.since for n in up})
        # Cloud-side events about any instance the ledger knows (a preempted operation can name an
        # instance that is no longer listed, or already marked lost), and capacity errors.
        known = {n.instance_id for n in self.ledger.all_nodes()}
        events += [e for e in poll.events if e.instance in known or e.kind == CAPACITY_ERROR]
        result.new_events = [e for e in events if self.ledger.record(e)]

    def _mark_losses(self, fresh: list[dict]) -> None:
        for event in fresh:
            # Only the cloud (or the local backend) confirms a loss; notices precede it.
            confirmed = event["kind"] in LOSS_KINDS and event["source"] != "agent"
            by_kit = bool(event["detail"].get(BY_KIT))
            if confirmed and self.ledger.mark_lost(event["instance"], event["time"], STOPPED_BY_KIT if by_kit else event["kind"]):
                if by_kit:
                    log.info("node %s stopped by kit (%s)", event["instance"], event["detail"].get("reason"))
                else:
                    log.warning("node %s lost (%s: %s)", event["instance"], event["kind"], event["detail"].get("reason"))

    def tick_hours(self, changeover_h: float) -> float:
        """How long until the loop can act on a decision again, in hours: the deadline safety net
        keeps this much margin. At least the loop's interval; but an apply + bootstrap blocks the
        loop for as long as it takes (the longest of the recent ones counts), and a launch is
        assumed to take at least the changeover time."""
        measured_s = max(self.ledger.action_durations(), default=0.0)
        return max(self.interval_s * self.time_scale / 3600.0, measured_s / 3600.0, changeover_h)

    def _observation(self, now: float, progress: dict | None, market: str | None, preempted: bool, *,
                     spot_available: bool) -> dict | None:
        step_times = self.ledger.recent_step_times()
        if not progress or not step_times:
            return None
        step_time_h = statistics.median(step_times) / 3600.0
        changeover_h = changeover_of(self.spec)
        prices = prices_of(self.actor.deployed_spec())  # where the job runs: a zone may price it apart
        return {
            "now_h": (now - self.job_started) / 3600.0,
            "progress_h": progress["step"] * step_time_h,
            "job_h": progress["total_steps"] * step_time_h,
            "deadline_h": self.spec.policy.deadline_hours,
            "changeover_h": changeover_h,
            "market": market,
            # set by tick() (module docstring, step 2): the policies learn spot's run lengths from it
            "spot_available": spot_available,
            "preempted": preempted,
            "tick_h": self.tick_hours(changeover_h),
            # the policy weighs spot against on-demand with the spec's prices ($/h per node) in the job's zone
            "spot_price": prices[SPOT],
            "on_demand_price": prices[ON_DEMAND],
        }

    def _plan(self, decision: str, deployed_market: str | None, any_lost: bool, now: float, *,
              spot_just_lost: bool = False) -> str | None:
        """Turn the policy's answer into a pending decision (or none)."""
        pending = self.ledger.pending_decision()
        if decision == WAIT:
            if deployed_market is None:
                self._supersede_pending(now, "the policy chose to wait")
                return None
            if spot_just_lost:
                # Spot was reported unavailable only because a spot node was lost this tick; next
                # tick it is available again. Releasing the survivors now to relaunch them a
                # tick later would only cost a changeover: hold, the next tick decides.
                log.info("policy waits in the tick of a spot loss: holding the survivors one tick")
                return None
            action, target, reason = "release", None, "the policy chose to wait: release instances, keep disks"
        elif decision in (SPOT, ON_DEMAND):
            if deployed_market is None:
                action, reason = "launch", f"nothing running: launch on {decision}"
            elif decision != deployed_market:
                action, reason = "switch", f"switch {deployed_market} -> {decision}"
            elif any_lost:
                action, reason = "recover", f"recreate lost nodes on {decision}"
            elif pending and pending.market_after == decision and self.ledger.applies(
                    decision_id=pending.id, status="applied"):
                return pending.action  # applied already; its bootstrap is still to be done (or retried)
            else:
                self._supersede_pending(now, f"already running on {decision}")
                return None
            target = decision
        else:
            raise ValueError(f"policy {self._policy_name()} answered {decision!r}; expected spot, on-demand or wait")
        if pending and pending.action == action and pending.market_after == target:
            return action  # already decided; acting honours its backoff
        self.ledger.begin_decision(policy=self._policy_name(), decision=decision, action=action,
                                   market_before=deployed_market, market_after=target, reason=reason, now=now)
        log.info("decision: %s (%s)", action, reason)
        return action

    @staticmethod
    def _seen(observation: dict) -> Observation:
        """A recorded observation as the policy sees it (without the watcher's own marks)."""
        return Observation(**{k: v for k, v in observation.items() if k not in WATCHER_MARKS})

    def _plan_move(self, now: float, observation: dict | None, decision: str, market: str | None) -> str | None:
        """On spot with nothing else to do (``decision`` and the running ``market`` spot, no action planned): a
        voluntary move to a cheaper offer when one is due (``Actor.move_due``), as the simulated ``default`` moves
        when a cheaper offer is up; only for a job that follows it (:meth:`_as_zone_default`)."""
        if observation is None or not (decision == SPOT == market) or not self._as_zone_default():
            return None
        seen = self._seen(observation)
        reason = self.actor.move_due(seen.slack_h(), seen.tick_h)
        if reason is None:
            return None
        self.ledger.begin_decision(policy=self._policy_name(), decision=SPOT, action=MOVE, market_before=SPOT,
                                   market_after=SPOT, reason=reason, now=now)
        log.info("decision: %s (%s)", MOVE, reason)
        return MOVE

    def _supersede_pending(self, now: float, why: str) -> None:
        self.ledger.supersede_pending(now, why)

    def _act(self, now: float) -> Outcome | None:
        pending = self.ledger.pending_decision()
        if pending is None or now < pending.next_attempt:
            return None
        outcome = self.actor.execute(pending)
        if outcome.capacity_error and pending.market_after == SPOT:
            # Spot counts as unavailable until the retry (not a preemption: the simulator's tick without capacity).
            self.ledger.block_spot_until(self.ledger.decision(pending.id).next_attempt)
        return outcome

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event, on_tick: Callable[[TickResult], None] | None = None) -> TickResult:
        self.start()
        while True:
            result = self.tick()
            if on_tick:
                on_tick(result)
            if result.done or stop.is_set():
                return result
            if result.outcome:
                result.outcome.raise_if_given_up(self.ledger)
            self.wake.wait(self.interval_s)
            self.wake.clear()


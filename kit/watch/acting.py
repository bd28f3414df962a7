"""Carrying out a decision through a Backend, exactly once, with backoff on capacity errors.

A decision's action is one of:
* ``launch`` / ``switch``: render the spec on the decided market, apply (instances replaced,
  disks kept), bootstrap every node (node 0 may be new: everyone gets the new rendezvous
  endpoint and restarts from the newest checkpoint).
* ``recover``: same market, re-apply to recreate lost nodes, then bootstrap every node.
* ``release``: delete the instances, keep the disks (the policy chose to wait).
* ``move``: on spot, a try to move to a spot offer cheaper per hour of progress than the running one
  (``Actor.move_due``: the simulated ``default``'s move rule, timed by ski rental because a real try that
  finds no capacity has replaced the running nodes); its search is those offers, then the running one.

Where: a spec with several zones or shapes has several offers on the decided market. A launch,
switch or recover tries them in the capacity search's order (``kit.policy.zones.search_order``:
the running zone and shape first unless that zone just preempted (on-demand: even then), the other
zones shuffled, the preempting zone last; with the ``default`` policy the other spot offers are ranked instead by what
the job's runs on them were worth, ``kit.policy.zones.learned_order``, and those dearer per hour of
progress than on-demand are left out) until one has capacity; each
offer without capacity is recorded as a capacity error. Landing elsewhere is a move (another zone: the checkpoint comes from the bucket)
or a shape switch (the same GPUs in other instances: torchrun's nnodes x nproc-per-node change,
the world size does not).

Retry timing follows SkyPilot's managed-job launcher (sky/jobs/recovery_strategy.py with
sky/utils/common_utils.py's Backoff): exponential backoff
×1.6 with ±40 % jitter, capped; here the first wait is 30 s and the cap 5 min by default. For
capacity errors the exponent is the number of capacity failures on that market since its last
successful apply, across decisions: while spot is blocked the policy may wait or take on-demand,
and the next spot attempt is a new decision, but it still waits longer than the one before.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kit.backends.base import Backend, CapacityError, Node
from kit.errors import KitError
from kit.policy.market import launch_can_progress
from kit.policy.offers import Offer
from kit.policy.zones import (
    RunRecord,
    learned_order,
    move_ceiling,
    progress_prices,
    search_order,
    spot_ceiling,
    try_move,
)
from kit.watch.events import BY_KIT, CAPACITY_ERROR, INSTANCE_LOST, PREEMPTION, STOPPED_BY_KIT, Event
from kit.watch.ledger import Apply, Decision, Ledger
from kit.watch.sources.base import GONE_STATES, EventSource, SourceError, loss_key
from training.contract import SPOT

if TYPE_CHECKING:
    from kit.spec import SpecBase

log = logging.getLogger("kit.watch")

MAX_FAILED_ATTEMPTS = 5  # non-capacity failures: past this, a person has to look
# The policy whose capacity search ranks the spot offers by the runs the job had on them (the simulator's
# multi-zone ``default`` ranking, kit.policy.zones.learned_order); the others search in failover's order.
LEARNING_POLICY = "default"
MOVE = "move"  # a decision's action: a voluntary move to a cheaper spot offer (Actor.move_due)


@dataclass
class Backoff:
    initial_s: float = 30.0
    factor: float = 1.6
    cap_s: float = 300.0
    jitter: float = 0.4
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        """Wait before attempt ``attempt + 1`` (``attempt`` >= 1 failures so far)."""
        base = min(self.cap_s, self.initial_s * self.factor ** max(0, attempt - 1))
        return base * self.rng.uniform(1 - self.jitter, 1 + self.jitter)


@dataclass
class Outcome:
    status: str  # "done" | "retry" | "failed"
    capacity_error: bool = False
    error: str | None = None
    nodes: list[Node] = field(default_factory=list)

    def raise_if_given_up(self, ledger: Ledger) -> None:
        """A failed outcome stops ``kit watch`` (exit 1) for a person to fix the cause."""
        if self.status == "failed":
            raise KitError(f"giving up on the last decision: {self.error}", where=str(ledger.path),
                           fix="fix the cause, then run `kit watch` again")


class Actor:
    def __init__(self, backend: Backend, ledger: Ledger, spec: SpecBase, *, backoff: Backoff | None = None,
                 clock: Callable[[], float] = time.time, source: EventSource | None = None):
        self.backend = backend
        self.ledger = ledger
        self.spec = spec
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.source = source  # the cloud API's view, to check what an apply really did

    # ------------------------------------------------------------------ restart recovery
    def resume(self) -> None:
        """Finish what a killed watcher left half done (see ledger docstring)."""
        self.backend.use(self.deployed_spec())
        for attempt in self.ledger.applies(status="applied"):
            decision = self.ledger.decision(attempt.decision_id)
            if decision.status == "failed" and self._bootstrap_abandoned(decision, attempt):
                # The watcher gave up bootstrapping these nodes and stopped for a person to fix the cause;
                # they still run, untrained. This start is that person's retry: bootstrap them again.
                log.info("decision %d: bootstrapping the nodes it left unbootstrapped again", decision.id)
                self.ledger.reopen_decision(decision.id)
                decision = self.ledger.decision(decision.id)
            if decision.status != "pending":
                # Superseded (or given up) before its bootstrap: another decision took over, and
                # these nodes may be gone. Nothing to finish.
                self.ledger.mark_interrupted(attempt.id, self.clock())
                continue
            self._finish(decision, attempt, self._nodes_of(attempt)).raise_if_given_up(self.ledger)
        for attempt in self.ledger.applies(status="started"):
            decision = self.ledger.decision(attempt.decision_id)
            if decision.status != "pending":
                self.ledger.mark_interrupted(attempt.id, self.clock())
                continue
            self._adopt_or_retry(decision, attempt)

    def _bootstrap_abandoned(self, decision: Decision, attempt: Apply) -> bool:
        """Whether ``attempt`` is the deployment that runs now and ``decision`` failed only on its bootstrap:
        the newest apply that reached the cloud, each of its nodes still up, and no other decision pending."""
        newest = self.ledger.applies(status="applied")[-1]
        up = {n.instance_id for n in self.ledger.nodes(("up",))}
        nodes = self._nodes_of(attempt)
        return (decision.bootstrap_failures > 0 and attempt.id == newest.id and bool(nodes)
                and all(n.instance_id in up for n in nodes) and self.ledger.pending_decision() is None)

    def _adopt_or_retry(self, decision: Decision, attempt: Apply) -> None:
        """An apply the watcher was killed in: adopt what the cloud runs if it is what the apply was for (its
        offer, recorded before the apply began), else leave the decision to be retried."""
        deployed = self.backend.nodes()
        offer = self._offer_named(attempt.offer)
        if self._converged(decision, deployed, offer):
            log.info("decision %d: the interrupted apply had converged; adopting it", decision.id)
            if offer is not None and decision.market_after is not None:
                deployed = self._priced(deployed, offer, decision.market_after)
            self.ledger.mark_applied(attempt.id, [n.to_dict() for n in deployed], market=decision.market_after,
                                     now=self.clock(), adopted=True)
            self._finish(decision, attempt, deployed).raise_if_given_up(self.ledger)
        else:
            log.info("decision %d: the interrupted apply had not converged; it will be retried", decision.id)
            self.ledger.mark_interrupted(attempt.id, self.clock())

    def _converged(self, decision: Decision, deployed: list[Node], offer: Offer | None = None) -> bool:
        """Whether ``deployed`` is what the decision's apply was for: its market and, when the apply had chosen
        an ``offer``, that offer's zone and node count (a move or a shape switch keeps the market, and the
        nodes it was to replace are still deployed when it was killed before it ran); none of them an instance
        that has ended."""
        if decision.action == "release":
            return not deployed
        rows = self.ledger.all_nodes()
        up = {n.instance_id for n in rows if n.state == "up"}
        # Instances that ended (an id back in a later incarnation is up again, not gone). A lost
        # GCP VM that an apply restarts keeps its id, so such an apply is retried, not adopted:
        # harmless, applying is idempotent.
        lost = {n.instance_id for n in rows if n.state in ("lost", "replaced", "released")} - up
        counts = {offer.shape.nodes} if offer is not None else {shape.nodes for shape in self.spec.shape_list()}
        return (len(deployed) in counts
                and all(n.market == decision.market_after for n in deployed)
                and (offer is None or all(n.zone in (None, offer.zone) for n in deployed))  # None: not reported
                and not any(n.instance_id in lost for n in deployed))

    def _priced(self, nodes: list[Node], offer: Offer, market: str) -> list[Node]:
        """``nodes`` as the ledger keeps them: with their shape and price (None: unknown, the cost stays unknown)."""
        price = self.spec.node_price(offer.shape, market, offer.zone)
        return [replace(n, shape=offer.shape.name, price=price) for n in nodes]

    @staticmethod
    def _nodes_of(attempt: Apply) -> list[Node]:
        return [Node(**n) for n in attempt.nodes or []]

    # ------------------------------------------------------------------ acting
    def execute(self, decision: Decision) -> Outcome:
        """One attempt at a pending decision. The caller respects ``decision.next_attempt``."""
        applied = self.ledger.applies(decision_id=decision.id, status="applied")
        if applied:  # applied before, only bootstrap failed: do not apply again ...
            nodes = self._nodes_of(applied[-1])
            lost = {n.instance_id for n in self.ledger.nodes(("lost",))}
            if not any(n.instance_id in lost for n in nodes):
                return self._finish(decision, applied[-1], nodes)
            # ... unless one of its nodes was lost since: bootstrapping those cannot work
            self.ledger.mark_interrupted(applied[-1].id, self.clock())
        now = self.clock()
        attempt_id = self.ledger.start_apply(decision.id, decision.market_after, now)
        attempt = self.ledger.applies(decision_id=decision.id)[-1]
        assert attempt.id == attempt_id
        market = decision.market_after  # None: a release
        try:
            if decision.action == "release" or market is None:
                self.backend.destroy(keep_disks=True)
                nodes = []
            else:
                nodes = self._launch(decision, attempt_id, market)
        except CapacityError as error:
            return self._failed(decision, attempt_id, str(error), capacity=True)
        except KitError as error:
            return self._failed(decision, attempt_id, str(error), capacity=False)
        wrong_market = self.market_mismatch(nodes, market)
        if wrong_market:
            return self._failed(decision, attempt_id, wrong_market, capacity=False)
        # The cloud runs these nodes now, whatever the bootstrap below does: the ledger says so
        # at once (market, node table), so a failed bootstrap leaves no stale view behind.
        self.ledger.mark_applied(attempt_id, [n.to_dict() for n in nodes], market=decision.market_after,
                                 now=self.clock())
        return self._finish(decision, attempt, nodes)

    # ------------------------------------------------------------------ where
    def current_offer(self):
        """The offer (kit.policy.offers.Offer) of the newest apply that reached the cloud, or None."""
        return self._offer_named(self.ledger.applied_offer())

    def _offer_named(self, name: str | None):
        """The spec's offer (kit.policy.offers.Offer) of that name, or None (no name, or no longer in the spec)."""
        return next((o for o in self.spec.offers() if o.name == name), None) if name else None

    def deployed_spec(self) -> SpecBase:
        """The spec of what runs now: the spec on its current offer (its own zone and shape before any)."""
        offer = self.current_offer()
        return self.spec.with_offer(offer) if offer is not None else self.spec

    def search(self, decision: Decision | None, market: str) -> list:
        """The offers a launch on ``market`` tries, in order (module docstring); ``decision`` seeds the shuffle."""
        # the zone whose spot run just ended is tried last; nodes kit stopped itself (an interrupted local run)
        # say nothing about their zone
        lost = [n.zone for n in self.ledger.nodes(("lost",)) if n.zone and n.lost_kind != STOPPED_BY_KIT]
        current = self.current_offer() or self.spec.own_offer(market)  # a first launch: the spec's own
        rng = random.Random(f"{self.spec.name}:{decision.id if decision is not None else 0}")
        preempted = lost[-1] if lost else None
        if decision is not None and decision.action == MOVE and market == SPOT:
            # the targets, then where it runs: a try that finds none has replaced the running nodes (kit's apply
            # destroys them first), so it relaunches them there
            here, targets = self.move_targets()
            return list(targets) + ([here] if here is not None else [])
        if not self.learns():
            return search_order(self.spec.offers(), market, rng, current=current, preempted_zone=preempted)
        hours, losses = self.spot_runs()
        return learned_order(self.spec.offers(), market, rng, hours=hours, losses=losses, current=current,
                             preempted_zone=preempted, changeover_h=self.spec.policy.changeover_hours,
                             moves=self.spec.policy.moves(self.ledger.checkpoint_gb()),
                             ceiling=self.ceiling())

    def move_targets(self) -> tuple[Offer | None, dict[Offer, float]]:
        """The running spot offer and the spot offers a voluntary move would try, cheapest first, with their prices
        per hour of progress from there: those below :func:`~kit.policy.zones.move_ceiling` of its price (the simulated
        ``default``'s move rule; their changeover, transfer, egress and runs included). None and {} for a job that
        does not learn or cannot move."""
        current = self.current_offer()
        if current is None or not current.spot or not self.learns() or not self.spec.can_move:
            return current, {}
        prices = self._progress_from(current)
        cheaper = sorted((o for o in prices if o != current and prices[o] < move_ceiling(current.price)),
                         key=lambda o: prices[o])
        return current, {o: prices[o] for o in cheaper}

    def _progress_from(self, current: Offer) -> dict[Offer, float]:
        """Each spot offer's price per hour of progress for the job running on ``current`` (its runs there, the
        changeover, and the checkpoint's transfer and egress from ``current``'s zone)."""
        hours, losses = self.spot_runs()
        return progress_prices([o for o in self.spec.offers() if o.spot], hours=hours, losses=losses,
                               changeover_h=self.spec.policy.changeover_hours,
                               moves=self.spec.policy.moves(self.ledger.checkpoint_gb()), checkpoint_zone=current.zone)

    def _held_h(self, up: list, last_try: float | None) -> float:
        """Hours since the running nodes ``up`` came up, or since ``last_try`` if later: what a ski-rental
        try (:func:`kit.policy.zones.try_move`) weighs."""
        since = max([n.since for n in up] + [last_try or 0.0])
        return max(0.0, self.clock() - since) / 3600.0

    def move_due(self, slack_h: float | None, tick_h: float) -> str | None:
        """Why to try a voluntary move now (the reason a decision records), or None: an offer's progress is cheaper
        than the running offer by the margin, the extra paid since the run began, or since the last try, has
        reached the cost of a try that fails (:func:`kit.policy.zones.try_move`), and the slack lets the launch
        make progress before the safety net (as the simulated move)."""
        current, targets = self.move_targets()
        if current is None or not targets:
            return None
        best, there = next(iter(targets.items()))
        changeover = self.spec.policy.changeover_hours
        launch_h = self.spec.policy.moves(self.ledger.checkpoint_gb()).launch_h(changeover, current.zone, best.zone)
        if not launch_can_progress(slack_h, launch_h, tick_h):
            return None
        last = self.ledger.last_decision(MOVE)
        if not try_move(current.price, there, launch_h=changeover,
                        held_h=self._held_h(self.ledger.nodes(("up",)), last.created if last else None)):
            return None
        return f"try to move: {best.name} costs {there:.2f} $/h per hour of progress, {current.name} {current.price:.2f} $/h"

    def spot_try_due(self) -> bool:
        """Whether a job on on-demand that may move should try spot now (the watcher tells its market policy spot
        is available only then). A try replaces the on-demand nodes first (one cluster root), so one that finds no
        spot capacity relaunches them, a changeover at their price: as for a move (:func:`try_move`), it tries once
        the extra paid on on-demand since they came up, or since the last try found none, over the best spot
        offer's price per hour of progress, has reached that. True where nothing runs on on-demand."""
        current, up = self.current_offer(), self.ledger.nodes(("up",))
        if current is None or current.spot or not up or not self.learns() or not self.spec.can_move:
            return True
        best = min(self._progress_from(current).values(), default=math.inf)
        return try_move(current.price, best, launch_h=self.spec.policy.changeover_hours,
                        held_h=self._held_h(up, self.ledger.last_capacity_failure(SPOT)))

    def learns(self) -> bool:
        """Whether the capacity search ranks the spot offers by the job's runs (``learned_order``)."""
        return self.spec.policy.name == LEARNING_POLICY

    def ceiling(self) -> float | None:
        """The most an hour of progress on spot may cost for the search to try the offer: for a job that may
        move (the simulator's multi-zone ``default``), an hour on the cheapest on-demand offer; none for a job
        in one zone on one shape, whose market policy weighs its one spot offer against on-demand itself."""
        return spot_ceiling(self.spec.offers()) if self.spec.can_move else None

    def spot_worth_trying(self) -> bool:
        """Whether the capacity search would try any spot offer (:meth:`ceiling`): when none is worth its price,
        the market policy sees spot as unavailable, as the simulator's multi-zone ``default`` does."""
        if not self.learns() or self.ceiling() is None:
            return True
        return bool(self.search(None, SPOT))

    def spot_runs(self) -> tuple[dict, dict]:
        """The job's latest spot runs per offer (``RunRecord``: the last ``RUN_WINDOW`` on each): hours held
        (each apply's nodes, from their start until the last one ended, or now) and how many of those runs
        a preemption ended."""
        offers = {o.name: o for o in self.spec.offers() if o.spot}
        runs: dict[int, list] = {}
        for node in self.ledger.all_nodes():
            if node.apply_id is not None and node.market == SPOT:
                runs.setdefault(node.apply_id, []).append(node)
        record = RunRecord(offers.values())
        now = self.clock()
        for _, nodes in sorted(runs.items()):  # oldest apply first: the record keeps the latest runs
            offer = offers.get(f"{nodes[0].zone}/{nodes[0].shape}/{SPOT}")
            if offer is None:
                continue
            ended = max(now if n.until is None else n.until for n in nodes)
            record.add(offer, max(0.0, ended - min(n.since for n in nodes)) / 3600.0,
                       lost=any(n.lost_kind == PREEMPTION for n in nodes))
        return record.hours, record.losses

    def _launch(self, decision: Decision, attempt_id: int, market: str) -> list[Node]:
        """Apply the first offer of the capacity search that has capacity; its nodes carry their shape
        and price. Raises CapacityError when none has (each one recorded), KitError otherwise."""
        order = self.search(decision, market)
        ceiling = self.ceiling() if not order and market == SPOT else None
        if ceiling is not None and any(o.spot for o in self.spec.offers()):
            # every spot offer's runs were too short to pay for their changeovers: as no capacity (the
            # policy then sees spot unavailable and backs off), not an error in the spec
            raise CapacityError(f"no spot offer is worth trying: each costs more per hour of progress than "
                                f"on-demand ({ceiling:.2f} $/h), its runs were too short",
                                where="offers on spot", fix="kit watch tries spot again when the policy does")
        if not order:
            self.spec.with_market(market)  # raises the spec's own reason (e.g. a type sold only as spot)
            raise KitError(f"no offer of the spec is on {market}", where="shapes", fix="add a shape sold on it")
        errors = []
        for offer in order:
            # Said before the apply: a watcher killed inside it adopts on restart only what it was applying.
            self.ledger.set_apply_offer(attempt_id, offer.name)
            try:
                nodes = self.backend.apply(self.spec.with_offer(offer), market)
            except CapacityError as error:
                errors.append(f"{offer.name}: {error.what}")
                self._capacity_event(decision, attempt_id, market, offer.name, str(error))
                continue
            if len(nodes) != offer.shape.nodes:
                # An apply that converged reports its nodes (Terraform outputs); fewer means the report was
                # not read, and a ledger without them would bill nothing and miss their losses.
                raise KitError(f"the apply of {offer.name} reported {len(nodes)} node(s), not {offer.shape.nodes}",
                               where="terraform output nodes", fix="kit watch applies again (idempotent) and rereads it")
            if len(order) > 1:
                log.info("decision %d: %s has capacity (offer %d of %d)", decision.id, offer.name,
                         order.index(offer) + 1, len(order))
            return self._priced(nodes, offer, market)
        raise CapacityError(f"no {market} capacity in {len(order)} offer(s): {'; '.join(errors)}",
                            where=f"offers on {market}", fix="kit watch retries with backoff")

    def _capacity_event(self, decision: Decision, attempt_id: int, market: str, offer: str, error: str) -> None:
        attempts = self.ledger.decision(decision.id).attempts
        self.ledger.record(Event(kind=CAPACITY_ERROR, instance="*", time=self.clock(), source="watcher",
                                 detail={"market": market, "offer": offer, "decision": decision.id,
                                         "attempt": attempts, "error": error[:2000]},
                                 dedup_key=f"watcher:capacity:{attempt_id}:{offer}"))

    def market_mismatch(self, nodes: list[Node], market: str | None) -> str | None:
        """Why the applied nodes do not run on ``market``, or None. An apply that "succeeded" may
        still have left the instances where they were (a Terraform change the provider planned as
        a no-op), so the ledger, the cost and the deadline safety net must not take the market
        from the request: the nodes' own report (Terraform outputs read the provider's view of
        each instance) and, when the watcher has one, the cloud API (the event source) decide."""
        seen: dict[str, str | None] = {n.instance_id: n.market for n in nodes}
        names = {n.name: n.instance_id for n in nodes}
        if self.source is not None:
            try:
                listed = self.source.poll().instances
            except SourceError as error:  # cannot ask now: the outputs' view stands
                log.warning("could not check the applied market with the cloud API: %s", error)
                listed = []
            for status in listed:
                key = status.instance if status.instance in seen else names.get(status.instance)
                if key is not None and status.market is not None:
                    seen[key] = status.market
        wrong = sorted(f"{instance} ({actual})" for instance, actual in seen.items()
                       if actual is not None and actual != market)
        if not wrong:
            return None
        return (f"applied market {market}, but {len(wrong)} of {len(nodes)} instance(s) still run elsewhere: "
                f"{', '.join(wrong)}; the change did not reach the instances (check the plan for a replacement)")

    def _finish(self, decision: Decision, attempt: Apply, nodes: list[Node]) -> Outcome:
        now = self.clock()
        if decision.action == "release":
            self.ledger.release_nodes(now)
            self.ledger.finish_apply(attempt.id, decision.id, [], None, now)
            return Outcome("done")
        try:
            self.backend.bootstrap(nodes)  # every node: a new master means a new rendezvous for all
        except KitError as error:
            # The nodes exist; only bootstrap failed. Keep the attempt 'applied' so the retry
            # bootstraps again instead of re-applying; give up after a few tries like applies.
            failures = self.ledger.count_bootstrap_failure(decision.id)
            if failures >= MAX_FAILED_ATTEMPTS:
                self.ledger.fail_decision(decision.id, f"bootstrap failed {failures} times: {error}", now)
                return Outcome("failed", error=str(error))
            return self._retry_later(decision, f"bootstrap failed: {error}", attempt=failures)
        self.ledger.finish_apply(attempt.id, decision.id, [n.to_dict() for n in nodes], decision.market_after, now)
        return Outcome("done", nodes=nodes)

    def _failed(self, decision: Decision, attempt_id: int, error: str, *, capacity: bool) -> Outcome:
        if decision.action != "release":
            self._end_replaced()
        now = self.clock()
        attempts = self.ledger.decision(decision.id).attempts
        # Capacity: the market's failures since its last success, not this decision's attempts.
        failures = self.ledger.capacity_failures(decision.market_after) + 1 if capacity else attempts
        next_attempt = now + self.backoff.delay(max(attempts, failures))
        self.ledger.fail_apply(attempt_id, decision.id, error, capacity=capacity, next_attempt=next_attempt, now=now)
        if capacity:  # the capacity search (_launch) recorded one event per offer it tried
            log.warning("decision %d: no capacity on %s (failure %d in a row), retry in %.0f s",
                        decision.id, decision.market_after, failures, next_attempt - now)
            return Outcome("retry", capacity_error=True, error=error)
        failures = sum(1 for a in self.ledger.applies(decision_id=decision.id) if a.status == "failed")
        if failures >= MAX_FAILED_ATTEMPTS:
            self.ledger.fail_decision(decision.id, error, now)
            return Outcome("failed", error=error)
        log.warning("decision %d: apply failed (attempt %d), retry in %.0f s: %s",
                    decision.id, attempts, next_attempt - now, error)
        return Outcome("retry", error=error)

    def _end_replaced(self) -> None:
        """After an apply that failed: the running nodes it destroyed on its way (Terraform replaces an instance
        destroy-first, and a move or market switch replaces them all before the new ones fail to come up) end
        in the ledger now, stopped by kit. Left up, they would be billed on, and the next poll would report
        them lost as if the market had taken them: a preemption to the policy, their zone tried last. What
        still runs is asked of the cloud API when the watcher has it, else of the backend's outputs."""
        up = self.ledger.nodes(("up",))
        if not up:
            return
        try:
            alive = self._alive()
        except (KitError, SourceError) as error:  # cannot tell now: the next poll records what is gone
            log.warning("could not check which nodes the failed apply left running: %s", error)
            return
        now = self.clock()
        for node in up:
            if node.instance_id in alive or node.name in alive:
                continue
            self.ledger.record(Event(kind=INSTANCE_LOST, instance=node.instance_id, time=now, source="watcher",
                                     node_rank=node.rank, dedup_key=loss_key(node.instance_id, node.since),
                                     detail={"state": "replaced", "reason": "destroyed by an apply that failed",
                                             BY_KIT: True}))
            self.ledger.mark_lost(node.instance_id, now, STOPPED_BY_KIT)

    def _alive(self) -> set[str]:
        """Ids and names of the instances that run now."""
        if self.source is None:
            return {n.instance_id for n in self.backend.nodes()}
        return {s.instance for s in self.source.poll().instances if s.state not in GONE_STATES}

    def _retry_later(self, decision: Decision, error: str, *, attempt: int) -> Outcome:
        now = self.clock()
        self.ledger.retry_later(decision.id, now + self.backoff.delay(attempt), error)
        log.warning("decision %d: %s; retrying", decision.id, error)
        return Outcome("retry", error=error)

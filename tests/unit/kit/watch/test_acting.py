"""The acting path with a recording backend: market switch, recovery, capacity backoff, release."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from kit.backends.base import CapacityError
from kit.watch.acting import Actor, Backoff
from kit.watch.events import CAPACITY_ERROR, PREEMPTION
from kit.watch.ledger import Ledger
from kit.watch.status import preemption_counts, status_report
from kit.watch.watcher import Watcher
from tests.support.watch import (
    BackendSource,
    RecordingBackend,
    ScriptedPolicy,
    heartbeat,
    local_spec,
    with_policy,
)


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(tmp_path, answers, *, deployed_market="spot", nodes=2, seed=1):
    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = RecordingBackend(nodes)
    if deployed_market:
        backend.apply(local_spec(market=deployed_market), deployed_market)
        backend.calls.clear()
    spec = local_spec(nodes=nodes, market="spot")
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(seed)), clock=clock)
    policy = ScriptedPolicy(answers)
    watcher = Watcher(spec, ledger, actor, policy, source=BackendSource(backend), interval_s=15, clock=clock)
    watcher.start()
    return watcher, backend, ledger, policy, clock



def make_bootstrap_fail(backend) -> dict:
    """Make the backend's bootstrap raise (an SSH failure) while the returned switch says "on"."""
    from kit.errors import KitError

    real_bootstrap, failing = backend.bootstrap, {"on": True}

    def bootstrap(nodes):
        if failing["on"]:
            raise KitError("ssh: connection refused")
        real_bootstrap(nodes)

    backend.bootstrap = bootstrap
    return failing

def test_market_switch_rerenders_applies_and_bootstraps_every_node(tmp_path):
    watcher, backend, ledger, policy, clock = make(tmp_path, ["on-demand"])
    old = {n.instance_id for n in backend.deployed}
    ledger.record(heartbeat(100, 1000, 2.0))
    result = watcher.tick()

    assert result.action == "switch"
    assert backend.of("apply") == [("apply", "on-demand", "on-demand")]  # spec re-rendered with the new market
    (_, booted, rendezvous), = backend.of("bootstrap")
    assert len(booted) == 2 and not old & set(booted)  # every node replaced and bootstrapped
    assert rendezvous == f"{backend.deployed[0].private_ip}:29500"
    decision = ledger.decisions()[0]
    assert (decision.action, decision.market_before, decision.market_after, decision.status) == \
        ("switch", "spot", "on-demand", "done")
    assert {n.instance_id for n in ledger.nodes(("replaced",))} == old
    assert all(n.market == "on-demand" for n in ledger.nodes(("up",)))
    obs = policy.seen[-1]
    assert obs.market == "spot" and obs.preempted is False and obs.spot_available is True
    assert obs.progress_h == pytest.approx(100 * 2.0 / 3600) and obs.job_h == pytest.approx(1000 * 2.0 / 3600)
    # Nothing more to do on the next tick: the policy still says on-demand and it is running.
    clock.t += 15
    assert watcher.tick().action is None and len(backend.of("apply")) == 1


def test_preemption_without_switch_reapplies_and_moves_the_rendezvous(tmp_path):
    watcher, backend, ledger, policy, clock = make(tmp_path, ["spot"])
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    lost = backend.preempt(0)  # the rendezvous master goes
    survivor = backend.deployed[0].instance_id
    clock.t += 15
    result = watcher.tick()

    assert [e.kind for e in result.new_events] == [PREEMPTION]
    assert result.action == "recover"
    assert backend.of("apply") == [("apply", "spot", "spot")]
    (_, booted, rendezvous), = backend.of("bootstrap")
    assert survivor in booted and lost.instance_id not in booted and len(booted) == 2
    assert rendezvous == f"{backend.deployed[0].private_ip}:29500" != f"{lost.private_ip}:29500"
    obs = policy.seen[-1]
    # As in the simulator, spot counts as unavailable in the tick a spot node was lost (a policy
    # answering spot there still gets a recovery, which is how the watcher finds out).
    assert obs.preempted is True and obs.market is None and obs.spot_available is False
    assert [n.instance_id for n in ledger.nodes(("replaced",))] == [lost.instance_id]
    # The same terminated instance polled again is not a second preemption.
    clock.t += 15
    again = watcher.tick()
    assert again.new_events == [] and policy.seen[-1].preempted is False and len(backend.of("apply")) == 1


def test_a_failed_relaunch_is_not_a_second_preemption_for_the_threshold_policy(tmp_path):
    """The threshold policy counts preemptions (k within a window), in the simulator a spot run lost. The
    watcher counted a spot launch that found no capacity as one more, so one preemption and one failed try
    tripped k = 2: `kit train`'s example ran on-demand after its move (twice the cost of staying on spot)."""
    from kit.policy.market import ThresholdPolicy

    watcher, backend, ledger, _, clock = make(tmp_path, [])
    watcher.policy = ThresholdPolicy(k=2, window_hours=3, cooldown_hours=6)
    ledger.record(heartbeat(10, 1000))
    backend.preempt(1)
    backend.capacity_failures = 1
    decisions = [watcher.tick().decision]  # the loss: a preemption; the recovery finds no capacity
    for _ in range(3):
        clock.t = max(clock.t + 15, ledger.pending_decision().next_attempt if ledger.pending_decision() else 0)
        decisions.append(watcher.tick().decision)
    assert "on-demand" not in decisions and ledger.decision(1).status == "done", decisions
    assert ledger.market() == "spot"


def test_a_gang_lost_over_two_polls_is_one_preemption_for_the_threshold_policy(tmp_path):
    """A cloud reclaims a gang's nodes one by one and a poll can fall between two of them. The watcher counted
    each tick with a loss as a preemption, so one gang loss seen over two ticks tripped threshold's k = 2 and
    `kit train`'s example went on-demand (seen in the suite: 2 nodes lost 11 trace-seconds apart). A node lost
    after the job trained on, or a relaunched node lost again, is a new preemption."""
    from kit.policy.market import ThresholdPolicy

    watcher, backend, ledger, _, clock = make(tmp_path, [])
    watcher.policy = ThresholdPolicy(k=2, window_hours=3, cooldown_hours=6)
    ledger.record(heartbeat(10, 1000, written=1.0))
    watcher.tick()
    backend.preempt(1)
    clock.t += 15
    assert watcher.tick().decision == "wait"  # spot unavailable in the tick of a loss (the simulator's model)
    clock.t += 15
    assert watcher.tick().action == "recover"  # node 1 relaunched; node 0 of the same launch still runs
    backend.preempt(0)
    clock.t += 15
    assert watcher.tick().decision == "wait", "the rest of the same gang loss: no trip to on-demand"
    clock.t += 15
    assert watcher.tick().action == "recover"
    assert [t["observation"]["preempted"] for t in ledger.ticks()] == [False, True, False, False, False]
    report = status_report(ledger, watcher.spec, now=clock.t)  # the report counts nodes and interruptions apart
    assert (report["preemptions"], report["interruptions"]) == (2, 1), report
    ledger.record(heartbeat(12, 1000, written=2.0))  # the job trained past the step it was interrupted at
    backend.preempt(1)
    clock.t += 15
    assert watcher.tick().decision == "on-demand" and ledger.ticks()[-1]["observation"]["preempted"]
    assert preemption_counts(ledger)["interruptions"] == 2


def test_a_relaunched_node_lost_again_is_a_new_preemption(tmp_path):
    from kit.policy.market import ThresholdPolicy

    watcher, backend, ledger, _, clock = make(tmp_path, [])
    watcher.policy = ThresholdPolicy(k=2, window_hours=3, cooldown_hours=6)
    ledger.record(heartbeat(10, 1000, written=1.0))
    watcher.tick()
    backend.preempt(1)
    for _ in range(2):  # the loss, then its recovery
        clock.t += 15
        watcher.tick()
    backend.preempt(1)  # the relaunched node, before the job trained on
    clock.t += 15
    assert watcher.tick().decision == "on-demand"


def test_a_late_report_of_a_counted_loss_is_no_new_preemption(tmp_path):
    """A loss dated before the interruption the policy counted (a GCP preempted operation listed after the
    instance was seen gone) is a second event about that loss, even after the job trained on."""
    from kit.policy.market import ThresholdPolicy
    from kit.watch.events import Event

    watcher, backend, ledger, _, clock = make(tmp_path, [])
    watcher.policy = ThresholdPolicy(k=2, window_hours=3, cooldown_hours=6)
    ledger.record(heartbeat(10, 1000, written=1.0))
    watcher.tick()
    lost = backend.preempt(1)
    lost_at = clock.t + 5
    clock.t += 15
    watcher.tick()
    clock.t += 15
    assert watcher.tick().action == "recover"
    ledger.record(heartbeat(12, 1000, written=2.0))
    ledger.record(Event(kind=PREEMPTION, instance=lost.instance_id, time=lost_at, source="gcp",
                        detail={"reason": "compute.instances.preempted"}, dedup_key="gcp:op:1234"))  # as kit.watch.sources.gcp keys it
    clock.t += 15
    assert watcher.tick().decision == "spot" and not ledger.ticks()[-1]["observation"]["preempted"]


def test_nodes_stopped_on_the_way_out_are_recorded_at_once_and_the_next_tick_still_sees_them(tmp_path):
    """`kit train` interrupted: the local nodes saved and stopped, but the ledger kept them up until the next
    run's first poll, so `kit status` in between charged them on ($6.30 -> $8.35 in 10 s, nothing running)."""
    watcher, backend, ledger, policy, clock = make(tmp_path, ["spot", "spot"])
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    asked = len(policy.seen)
    clock.t += 15
    stopped_at = clock.t
    for rank in (0, 1):
        backend.preempt(rank)  # the source now reports both gone
    clock.t += 5
    watcher.record_losses()
    assert ledger.nodes(("up",)) == [] and len(ledger.nodes(("lost",))) == 2
    assert {n.until for n in ledger.nodes(("lost",))} <= {stopped_at, clock.t}
    assert len(policy.seen) == asked, "recording is not a tick: the policy is not asked"
    clock.t += 15
    watcher.tick()
    assert policy.seen[-1].preempted is True, "the next tick still sees what happened"


def test_capacity_errors_back_off_exponentially_with_jitter_and_show_spot_unavailable(tmp_path):
    watcher, backend, ledger, policy, clock = make(tmp_path, ["spot"])
    ledger.record(heartbeat(10, 1000))
    backend.preempt(1)
    backend.capacity_failures = 2
    start = clock.t
    watcher.tick()  # loss seen, recover attempt 1 fails
    first = ledger.pending_decision()
    assert first.attempts == 1 and 30 * 0.6 <= first.next_attempt - start <= 30 * 1.4
    clock.t = first.next_attempt - 1
    watcher.tick()  # still backing off: no apply
    assert len(backend.of("apply")) == 1
    # as the simulator's tick without capacity: spot unavailable, and not a preemption (none was)
    assert policy.seen[-1].preempted is False and policy.seen[-1].spot_available is False
    clock.t = first.next_attempt
    watcher.tick()  # attempt 2 fails, longer wait
    second = ledger.pending_decision()
    assert second.id == first.id and second.attempts == 2
    assert 48 * 0.6 <= second.next_attempt - clock.t <= 48 * 1.4
    clock.t = second.next_attempt
    watcher.tick()  # attempt 3 succeeds
    assert ledger.pending_decision() is None and ledger.decision(first.id).status == "done"
    assert len(backend.of("apply")) == 3 and len(backend.of("bootstrap")) == 1
    assert len(ledger.events(kinds=(CAPACITY_ERROR,))) == 2
    assert [a.status for a in ledger.applies(decision_id=first.id)] == ["capacity", "capacity", "ok"]


def test_policy_switch_supersedes_a_spot_launch_stuck_on_capacity(tmp_path):
    watcher, backend, ledger, _policy, clock = make(tmp_path, ["spot", "spot", "on-demand"])
    ledger.record(heartbeat(10, 1000))
    backend.preempt(0)
    backend.capacity_failures = 1
    watcher.tick()  # recover on spot fails
    watcher.tick()  # backoff
    clock.t += 1
    watcher.tick()  # policy: on-demand now
    statuses = [d.status for d in reversed(ledger.decisions())]
    assert statuses[-2:] == ["superseded", "done"]
    assert backend.of("apply")[-1] == ("apply", "on-demand", "on-demand")


def test_wait_releases_instances_and_keeps_disks(tmp_path):
    watcher, backend, ledger, _policy, _clock = make(tmp_path, ["wait"])
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    assert backend.of("destroy") == [("destroy", True)]
    assert ledger.market() is None and len(ledger.nodes(("released",))) == 2


def test_backoff_grows_by_1_6_and_is_capped():
    backoff = Backoff(initial_s=30, factor=1.6, cap_s=300, jitter=0.0)
    assert [round(backoff.delay(n), 1) for n in (1, 2, 3, 6, 20)] == [30.0, 48.0, 76.8, 300.0, 300.0]
    jittered = Backoff(jitter=0.4, rng=random.Random(7))
    delays = [jittered.delay(1) for _ in range(200)]
    assert min(delays) >= 18 and max(delays) <= 42 and max(delays) - min(delays) > 10


def test_no_heartbeat_keeps_the_spec_market_and_done_stops(tmp_path):
    watcher, backend, ledger, policy, _clock = make(tmp_path, ["on-demand"])
    watcher.tick()
    assert policy.seen == [] and backend.of("apply") == []  # no job size known: no policy call
    ledger.record(heartbeat(1000, 1000, state="done"))
    assert watcher.tick().done is True


def test_fresh_cluster_is_launched_on_the_spec_market(tmp_path):
    watcher, backend, ledger, _policy, _clock = make(tmp_path, ["spot"], deployed_market=None)
    watcher.tick()
    assert backend.of("apply") == [("apply", "spot", "spot")] and len(ledger.nodes(("up",))) == 2


def test_bad_policy_answer_is_an_error(tmp_path):
    watcher, *_, ledger, _policy, _clock = make(tmp_path, ["maybe"])
    ledger.record(heartbeat(1, 10))
    with pytest.raises(ValueError, match="maybe"):
        watcher.tick()


def test_restart_replays_recorded_ticks_into_a_fresh_policy(tmp_path):
    watcher, backend, ledger, policy, clock = make(tmp_path, ["spot"])
    ledger.record(heartbeat(10, 1000))
    for _ in range(3):
        watcher.tick()
        clock.t += 15
    backend.preempt(0)
    watcher.tick()
    fresh = ScriptedPolicy(["spot"])
    again = Watcher(watcher.spec, ledger, watcher.actor, fresh, source=BackendSource(backend), clock=clock)
    again.start()
    assert fresh.seen == policy.seen  # same observations, same order: history rebuilt
    assert [o.preempted for o in fresh.seen] == [False, False, False, True]


def test_bootstrap_failure_retries_bootstrap_only_then_gives_up(tmp_path):
    from kit.errors import KitError

    watcher, backend, ledger, _policy, clock = make(tmp_path, ["on-demand"])
    ledger.record(heartbeat(10, 1000))
    failures = []

    def failing_bootstrap(nodes):
        failures.append(len(nodes))
        raise KitError("ssh: connection refused")

    backend.bootstrap = failing_bootstrap
    outcomes = []
    for _ in range(5):
        result = watcher.tick()
        outcomes.append(result.outcome.status if result.outcome else None)
        clock.t += 400  # past any backoff
    assert len(backend.of("apply")) == 1  # applied once; only bootstrap was retried
    assert failures == [2] * 5 and outcomes == ["retry"] * 4 + ["failed"]
    assert ledger.decisions()[0].status == "failed" and "bootstrap failed 5 times" in ledger.decisions()[0].error


# ---------------------------------------------------------------------------------------------
# Review findings: each test failed before its fix.


class SameIdBackend(RecordingBackend):
    """A GCP spot cluster with termination action STOP: a preempted VM keeps its id and the next
    apply restarts it (desired_status = RUNNING)."""

    def __init__(self, nodes=2):
        super().__init__(nodes)
        self.stopped: set[str] = set()

    def apply(self, spec, market):
        self.calls.append(("apply", market, spec.market))
        if not self.deployed:
            self.deployed = [self._new(r, market) for r in range(self.size)]
        self.stopped.clear()  # restarted, same instance ids
        return list(self.deployed)


class StoppedSource(BackendSource):
    name = "gcp"

    def poll(self):
        from kit.watch.sources.base import RUNNING, STOPPED, InstanceStatus, Poll

        return Poll([InstanceStatus(n.instance_id, STOPPED if n.instance_id in self.backend.stopped else RUNNING,
                                    n.market, preempted=n.instance_id in self.backend.stopped)
                     for n in self.backend.deployed])


def test_an_instance_id_that_comes_back_is_up_again_and_can_be_lost_again(tmp_path):
    """Finding 1: a lost node whose id came back stayed `lost` forever (recover on every tick) and
    its second preemption was deduplicated away."""
    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = SameIdBackend(2)
    backend.apply(local_spec(), "spot")
    backend.calls.clear()
    spec = local_spec()
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, clock=clock), ScriptedPolicy(["spot"]),
                      source=StoppedSource(backend), clock=clock)
    watcher.start()
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    vm = backend.deployed[1].instance_id
    backend.stopped.add(vm)  # preempted
    actions = []
    for _ in range(5):
        clock.t += 15
        result = watcher.tick()
        actions.append((result.action, result.nodes_up, result.nodes_lost))
    # recovered once (the restart brings the same id back), then quiet
    assert [a for a, *_ in actions] == ["recover", None, None, None, None], actions
    assert actions[-1][1:] == (2, 0) and len(backend.of("apply")) == 1
    assert [(n.instance_id, n.state) for n in ledger.nodes()] == [(backend.deployed[0].instance_id, "up"), (vm, "up")]
    clock.t += 3600
    backend.stopped.add(vm)  # the same VM preempted again
    result = watcher.tick()
    assert [e.kind for e in result.new_events] == [PREEMPTION], "a second preemption of the same VM is a new one"
    assert result.action == "recover" and len(backend.of("apply")) == 2
    report = status_report(ledger, spec, now=clock.t)
    assert (report["preemptions"], report["nodes_lost"]) == (2, 2)
    runs = [n for n in ledger.all_nodes() if n.instance_id == vm]
    assert [n.state for n in runs] == ["replaced", "replaced", "up"]
    # cost: the stopped time between loss and restart is not billed, the runs before are
    assert runs[0].until == pytest.approx(runs[1].since) and runs[1].until == pytest.approx(runs[2].since)


@pytest.mark.parametrize("name", ["greedy", "spot", "up"])
def test_capacity_backoff_grows_across_decisions_with_a_real_policy(tmp_path, name):
    """Finding 3: a real policy answers wait (or on-demand) while spot is blocked, so every spot
    retry was a new decision with attempt 1: a spot request every ~30 s forever."""
    from kit.policy import make_policy

    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = RecordingBackend(2)
    backend.apply(local_spec(), "spot")
    backend.calls.clear()
    spec = local_spec()
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1), jitter=0.0), clock=clock)
    watcher = Watcher(spec, ledger, actor, make_policy(name), source=BackendSource(backend), interval_s=15,
                      clock=clock)
    watcher.start()
    ledger.record(heartbeat(10, 100_000, 1.0))
    backend.preempt(1)
    backend.capacity_failures = 10**6  # spot never available
    attempts = []
    for _ in range(400):  # 100 minutes of 15 s ticks
        before = len(backend.of("apply"))
        watcher.tick()
        if len(backend.of("apply")) != before:
            attempts.append(clock.t)
        clock.t += 15
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 30 and all(b >= a for a, b in itertools.pairwise(gaps)), gaps
    assert gaps[4] >= 180 and max(gaps) >= 300, gaps  # 30, 48, 77, 123, 197, then the 5 min cap
    assert len(attempts) <= 25, f"{len(attempts)} spot applies in 100 minutes"
    assert all(c[1] == "spot" for c in backend.of("apply"))
    assert ledger.capacity_failures("spot") == len(attempts)
    backend.capacity_failures = 0  # capacity is back: the next attempt works, the count starts over
    for _ in range(30):
        watcher.tick()
        clock.t += 15
    assert ledger.capacity_failures("spot") == 0 and len(ledger.nodes(("up",))) == 2


def test_bootstrap_failure_after_apply_leaves_no_stale_ledger(tmp_path):
    """Finding 4: after an apply whose bootstrap failed, the ledger still described the old
    nodes: spurious losses, a switch counted as a recovery, and a restart that finished the
    superseded decision by bootstrapping deleted nodes."""

    watcher, backend, ledger, _policy, clock = make(tmp_path, ["on-demand", "spot"])
    ledger.record(heartbeat(10, 1000))
    failing = make_bootstrap_fail(backend)
    result = watcher.tick()  # switch to on-demand: applied, bootstrap fails
    assert (result.action, result.outcome.status) == ("switch", "retry")
    assert ledger.market() == "on-demand", "the cloud runs on-demand now"
    assert {n.instance_id for n in ledger.nodes(("up",))} == {n.instance_id for n in backend.deployed}
    failing["on"] = False
    clock.t += 400
    result = watcher.tick()  # the policy wants spot back
    assert result.new_events == [] and result.action == "switch", "no spurious losses of the replaced nodes"
    assert result.outcome.status == "done" and ledger.market() == "spot"
    report = status_report(ledger, watcher.spec, now=clock.t)
    assert (report["market_switches"], report["nodes_lost"], report["preemptions"]) == (2, 0, 0)
    assert [a.status for a in ledger.applies()] == ["ok", "interrupted", "ok"]  # adopted launch, switch, switch

    calls = len(backend.calls)
    again = Watcher(watcher.spec, ledger, Actor(backend, ledger, watcher.spec, clock=clock), ScriptedPolicy(["spot"]),
                    source=BackendSource(backend), clock=clock)
    again.start()  # a restart must not finish the superseded switch
    assert backend.calls[calls:] == [] and ledger.market() == "spot"
    assert [(d.action, d.status) for d in ledger.decisions()] == [("switch", "done"), ("switch", "superseded"),
                                                                  ("launch", "done")]


def test_restart_does_not_finish_an_applied_attempt_of_a_superseded_decision(tmp_path):
    """Finding 4, restart side: an `applied` attempt whose decision is no longer pending (a ledger
    written before the fix, or a crash between the two writes) is closed, not bootstrapped."""
    watcher, backend, ledger, _policy, clock = make(tmp_path, ["spot"])
    old = ledger.begin_decision(policy="x", decision="on-demand", action="switch", market_before="spot",
                                market_after="on-demand", reason="test", now=clock.t)
    attempt = ledger.start_apply(old, "on-demand", clock.t)
    with ledger.transaction() as db:  # applied, then superseded without closing the attempt (old kit)
        db.execute("UPDATE applies SET status = 'applied', nodes = '[]' WHERE id = ?", (attempt,))
        db.execute("UPDATE decisions SET status = 'superseded' WHERE id = ?", (old,))
    Watcher(watcher.spec, ledger, Actor(backend, ledger, watcher.spec, clock=clock), ScriptedPolicy(["spot"]),
            source=BackendSource(backend), clock=clock).start()
    assert backend.of("bootstrap") == [] and ledger.decision(old).status == "superseded"
    assert ledger.applies(decision_id=old)[0].status == "interrupted" and ledger.market() != "on-demand"


def test_recover_whose_bootstrap_failed_is_bootstrapped_again(tmp_path):
    """With the node table updated at apply time nothing looks lost any more after a recovery
    whose bootstrap failed; the pending decision must still get its bootstrap."""

    watcher, backend, ledger, _policy, clock = make(tmp_path, ["spot"])
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    backend.preempt(0)
    failing = make_bootstrap_fail(backend)
    clock.t += 15
    assert watcher.tick().outcome.status == "retry"  # recovered, bootstrap failed
    failing["on"] = False
    clock.t += 400
    result = watcher.tick()
    assert (result.action, result.outcome.status) == ("recover", "done") and len(backend.of("apply")) == 1
    assert len(backend.of("bootstrap")) == 1 and ledger.pending_decision() is None


def test_default_policy_sees_spot_unavailable_in_the_tick_of_a_spot_loss(tmp_path):
    """Finding 8: `default` learns spot run lengths from spot_available going false, which in the
    watcher happened only during a capacity backoff: a preemption now ends a run, as in the
    simulator. A `wait` in that tick keeps the survivors (the next tick recovers)."""
    from kit.policy import make_policy

    class Recording:
        def __init__(self, policy):
            self.policy, self.seen, self.name = policy, [], policy.name

        def decide(self, obs):
            self.seen.append(obs)
            return self.policy.decide(obs)

    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = RecordingBackend(2)
    backend.apply(local_spec(), "spot")
    backend.calls.clear()
    spec = local_spec(policy={"name": "default", "deadline_hours": 200.0})
    policy = Recording(make_policy("default"))
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, clock=clock), policy,
                      source=BackendSource(backend), clock=clock)
    watcher.start()
    ledger.record(heartbeat(10, 100_000, 1.0))
    actions = []
    for i in range(6):
        if i == 2:
            backend.preempt(1)
        actions.append(watcher.tick().action)
        clock.t += 15
    assert [o.spot_available for o in policy.seen] == [True, True, False, True, True, True]
    assert [o.preempted for o in policy.seen] == [False, False, True, False, False, False]
    assert actions[2] is None and actions[3] == "recover", actions
    assert backend.of("destroy") == [] and len(ledger.nodes(("up",))) == 2


def test_safety_net_margin_covers_a_slow_apply(tmp_path):
    """Finding 7: the safety net kept one 15 s tick of margin while one apply + bootstrap can take
    many minutes, during which the loop decides nothing."""
    from kit.policy import make_policy

    clock = Clock()

    class SlowBackend(RecordingBackend):
        def apply(self, spec, market):
            clock.t += 20 * 60  # terraform + boot
            return super().apply(spec, market)

    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = SlowBackend(2)
    RecordingBackend.apply(backend, local_spec(), "spot")
    backend.calls.clear()
    start = clock.t
    spec = local_spec(policy={"name": "greedy", "deadline_hours": 1000.0})
    policy = make_policy("greedy")
    watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, clock=clock), policy,
                      source=BackendSource(backend), interval_s=15, clock=clock)
    watcher.start()
    ledger.record(heartbeat(10, 1000, 1.0))
    watcher.tick()
    backend.preempt(1)
    for _ in range(3):
        clock.t += 15
        if watcher.tick().action == "recover":  # takes 20 minutes
            break
    assert len(backend.of("apply")) == 1
    clock.t += 15
    # the deadline leaves 0.1 h of slack now: more than one 15 s interval, less than one apply
    deadline = (clock.t - start) / 3600 + (990 * 1.0 / 3600 + 0.2) + 0.1
    watcher.spec = with_policy(spec, name="greedy", deadline_hours=deadline)
    result = watcher.tick()
    assert ledger.ticks()[-1]["observation"]["tick_h"] == pytest.approx(20 * 60 / 3600, rel=0.01)
    # the spec's prices reach the policy (default weighs spot against on-demand with them)
    assert (ledger.ticks()[-1]["observation"]["spot_price"],
            ledger.ticks()[-1]["observation"]["on_demand_price"]) == (1.0, 4.0)
    assert result.decision == "on-demand" and result.action == "switch", \
        "0.1 h of slack is less than one 20-minute apply: the net must fire now"


class NoOpSwitchBackend(RecordingBackend):
    """terraform-provider-aws's no-op: removing instance_market_options plans no change, so a
    switch to on-demand leaves every instance on spot. ``claims`` is what the Terraform outputs
    said: the requested market (the old ``market = var.market``) or the real one."""

    def __init__(self, nodes: int, claims: str):
        super().__init__(nodes)
        self.claims = claims

    def apply(self, spec, market: str):
        if market == "on-demand" and self.deployed:
            self.calls.append(("apply", market, spec.market))
            reported = market if self.claims == "requested" else "spot"
            return [dataclasses.replace(n, market=reported) for n in self.deployed]
        return super().apply(spec, market)


@pytest.mark.parametrize("claims", ["requested", "real"])
def test_a_switch_the_instances_did_not_follow_is_a_failed_apply(tmp_path, claims):
    """After every apply the real market is checked (the cloud API through the event source, and
    the outputs): a mismatch is a failed apply, never a switch recorded as done."""
    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    backend = NoOpSwitchBackend(2, claims)
    backend.apply(local_spec(market="spot"), "spot")
    source = BackendSource(backend)  # the cloud: the instances as they really are (spot)
    spec = local_spec(nodes=2, market="spot")
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock, source=source)
    watcher = Watcher(spec, ledger, actor, ScriptedPolicy(["spot", "on-demand"]), source=source, interval_s=15,
                      clock=clock)
    watcher.start()
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    clock.t += 15
    result = watcher.tick()
    assert result.action == "switch" and result.outcome.status == "retry", result
    assert "still run elsewhere" in result.outcome.error and "(spot)" in result.outcome.error
    decision = max(ledger.decisions(), key=lambda d: d.id)
    assert decision.status == "pending" and decision.market_after == "on-demand"
    assert ledger.applies(decision_id=decision.id)[-1].status == "failed"
    assert all(n.market == "spot" for n in ledger.nodes(("up",))), "the ledger keeps the real market"
    assert status_report(ledger, spec, now=clock())["market"] == "spot"


class ZonedBackend(RecordingBackend):
    """A recording backend whose zones in ``full`` have no spot capacity; its nodes follow the spec's
    zone and shape (nodes x processes)."""

    def __init__(self, full: set[str]):
        super().__init__(2)
        self.full = full
        self.zones_tried: list[tuple[str, int]] = []

    def apply(self, spec, market):
        self.zones_tried.append((spec.start_zone, spec.nodes))
        if market == "spot" and spec.start_zone in self.full:
            raise CapacityError(f"no spot capacity in {spec.start_zone}")
        self.size, self.spec = spec.nodes, spec
        if any(n.zone != spec.start_zone for n in self.deployed):
            self.deployed = []  # another zone: every node is new
        nodes = super().apply(spec, market)
        self.deployed = [dataclasses.replace(n, zone=spec.start_zone) for n in nodes]
        return list(self.deployed)

    def disk_set(self, zone, shape):
        return zone

    def release_disks(self, name):
        self.calls.append(("release_disks", name))


def test_nodes_kit_stopped_itself_are_recovered_where_they_ran_and_are_no_news_about_the_market(tmp_path):
    """An interrupted local run: kit stopped its nodes (they cannot outlive it). Continued, the watcher took
    that for a preemption of their zone: the policy saw one (threshold counts them), and the search tried
    that zone last, so a Ctrl-C moved the job out of a zone with capacity (to a 1-node shape elsewhere)."""
    from kit.spec import parse_spec

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b", "c"], "market": "spot", "nodes": 2,
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0}, "policy": {}})
    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), ZonedBackend(full=set())
    policy = ScriptedPolicy(["spot"])
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    watcher = Watcher(spec, ledger, actor, policy, source=BackendSource(backend), interval_s=15, clock=clock)
    watcher.start()
    watcher.tick()
    ledger.record(heartbeat(10, 1000, written=clock.t))
    for rank in (0, 1):
        backend.stop_by_kit(rank)
    watcher.record_losses()  # on the way out
    assert {n.lost_kind for n in ledger.nodes(("lost",))} == {"stopped-by-kit"}
    backend.zones_tried.clear()
    clock.t += 15
    result = watcher.tick()  # the continued run's first tick
    assert result.action == "recover" and result.outcome.status == "done"
    assert policy.seen[-1].preempted is False and policy.seen[-1].spot_available is True
    assert backend.zones_tried == [("a", 2)], "relaunched where it ran, not moved away"
    assert preemption_counts(ledger)["nodes_lost"] == 0 and preemption_counts(ledger)["preemptions"] == 0


def test_a_preempted_zone_is_left_for_the_next_zone_with_capacity_in_the_search_order(tmp_path):
    """Zone a preempts and has no spot left; c has none either; b has: the recover tries the zones in
    the search order (a last), records one capacity error per offer without capacity, lands in b, and
    the ledger says where the job runs, with each node's shape and price; zone a's disks are deleted
    once they were left ``disk.keep_left_hours`` ago and a checkpoint as new as theirs is in b."""
    from kit.clouds.local import LocalSpec
    from kit.spec import parse_spec
    from kit.watch.status import placement_changes

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b", "c"], "market": "spot",
                       "shapes": [{"nodes": 2, "gpus_per_node": 1}, {"nodes": 1, "gpus_per_node": 2}],
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0}, "policy": {},
                       "disk": {"keep_left_hours": 2}})
    assert isinstance(spec, LocalSpec)
    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), ZonedBackend(full=set())
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    watcher = Watcher(spec, ledger, actor, ScriptedPolicy(["spot"]), source=BackendSource(backend), interval_s=15,
                      clock=clock)
    watcher.start()
    watcher.tick()  # the launch: a, the first zone, the first shape
    assert ledger.applied_offer() == "a/2xlocal/spot" and {n.zone for n in ledger.nodes(("up",))} == {"a"}
    ledger.record(heartbeat(10, 1000, written=clock.t))
    backend.full = {"a", "c"}
    backend.preempt(1)
    backend.zones_tried.clear()
    clock.t += 15
    result = watcher.tick()
    assert result.action == "recover" and result.outcome.status == "done"
    tried = [zone for zone, _ in backend.zones_tried]
    assert tried[-1] == "b" and "a" not in tried, tried  # a (preempting) would have come last
    failed = [e["detail"]["offer"] for e in ledger.events(kinds=(CAPACITY_ERROR,))]
    assert failed == [f"c/{s}/spot" for s in ("2xlocal", "1xlocal")][: len(tried) - 1]
    assert ledger.applied_offer() == "b/2xlocal/spot"
    up = ledger.nodes(("up",))
    assert {(n.zone, n.shape, n.price) for n in up} == {("b", "2xlocal", 1.0)} and len(up) == 2
    assert placement_changes(ledger) == {"offers": ["a/2xlocal/spot", "b/2xlocal/spot"], "moves": 1,
                                         "shape_switches": 0, "egress_per_checkpoint_gb": 0.08,  # other regions
                                         "probes": 2 + len(failed), "probes_without_capacity": len(failed)}
    # a spec's flat egress rate (policy.egress_per_gb) prices the same move
    flat = parse_spec({**spec.model_dump(exclude_unset=True), "policy": {"egress_per_gb": 0.01}})
    assert placement_changes(ledger, flat.policy.moves())["egress_per_checkpoint_gb"] == 0.01
    assert status_report(ledger, flat, now=clock.t)["egress_per_checkpoint_gb"] == 0.01
    _zone_a_disks_go_once_left_long_enough(watcher, ledger, backend, spec, clock)
    # a restarted watcher's backend runs what was applied last
    fresh = ZonedBackend(full=set())
    Actor(fresh, ledger, spec, clock=clock).resume()
    assert fresh.spec.start_zone == "b" and fresh.spec.nodes == 2


def test_zones_priced_apart_rank_the_search_and_each_node_costs_its_zones_price(tmp_path):
    """``prices.zones``: spot in b costs half of c's (as regions and zones are priced by the clouds). With
    ``default`` and no run seen anywhere, the recovery from a preempted a tries b before c, b's nodes are
    recorded at b's price, the cost follows it, and the policy weighs b's spot against b's on-demand."""
    from types import SimpleNamespace

    from kit.spec import parse_spec

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b", "c"], "market": "spot", "nodes": 2,
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0,
                                  "zones": {"b": {"spot_per_hour": 0.5, "on_demand_per_hour": 3.0}}},
                       "policy": {"name": "default"}})
    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), ZonedBackend(full=set())
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    policy = ScriptedPolicy(["spot"])
    watcher = Watcher(spec, ledger, actor, policy, source=BackendSource(backend), interval_s=15, clock=clock)
    watcher.start()
    watcher.tick()  # the launch: a, the spec's own zone
    assert {(n.zone, n.price) for n in ledger.nodes(("up",))} == {("a", 1.0)}
    ledger.record(heartbeat(10, 1000, written=clock.t))
    assert [o.zone for o in actor.search(SimpleNamespace(action="recover", id=1), "spot")][:2] == ["a", "b"]  # a runs: kept first
    backend.preempt(1)
    clock.t += 15
    assert watcher.tick().action == "recover"
    assert ledger.applied_offer() == "b/2xlocal/spot"
    assert {(n.zone, n.price) for n in ledger.nodes(("up",))} == {("b", 0.5)}
    since = clock.t
    clock.t += 3600
    ledger.record(heartbeat(20, 1000, written=clock.t))
    watcher.tick()
    assert (policy.seen[-1].spot_price, policy.seen[-1].on_demand_price) == (0.5, 3.0)
    a_cost = sum((n.until - n.since) / 3600 * 1.0 for n in ledger.all_nodes() if n.zone == "a")
    assert status_report(ledger, spec, now=clock.t)["cost"] == pytest.approx(a_cost + 2 * 0.5 * (clock.t - since) / 3600,
                                                                      abs=1e-4)  # reported to 4 places


def test_a_job_on_a_dear_spot_offer_tries_to_move_once_staying_has_cost_what_a_failed_try_costs(tmp_path):
    """Spot in a costs 3 $/h a node, in b and c 1 (``prices.zones``). The simulated ``default`` on spot looks at
    the cheaper offers every tick for free and moves when one is up; the watcher can look only by launching there,
    and a try that finds none has replaced the running nodes (relaunched in a, one changeover at a's price). So it
    tries once the extra paid since the run began equals that: 0.2 h x 3 $/h over (3 - 1.05) $/h per hour (b's
    progress price with the prior run), 0.31 h. The first try finds b and c full and relaunches in a; the next comes
    one break-even later and lands in b, where the job stays (c is not cheaper than b)."""
    from kit.policy.market import DefaultPolicy
    from kit.spec import parse_spec
    from training.contract import SPOT

    class SpotDefault(DefaultPolicy):  # the multi-zone market policy, answering spot
        def decide(self, obs):
            self.seen = obs
            return SPOT

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b", "c"], "market": "spot", "nodes": 2,
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0, "zones": {"a": {"spot_per_hour": 3.0}}},
                       "policy": {"name": "default", "changeover_hours": 0.2, "egress_per_gb": 0,
                                  "checkpoint_gb": 0.001}})  # no egress, no transfer: the changeover alone
    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), ZonedBackend(full={"b", "c"})
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    watcher = Watcher(spec, ledger, actor, SpotDefault(), source=BackendSource(backend), interval_s=15, clock=clock)
    watcher.start()
    watcher.tick()
    assert ledger.applied_offer() == "a/2xlocal/spot"
    started = clock.t
    # b's mean run: the 4-h prior, pooled with a's run so far (0.3 h): progress there costs 1 x e^(0.2 / 4.3)
    break_even = 0.2 * 3.0 / (3.0 - 1.0 * math.exp(0.2 / 4.3)) * 3600

    def tick_at(t: float):
        clock.t = t
        ledger.record(heartbeat(10, 1000, written=clock.t))
        backend.zones_tried.clear()
        return watcher.tick()

    assert tick_at(started + break_even - 20).action is None, "not yet: staying has cost less than a failed try"
    result = tick_at(started + break_even + 20)
    assert result.action == "move" and result.outcome.status == "done"
    assert sorted(z for z, _ in backend.zones_tried[:2]) == ["b", "c"] and backend.zones_tried[2:] == [("a", 2)]
    assert ledger.applied_offer() == "a/2xlocal/spot", "relaunched where it ran"
    assert ledger.last_decision("move").reason.startswith("try to move: ")
    retried = clock.t
    assert tick_at(retried + 60).action is None, "the next try waits for another break-even"
    backend.full = {"c"}
    assert tick_at(retried + break_even + 20).action == "move"
    assert ledger.applied_offer() == "b/2xlocal/spot"
    assert {(n.zone, n.price) for n in ledger.nodes(("up",))} == {("b", 1.0)}
    assert tick_at(clock.t + 10 * break_even).action is None, "c is no cheaper than b: the job stays"


def test_on_demand_a_job_that_may_move_tries_spot_again_once_staying_has_cost_what_a_failed_try_costs(tmp_path):
    """On on-demand (4 $/h a node, spot 1), a try of spot replaces the on-demand nodes first (one cluster root), so
    one that finds no capacity costs a changeover at the on-demand price. The watcher tells its market policy spot
    is available only once the extra paid on on-demand, since its nodes came up or its last try found none,
    reaches that: 0.2 h x 4 $/h over (4 - 1.05) $/h, 0.27 h."""
    from kit.policy.market import DefaultPolicy
    from kit.spec import parse_spec
    from training.contract import ON_DEMAND, SPOT

    seen: list[bool] = []  # outside the policy: a failed try restores the policy's state (Watcher._ask_again)

    class SpotWhenSeen(DefaultPolicy):  # the multi-zone market policy: spot whenever it is said to be there
        def decide(self, obs):
            seen.append(obs.spot_available)
            return SPOT if obs.spot_available else ON_DEMAND

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b"], "market": "on-demand", "nodes": 2,
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0},
                       "policy": {"name": "default", "changeover_hours": 0.2, "egress_per_gb": 0,
                                  "checkpoint_gb": 0.001}})
    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), ZonedBackend(full={"a", "b"})
    policy = SpotWhenSeen()
    actor = Actor(backend, ledger, spec, backoff=Backoff(initial_s=1.0, cap_s=1.0, jitter=0.0), clock=clock)
    watcher = Watcher(spec, ledger, actor, policy, source=BackendSource(backend), interval_s=15, clock=clock)
    watcher.start()
    watcher.tick()
    assert ledger.market() == ON_DEMAND
    started = clock.t
    break_even = 0.2 * 4.0 / (4.0 - 1.0 * math.exp(0.2 / 4.0)) * 3600

    def tick_at(t: float):
        clock.t = t
        ledger.record(heartbeat(10, 1000, written=clock.t))
        return watcher.tick()

    tick_at(started + 60)  # the first heartbeat: the policy decides from here on
    tick_at(started + break_even - 60)
    assert seen == [False, False], "not yet: on-demand has cost less than a failed try"
    result = tick_at(started + break_even + 60)
    assert seen[2:] == [True, False] and result.outcome is not None and result.outcome.capacity_error, (seen, result)
    assert ledger.market() == ON_DEMAND and {z for z, _ in backend.zones_tried[-2:]} == {"a", "b"}
    failed = clock.t
    tick_at(failed + break_even - 60)
    assert seen[-1] is False, "the next try waits a break-even after the last one found none"
    tick_at(failed + break_even + 60)
    assert seen[-2:] == [True, False]


def _zone_a_disks_go_once_left_long_enough(watcher, ledger, backend, spec, clock):
    """After the move from a to b: every disk the job used, per zone (zone a's sit idle since the move;
    local disks cost nothing), and a's go once left ``disk.keep_left_hours`` ago with b holding their step."""
    clock.t += 3600
    disks = status_report(ledger, spec, now=clock.t)
    assert [(d["zone"], d["disk_id"]) for d in disks["disks"]] == [("a", "disk-0"), ("a", "disk-1"), ("b", "disk-0"),
                                                                   ("b", "disk-1")]
    idle = {(d["zone"], d["disk_id"]): d["idle_hours"] for d in disks["disks"]}
    assert idle[("b", "disk-0")] == 0 and idle[("a", "disk-0")] == pytest.approx(1.0)  # a's node-0 left at the move
    assert disks["disk_cost"] == 0.0
    ledger.record(heartbeat(12, 1000, written=clock.t, checkpoint_step=10))  # b holds step 10 too (from the bucket)
    watcher.tick()
    assert ("release_disks", "a") not in backend.calls, "left 1 h ago: kept"
    clock.t += 3600
    watcher.tick()
    assert backend.calls.count(("release_disks", "a")) == 1 and ("release_disks", "b") not in backend.calls
    gone = {d["disk_id"]: d["released"] for d in status_report(ledger, spec, now=clock.t + 3600)["disks"] if d["zone"] == "a"}
    assert set(gone) == {"disk-0", "disk-1"} and all(t is not None for t in gone.values())


def test_only_the_other_shape_fits_a_shape_switch_keeps_the_gpus(tmp_path):
    from kit.spec import parse_spec

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a"], "market": "spot",
                       "shapes": [{"nodes": 2, "gpus_per_node": 1}, {"nodes": 1, "gpus_per_node": 2}],
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0}, "policy": {}})

    class OneNode(ZonedBackend):
        def apply(self, spec, market):
            if spec.nodes > 1:
                self.zones_tried.append((spec.start_zone, spec.nodes))
                raise CapacityError("room for one node only")
            return super().apply(spec, market)

    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), OneNode(full=set())
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    watcher = Watcher(spec, ledger, actor, ScriptedPolicy(["spot"]), source=BackendSource(backend), clock=clock)
    watcher.start()
    watcher.tick()
    assert ledger.applied_offer() == "a/1xlocal/spot"
    (node,) = ledger.nodes(("up",))
    assert (node.shape, node.price) == ("1xlocal", 2.0)  # one node of 2 processes costs 2 of 1
    assert backend.spec.nodes == 1 and backend.spec.gpus_per_node == 2


def spot_applied(ledger: Ledger, nodes: list[dict], now: float, offer: str | None = None) -> None:
    """A spot apply of ``nodes`` that succeeded at ``now`` (on ``offer``, when named), as the actor records one."""
    decision = ledger.begin_decision(policy="default", decision="spot", action="recover", market_before="spot",
                                     market_after="spot", reason="test", now=now)
    attempt = ledger.start_apply(decision, "spot", now)
    ledger.mark_applied(attempt, nodes, market="spot", now=now)
    if offer is not None:
        ledger.set_apply_offer(attempt, offer)
    ledger.finish_apply(attempt, decision, nodes, "spot", now)


def spot_run(ledger: Ledger, zone: str, start: float, end: float, first: int) -> None:
    """A spot run of two nodes in ``zone`` from ``start`` to ``end`` (clock seconds), ended by a preemption."""
    nodes = [{"instance_id": f"i-{first + r}", "name": f"node-{r}", "rank": r, "market": "spot", "zone": zone,
              "disk_id": f"{zone}-{r}", "shape": "2xlocal"} for r in range(2)]
    spot_applied(ledger, nodes, start)
    for n in nodes:
        ledger.mark_lost(n["instance_id"], end, "preemption")


def moving_spec(zones: list[str], **policy):
    """A local job of 2 nodes that may move between ``zones``, with ``default`` and a 0.2-h changeover."""
    return local_spec(zones=zones, policy={"name": "default", "changeover_hours": 0.2, **policy})


def short_runs_in_a_and_b(tmp_path) -> tuple[Clock, Ledger]:
    """A ledger whose latest RUN_WINDOW spot runs in zones a and b each lasted 3 minutes, all preempted."""
    from kit.policy.zones import RUN_WINDOW

    clock, ledger = Clock(), Ledger(tmp_path / "ledger.sqlite")
    t = clock.t - 10 * 3600.0
    for k in range(RUN_WINDOW):
        for i, zone in enumerate(("a", "b")):
            spot_run(ledger, zone, t, t + 180.0, 100 * k + 10 * i)
            t += 600.0
    return clock, ledger


def test_with_the_default_policy_the_capacity_search_ranks_zones_by_the_jobs_runs_there(tmp_path):
    """The job ran 12 minutes in c, 20 hours in b and 5 in a, each run ended by a preemption; a
    preempted now: with ``default`` the recovery tries b, then c, then a, whatever the shuffle;
    with another policy the zones other than a keep failover's shuffled order."""
    from types import SimpleNamespace

    def spec_with(policy: str):
        return local_spec(zones=["a", "b", "c"], policy={"name": policy})

    ledger, t0, hour = Ledger(tmp_path / "ledger.sqlite"), 1_000_000.0, 3600.0

    def run(zone: str, start_h: float, end_h: float, first: int) -> None:
        spot_run(ledger, zone, t0 + start_h * hour, t0 + end_h * hour, first)

    run("c", 0.0, 0.2, 0)
    run("b", 0.3, 20.3, 10)
    run("a", 20.4, 25.4, 20)
    clock = Clock(t0 + 25.5 * hour)
    learning = Actor(RecordingBackend(), ledger, spec_with("default"), clock=clock)
    hours, losses = learning.spot_runs()
    assert {o.zone: (round(h, 3), losses[o]) for o, h in hours.items()} == {"a": (5.0, 1), "b": (20.0, 1), "c": (0.2, 1)}
    for k in range(10):
        order = learning.search(SimpleNamespace(action="recover", id=k), "spot")
        assert [o.zone for o in order] == ["b", "c", "a"], order
    other = Actor(RecordingBackend(), ledger, spec_with("threshold"), clock=clock)
    orders = {tuple(o.zone for o in other.search(SimpleNamespace(action="recover", id=k), "spot")) for k in range(20)}
    assert orders == {("b", "c", "a"), ("c", "b", "a")}, "failover: shuffled, the preempting zone last"

    # b's 20-h run was before its latest RUN_WINDOW runs (each 6 minutes): the ranking forgets it
    from kit.policy.zones import RUN_WINDOW

    for k in range(RUN_WINDOW):
        run("b", 26.0 + k, 26.1 + k, 100 + 10 * k)
    later = Actor(RecordingBackend(), ledger, spec_with("default"), clock=Clock(t0 + 40 * hour))
    hours, losses = later.spot_runs()
    assert {o.zone: (round(h, 3), losses[o]) for o, h in hours.items()} == {
        "a": (5.0, 1), "b": (round(0.1 * RUN_WINDOW, 3), RUN_WINDOW), "c": (0.2, 1)}


def test_a_job_that_may_move_sees_no_spot_while_no_spot_offer_is_worth_its_price(tmp_path):
    """Every spot run in zones a and b lasted 3 minutes (the latest RUN_WINDOW of each, all preempted), with a
    changeover of 0.2 h: an hour of progress there costs more than an hour on-demand, so the simulator's
    multi-zone ``default`` ranks neither (its ceiling). The watcher's policy sees spot unavailable and a spot
    launch tries no offer (a capacity error that says why); a spot run that holds there goes on. A zone not
    tried yet (c) is worth trying again; a job in one zone keeps weighing its one spot offer itself (no
    ceiling)."""
    from kit.policy.zones import RUN_WINDOW

    spec_with = moving_spec
    clock, ledger = short_runs_in_a_and_b(tmp_path)

    def watched(zones: list[str], backend: ZonedBackend | None = None) -> tuple[ScriptedPolicy, Actor]:
        spec, backend = spec_with(zones), backend or ZonedBackend(full=set())
        actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
        policy = ScriptedPolicy(["wait"])
        watcher = Watcher(spec, ledger, actor, policy, source=BackendSource(backend), interval_s=15, clock=clock)
        watcher.start()  # nothing deployed: a launch is pending; the policy's wait supersedes it
        ledger.record(heartbeat(10, 100_000, 1.0, written=clock.t))
        watcher.tick()
        clock.t += 15
        return policy, actor

    policy, actor = watched(["a", "b"])
    hours, losses = actor.spot_runs()
    assert {o.zone: (round(h, 2), losses[o]) for o, h in hours.items()} == {z: (round(0.05 * RUN_WINDOW, 2), RUN_WINDOW)
                                                                            for z in ("a", "b")}
    assert policy.seen[-1].spot_available is False
    assert actor.search(None, "spot") == []
    with pytest.raises(CapacityError, match="no spot offer is worth trying"):
        actor._launch(ledger.decision(ledger.begin_decision(
            policy="default", decision="spot", action="launch", market_before=None, market_after="spot", reason="test",
            now=clock.t)), 0, "spot")
    # a spot run in a that holds goes on: the simulated default never leaves a run for the ceiling
    spec, backend = spec_with(["a", "b"]), ZonedBackend(full=set())
    offer = next(o for o in spec.offers() if o.zone == "a" and o.spot)
    spot_applied(ledger, [n.to_dict() for n in backend.apply(spec.with_offer(offer), "spot")], clock.t, offer.name)
    policy, actor = watched(["a", "b"], backend)
    assert policy.seen[-1].market == "spot" and policy.seen[-1].spot_available is True
    backend.deployed = []  # that run ends: no spot offer is worth a launch again
    clock.t += 60
    policy, actor = watched(["a", "b"], backend)
    assert policy.seen[-1].spot_available is False
    policy, actor = watched(["a", "b", "c"])
    assert policy.seen[-1].spot_available is True and [o.zone for o in actor.search(None, "spot")] == ["c"]
    policy, actor = watched(["a"])
    assert policy.seen[-1].spot_available is True and [o.zone for o in actor.search(None, "spot")] == ["a"]


def test_the_capacity_search_prices_a_move_with_the_specs_checkpoint_size_and_transfer_rate(tmp_path):
    """The watcher's ranking charges a move what moving costs this job (``policy.checkpoint_gb``, else the size
    of the newest checkpoint the trainer reported; ``transfer_gbps``, ``egress_per_gb``; as ``kit simulate``
    does), not the simulator's defaults: runs in a
    and b were 3 minutes (not worth their changeover) and c is untried (the 4-hour prior run). A 50 GB
    checkpoint makes c worth trying; one of 900 GB at 1 Gbit/s (2 h without progress, $72 of egress to
    another region) prices an hour of progress in c above on-demand's, so no spot offer is worth trying;
    with egress free (a flat rate of 0), the 2-hour transfer alone leaves c worth it (its prior run is 4 h)."""
    from kit.policy.offers import Moves
    from kit.policy.zones import progress_price

    def actor_with(**moving) -> Actor:
        return Actor(RecordingBackend(), ledger, moving_spec(["a", "b", "c"], **moving), clock=clock)

    clock, ledger = short_runs_in_a_and_b(tmp_path)
    default = actor_with()
    assert default.spec.policy.moves() == Moves()
    assert [o.zone for o in default.search(None, "spot")] == ["c"]
    big = actor_with(checkpoint_gb=900, transfer_gbps=1)
    assert big.spec.policy.moves() == Moves(checkpoint_gb=900, transfer_gbps=1)
    c = next(o for o in big.spec.offers() if o.zone == "c" and o.spot)
    ceiling = big.ceiling()
    assert ceiling == 8.0  # on-demand for the gang of 2
    for actor, worth in ((default, True), (big, False)):
        price = progress_price(c, 4.0, changeover_h=0.2, moves=actor.spec.policy.moves(), checkpoint_zone="b")
        assert (price < ceiling) is worth, price
    assert big.search(None, "spot") == [] and not big.spot_worth_trying()
    free = actor_with(checkpoint_gb=900, transfer_gbps=1, egress_per_gb=0)
    assert [o.zone for o in free.search(None, "spot")] == ["c"]
    # no size in the spec: the newest checkpoint's the trainer reported (node 1's older report is of a smaller one)
    ledger.record(heartbeat(20, 1000, rank=1, written=clock.t - 60, checkpoint_step=10, checkpoint_bytes=10**9))
    ledger.record(heartbeat(20, 1000, written=clock.t, checkpoint_step=20, checkpoint_bytes=900 * 10**9))
    measured = actor_with(transfer_gbps=1)
    assert measured.ledger.checkpoint_gb() == 900.0
    assert measured.search(None, "spot") == []
    assert [o.zone for o in actor_with(checkpoint_gb=50, transfer_gbps=1).search(None, "spot")] == ["c"], "the spec's"


def test_a_search_that_finds_no_spot_is_the_ticks_probe_and_the_policy_decides_again(tmp_path):
    """A ``default`` job that may move, off spot, zones a and b without spot capacity: the tick's search tries
    both and finds none. As the simulated multi-zone ``default`` decides on what its probes found, the policy
    decides that tick again with spot unavailable: it learns an outage, not a spot run (before, every failed
    search was a tick of spot in its market model), and with the slack abundant it waits. The ledger keeps
    that observation, and a restarted watcher's policy learns the same from it."""
    from kit.policy.zones import moving_market_policy

    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), ZonedBackend(full={"a", "b"})
    spec = moving_spec(["a", "b"], deadline_hours=100)
    policy = moving_market_policy()
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    watcher = Watcher(spec, ledger, actor, policy, source=BackendSource(backend), clock=clock)
    watcher.start()
    ledger.record(heartbeat(10, 1000, step_time_s=36.0, written=clock.t))
    result = watcher.tick()
    assert sorted(zone for zone, _ in backend.zones_tried) == ["a", "b"] and ledger.nodes(("up",)) == []
    assert result.decision == "wait", result
    tick = ledger.ticks()[-1]
    assert tick["observation"]["spot_available"] is False and tick["decision"] == "wait"
    assert policy.run_start is None and policy.outage_start is not None
    again = moving_market_policy()
    Watcher(spec, ledger, Actor(backend, ledger, spec, clock=clock), again, source=BackendSource(backend),
            clock=clock).start()
    assert again.__dict__ == policy.__dict__


def test_a_job_that_may_move_relaunches_elsewhere_in_the_tick_its_spot_run_is_lost(tmp_path):
    """As the simulated multi-zone ``default``: the tick that loses the spot run in a first tells the market
    policy the run ended, then asks it with spot as the search finds it, and the job relaunches in b at once
    (before, the watcher saw spot unavailable in that tick, the one-zone model, and idled a tick at every
    loss: on bench/watcher_replay.py's synthetic markets that slack ran out and the job finished on-demand).
    A restarted watcher's policy, rebuilt from the recorded ticks, has learned the same runs and outages."""
    from kit.policy.zones import moving_market_policy

    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), ZonedBackend(full=set())
    spec = moving_spec(["a", "b"], deadline_hours=100)

    def watcher_with(policy) -> Watcher:
        actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
        return Watcher(spec, ledger, actor, policy, source=BackendSource(backend), interval_s=600, clock=clock)

    policy = moving_market_policy()
    watcher = watcher_with(policy)
    watcher.start()
    ledger.record(heartbeat(0, 4800, step_time_s=36.0, written=clock.t))
    watcher.tick()
    assert ledger.applied_offer() == "a/2xlocal/spot"
    clock.t += 600
    ledger.record(heartbeat(10, 4800, step_time_s=36.0, written=clock.t))
    backend.full = {"a"}
    backend.preempt(0), backend.preempt(1)
    result = watcher.tick()
    assert (result.decision, result.action, result.outcome.status) == ("spot", "recover", "done"), result
    assert ledger.applied_offer() == "b/2xlocal/spot"
    assert policy.runs == [pytest.approx(1 / 6)] and policy.outages == [0.0]
    again = moving_market_policy()
    watcher_with(again).start()
    assert (again.runs, again.outages) == (policy.runs, policy.outages)


# ---------------------------------------------------------------------------------------------
# A watcher killed inside an apply, a bootstrap given up, an apply that failed half way: each test
# failed before its fix.


class Killed(BaseException):
    """SIGKILL inside the backend's apply: nothing after it in the watcher runs."""


class KillableZonedBackend(ZonedBackend):
    """``kill``: "before" dies as the apply starts (the cloud unchanged), "after" once the cloud converged."""

    kill: str | None = None

    def apply(self, spec, market):
        if self.kill == "before":
            raise Killed
        nodes = super().apply(spec, market)
        if self.kill == "after":
            raise Killed
        return nodes


def moving_job(tmp_path):
    """A job on spot in zone b, dear (a and c full at its launch), that may move, and a move decision: to a."""
    from kit.spec import parse_spec

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b", "c"], "market": "spot", "nodes": 2,
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0, "zones": {"b": {"spot_per_hour": 3.0}}},
                       "policy": {"name": "default", "changeover_hours": 0.2, "egress_per_gb": 0, "checkpoint_gb": 0.001}})
    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), KillableZonedBackend(full={"a", "c"})
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    launch = ledger.begin_decision(policy="default", decision="spot", action="launch", market_before=None,
                                   market_after="spot", reason="first launch", now=clock.t)
    assert actor.execute(ledger.decision(launch)).status == "done" and actor.current_offer().zone == "b"
    clock.t += 3600
    backend.full = {"b", "c"}  # only a has room: the move's search (a, then b where it runs) lands in a
    move = ledger.begin_decision(policy="default", decision="spot", action="move", market_before="spot",
                                 market_after="spot", reason="try to move", now=clock.t)
    return spec, clock, ledger, backend, actor, move


def test_a_watcher_killed_inside_a_move_that_converged_adopts_it_with_its_zone_shape_and_price(tmp_path):
    """The offer an apply is for is recorded before it runs: adopted without it, the job lost where it ran
    (the next start's backend pointed at the spec's first zone, no move was ever tried again, nodes unpriced)."""
    spec, clock, ledger, backend, actor, move = moving_job(tmp_path)
    backend.kill = "after"
    with pytest.raises(Killed):
        actor.execute(ledger.decision(move))
    backend.kill, applies = None, len(backend.zones_tried)
    restarted = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    restarted.resume()
    assert len(backend.zones_tried) == applies, "adopted, not applied again"
    assert ledger.decision(move).status == "done" and restarted.current_offer().zone == "a"
    assert restarted.deployed_spec().start_zone == "a"
    assert {(n.zone, n.shape, n.price) for n in ledger.nodes(("up",))} == {("a", "2xlocal", 1.0)}


def test_a_watcher_killed_before_its_move_applied_moves_on_restart_instead_of_adopting_the_old_zone(tmp_path):
    """A move keeps the market and the node count: the nodes still in the old zone looked converged, so the
    move was marked done without moving."""
    spec, clock, ledger, backend, actor, move = moving_job(tmp_path)
    backend.kill = "before"
    with pytest.raises(Killed):
        actor.execute(ledger.decision(move))
    backend.kill = None
    restarted = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    restarted.resume()
    assert ledger.decision(move).status == "pending" and restarted.current_offer().zone == "b"
    assert restarted.execute(ledger.decision(move)).status == "done"
    assert restarted.current_offer().zone == "a" and {n.zone for n in backend.deployed} == {"a"}


def test_nodes_a_given_up_bootstrap_left_untrained_are_bootstrapped_when_the_watcher_is_started_again(tmp_path):
    """kit watch stops after five failed bootstraps for a person to fix the cause; started again, it saw the
    market it wanted already deployed and did nothing, and the nodes ran on, billed, without a trainer."""
    watcher, backend, ledger, _policy, clock = make(tmp_path, ["on-demand"])
    ledger.record(heartbeat(10, 1000))
    failing = make_bootstrap_fail(backend)
    for _ in range(5):
        outcome = watcher.tick().outcome
        clock.t += 400
    assert outcome.status == "failed"
    failing["on"] = False  # fixed
    restarted = Watcher(watcher.spec, ledger, Actor(backend, ledger, watcher.spec, clock=clock),
                        ScriptedPolicy(["on-demand"]), source=BackendSource(backend), interval_s=15, clock=clock)
    restarted.start()
    up = tuple(sorted(n.instance_id for n in ledger.nodes(("up",))))
    assert [c[1] for c in backend.of("bootstrap")] == [up]
    assert ledger.pending_decision() is None and ledger.decisions()[0].status == "done"


def test_an_apply_that_reports_no_nodes_is_retried_not_recorded_as_a_cluster_of_none(tmp_path):
    """`terraform output` failing after an apply converged gave no nodes: the ledger said the market ran on
    none, so nothing was billed, no loss was seen, and the loop never applied again."""
    watcher, backend, ledger, _policy, clock = make(tmp_path, ["on-demand"])
    ledger.record(heartbeat(10, 1000))
    real_apply = backend.apply
    backend.apply = lambda spec, market: (real_apply(spec, market), [])[1]
    result = watcher.tick()
    assert result.outcome.status == "retry" and "reported 0 node(s), not 2" in result.outcome.error
    backend.apply = real_apply
    clock.t += 400
    watcher.tick()
    assert [(n.market, n.instance_id in {d.instance_id for d in backend.deployed}) for n in ledger.nodes(("up",))] \
        == [("on-demand", True)] * 2 and ledger.market() == "on-demand"


def test_nodes_a_failed_replacing_apply_destroyed_end_as_stopped_by_kit_not_as_lost_to_the_market(tmp_path):
    """Terraform replaces an instance destroy-first: a switch to spot that then finds no capacity has ended the
    on-demand nodes. The ledger kept them up (billed), and the next poll reported them lost: a preemption to
    the policy and to `kit status`."""
    watcher, backend, ledger, policy, clock = make(tmp_path, ["on-demand", "spot", "on-demand"],
                                                    deployed_market="on-demand")
    ledger.record(heartbeat(10, 1000))
    watcher.tick()
    real_apply = backend.apply

    def destroy_then_no_capacity(spec, market):
        if market == "spot":
            backend.deployed = []
            raise CapacityError("InsufficientInstanceCapacity")
        return real_apply(spec, market)

    backend.apply = destroy_then_no_capacity
    clock.t += 15
    assert watcher.tick().outcome.capacity_error
    assert ledger.nodes(("up",)) == [] and {n.lost_kind for n in ledger.nodes(("lost",))} == {"stopped-by-kit"}
    assert {n.until for n in ledger.nodes(("lost",))} == {clock.t}
    clock.t += 15
    result = watcher.tick()
    assert policy.seen[-1].preempted is False and not result.new_events
    assert result.action == "recover" and status_report(ledger, watcher.spec, now=clock.t)["nodes_lost"] == 0


def test_on_demand_nodes_a_failed_spot_try_destroyed_are_relaunched_in_the_same_tick(tmp_path):
    """A job that may move tries spot from on-demand; the apply destroys the on-demand nodes first and then
    finds no spot anywhere. The policy, asked again with spot unavailable, answers on-demand: the watcher took
    the ledger's stale view ("already running on on-demand") and left the job with nothing for a tick."""
    from kit.policy.market import DefaultPolicy
    from kit.spec import parse_spec
    from training.contract import ON_DEMAND, SPOT

    class SpotWhenOffered(DefaultPolicy):
        def decide(self, obs):
            return SPOT if obs.spot_available else ON_DEMAND

    class DestroyFirst(ZonedBackend):
        def apply(self, spec, market):
            if market == SPOT and spec.start_zone in self.full:
                self.deployed = []  # Terraform replaced the on-demand instances destroy-first
            return super().apply(spec, market)

    spec = parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b"], "market": "on-demand", "nodes": 2,
                       "prices": {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0},
                       "policy": {"name": "default", "changeover_hours": 0.2}})
    clock, ledger, backend = Clock(), Ledger(tmp_path / "ledger.sqlite"), DestroyFirst(full={"a", "b"})
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(1)), clock=clock)
    watcher = Watcher(spec, ledger, actor, SpotWhenOffered(), source=BackendSource(backend), clock=clock)
    launch = ledger.begin_decision(policy="default", decision=ON_DEMAND, action="launch", market_before=None,
                                   market_after=ON_DEMAND, reason="first launch", now=clock.t)
    assert actor.execute(ledger.decision(launch)).status == "done"
    watcher.start()
    clock.t += 3600  # staying on on-demand has paid for a try (Actor.spot_try_due)
    ledger.record(heartbeat(10, 1000, written=clock.t))
    result = watcher.tick()
    assert ("a", 2) in backend.zones_tried and ("b", 2) in backend.zones_tried  # the spot try found none
    assert result.action == "recover" and result.outcome.status == "done"
    assert [n.market for n in ledger.nodes(("up",))] == [ON_DEMAND] * 2 and len(backend.deployed) == 2


def test_a_bootstrap_given_up_on_while_resuming_stops_the_watcher(tmp_path):
    """The fifth failed bootstrap can come from a restarted watcher finishing its predecessor's decision: its
    outcome was dropped, and the watcher ran on with the nodes untrained and nothing left to retry them."""
    from kit.errors import KitError

    watcher, backend, ledger, _policy, clock = make(tmp_path, ["on-demand"])
    ledger.record(heartbeat(10, 1000))
    make_bootstrap_fail(backend)
    for _ in range(4):
        assert watcher.tick().outcome.status == "retry"
        clock.t += 400
    restarted = Watcher(watcher.spec, ledger, Actor(backend, ledger, watcher.spec, clock=clock),
                        ScriptedPolicy(["on-demand"]), source=BackendSource(backend), interval_s=15, clock=clock)
    with pytest.raises(KitError, match="giving up on the last decision: ssh: connection refused"):
        restarted.start()

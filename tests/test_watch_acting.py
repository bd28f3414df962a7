"""The acting path with a recording backend: market switch, recovery, capacity backoff, release."""

from __future__ import annotations

import random

import pytest
from watch_fakes import BackendSource, FakeSpec, Obs, RecordingBackend, ScriptedPolicy, heartbeat

from kit.watch.acting import Actor, Backoff
from kit.watch.events import CAPACITY_ERROR, PREEMPTION
from kit.watch.ledger import Ledger
from kit.watch.watcher import Watcher


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
        backend.apply(FakeSpec(market=deployed_market), deployed_market)
        backend.calls.clear()
    spec = FakeSpec(nodes=nodes, market="spot")
    actor = Actor(backend, ledger, spec, backoff=Backoff(rng=random.Random(seed)), clock=clock)
    policy = ScriptedPolicy(answers)
    watcher = Watcher(spec, ledger, actor, policy, source=BackendSource(backend), interval_s=15, clock=clock,
                      observation=Obs)
    watcher.start()
    return watcher, backend, ledger, policy, clock


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
    assert obs.preempted is True and obs.market is None and obs.spot_available is True  # found out by re-applying
    assert [n.instance_id for n in ledger.nodes(("replaced",))] == [lost.instance_id]
    # The same terminated instance polled again is not a second preemption.
    clock.t += 15
    again = watcher.tick()
    assert again.new_events == [] and policy.seen[-1].preempted is False and len(backend.of("apply")) == 1


def test_capacity_errors_back_off_exponentially_with_jitter_and_count_as_pressure(tmp_path):
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
    assert policy.seen[-1].preempted is True and policy.seen[-1].spot_available is False  # pressure
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
    again = Watcher(watcher.spec, ledger, watcher.actor, fresh, source=BackendSource(backend), clock=clock,
                    observation=Obs)
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

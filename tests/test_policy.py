"""kit.policy on hand-made observations: safety net, UP hysteresis, threshold window and cooldown."""

from __future__ import annotations

import pytest

from kit.errors import InputError
from kit.policy import ON_DEMAND, POLICY_NAMES, SPOT, WAIT, Observation, make_policy, safety_net


def obs(now, progress=0.0, *, job=5.0, deadline=10.0, d=0.2, market=None, spot=True, preempted=False, tick=0.5):
    return Observation(now_h=now, progress_h=progress, job_h=job, deadline_h=deadline, changeover_h=d,
                       market=market, spot_available=spot, preempted=preempted, tick_h=tick)


def test_names_and_unknown_policy():
    assert POLICY_NAMES == ("on-demand", "spot", "threshold", "up", "greedy", "default")
    for name in POLICY_NAMES:
        assert make_policy(name).name == name
    with pytest.raises(InputError) as err:
        make_policy("cheapest")
    assert "greedy" in err.value.render()
    with pytest.raises(InputError):
        make_policy("threshold", k=0)
    with pytest.raises(InputError):
        make_policy("greedy", bogus=1)
    # the parameters the watcher passes from spec.policy.threshold
    assert make_policy("threshold", k=2, window_hours=3.0, cooldown_hours=1.0).k == 2


def test_safety_net_fires_exactly_when_it_must():
    # deadline 10, job 5, d 0.2, tick 0.5: finishing on on-demand from t needs 5.2 h, so the last
    # moment to still afford one more tick elsewhere is slack = 10 - t - 5.2 > 0.5, i.e. t < 4.3.
    assert not safety_net(obs(4.29))
    assert safety_net(obs(4.30))
    assert not safety_net(obs(4.30, deadline=None))
    for name in ("spot", "threshold", "up", "greedy", "default"):
        policy = make_policy(name)
        assert policy.decide(obs(4.29, spot=True, market=SPOT)) == SPOT, name
        assert make_policy(name).decide(obs(4.30, spot=True, market=SPOT)) == ON_DEMAND, name
        # progress buys slack: with 1 h done the net fires one hour later
        assert make_policy(name).decide(obs(5.29, 1.0, spot=True, market=SPOT)) == SPOT, name
        assert make_policy(name).decide(obs(5.30, 1.0, spot=True, market=SPOT)) == ON_DEMAND, name
    # a finished job holds nothing
    assert make_policy("on-demand").decide(obs(3.0, 5.0)) == WAIT


def test_greedy_net_is_sticky_and_waits_without_spot():
    greedy = make_policy("greedy")
    assert greedy.decide(obs(0.0, spot=False)) == WAIT
    assert greedy.decide(obs(0.5, spot=True)) == SPOT
    assert greedy.decide(obs(4.5, spot=False)) == ON_DEMAND
    # spot comes back and (hypothetically) slack too: greedy stays on on-demand until the end
    assert greedy.decide(obs(5.0, 2.0, spot=True, market=ON_DEMAND)) == ON_DEMAND
    # no deadline: plain spot
    assert make_policy("greedy").decide(obs(100.0, deadline=None, spot=True)) == SPOT


def test_up_hysteresis():
    # C0 = 5, R0 = 10: ep(t) = t / 2. d = 0.2 -> stays on on-demand until cp >= ep(t + 0.4).
    up = make_policy("up")
    assert up.decide(obs(1.0, 0.4, spot=False)) == ON_DEMAND  # idle and behind (0.4 < 0.5)
    assert up.decide(obs(1.0, 0.6, spot=False, market=None)) == WAIT  # ahead: thrifty
    # on on-demand, ahead of ep(t) = 1.0 but behind ep(t + 2d) = 1.2: stays, even with spot up
    assert up.decide(obs(2.0, 1.1, spot=True, market=ON_DEMAND)) == ON_DEMAND
    assert up.decide(obs(2.0, 1.19, spot=True, market=ON_DEMAND)) == ON_DEMAND
    # caught up with ep(t + 2d): takes spot
    assert up.decide(obs(2.0, 1.2, spot=True, market=ON_DEMAND)) == SPOT
    # behind and spot up: takes spot (rule 2), even when behind
    assert make_policy("up").decide(obs(3.0, 0.0, spot=True)) == SPOT
    # on on-demand and caught up, but no spot: stays on on-demand (no release to idle)
    assert make_policy("up").decide(obs(2.0, 1.3, spot=False, market=ON_DEMAND)) == ON_DEMAND
    # idle, ahead, no spot: waits (thrifty)
    assert make_policy("up").decide(obs(2.0, 1.3, spot=False, market=None)) == WAIT


def test_threshold_counts_only_inside_the_window():
    t = make_policy("threshold", k=2, window_hours=3.0, cooldown_hours=2.0)
    big = {"deadline": None}
    assert t.decide(obs(0.0, preempted=True, **big)) == SPOT
    assert t.decide(obs(2.0, **big)) == SPOT
    # second preemption 4 h after the first: the first is outside the 3 h window
    assert t.decide(obs(4.0, preempted=True, **big)) == SPOT
    assert t.decide(obs(5.0, **big)) == SPOT
    # third one 2 h after the second: two inside the window -> on-demand
    assert t.decide(obs(6.0, preempted=True, **big)) == ON_DEMAND


def test_threshold_cooldown_returns_to_spot_and_backs_off():
    t = make_policy("threshold", k=2, window_hours=3.0, cooldown_hours=2.0)
    big = {"deadline": None}
    t.decide(obs(0.0, preempted=True, **big))
    assert t.decide(obs(1.0, preempted=True, **big)) == ON_DEMAND  # cooldown until t = 3
    assert t.decide(obs(2.5, market=ON_DEMAND, **big)) == ON_DEMAND
    assert t.decide(obs(3.0, market=ON_DEMAND, **big)) == SPOT  # cooldown over, history cleared
    assert t.decide(obs(3.5, preempted=True, **big)) == SPOT  # one preemption after the cooldown
    assert t.decide(obs(4.0, preempted=True, **big)) == ON_DEMAND  # second trip: cooldown 4 h
    assert t.decide(obs(7.9, market=ON_DEMAND, **big)) == ON_DEMAND
    assert t.decide(obs(8.0, market=ON_DEMAND, **big)) == SPOT
    assert t.decide(obs(8.5, spot=False, **big)) == WAIT  # spot mode, none available: wait


def test_default_schedule_and_lifetime_gate():
    # no spot ever, behind the (stretched) schedule: on-demand at once
    policy = make_policy("default")
    assert policy.decide(obs(0.5, job=48.0, deadline=60.0, spot=False)) == ON_DEMAND
    # ahead of the schedule on an always-spot market: waits out an outage instead of paying on-demand
    policy = make_policy("default")
    for i in range(40):
        policy.decide(obs(i * 0.5, i * 0.5, job=48.0, deadline=72.0, spot=True, market=SPOT))
    assert policy.decide(obs(20.0, 20.0, job=48.0, deadline=72.0, spot=False, preempted=True)) == WAIT
    # schedule: ep(t) = 48 t / (48.2 + 1.15 * 11.8) = 48 t / 61.77; on on-demand at t = 10 it leaves
    # only when cp >= ep(10.4) = 8.08, and only for a spot run expected to beat 2kd/(k-1) = 0.533 h
    flicker = make_policy("default")
    for i in range(24):  # spot up for one 10-minute tick of every three: runs of 1/6 h
        flicker.decide(obs(i / 6, 0.0, job=48.0, deadline=60.0, spot=i % 3 == 0, tick=1 / 6))
    steady = make_policy("default")
    steady.decide(obs(0.0, 0.0, job=48.0, deadline=60.0, spot=True, tick=1 / 6))
    for p in (flicker, steady):
        assert p.decide(obs(10.0, 8.0, job=48.0, deadline=60.0, spot=True, market=ON_DEMAND, tick=1 / 6)) == ON_DEMAND
    assert flicker.decide(obs(10.0, 8.2, job=48.0, deadline=60.0, spot=True, market=ON_DEMAND, tick=1 / 6)) == ON_DEMAND
    assert steady.decide(obs(10.0, 8.2, job=48.0, deadline=60.0, spot=True, market=ON_DEMAND, tick=1 / 6)) == SPOT
    assert flicker.expected_rest_of_run_h(10.0) < 0.533 < steady.expected_rest_of_run_h(10.0)


def test_watcher_wiring_builds_our_policies_and_observations():
    from types import SimpleNamespace

    from kit.watch.commands import make_policy_for
    from kit.watch.watcher import _default_observation

    threshold = SimpleNamespace(k=2, window_hours=1.0, cooldown_hours=0.5)
    spec = SimpleNamespace(policy=SimpleNamespace(name="threshold", deadline_hours=None, changeover_hours=0.2,
                                                  threshold=threshold))
    policy = make_policy_for(spec)
    assert policy.name == "threshold" and (policy.k, policy.window_h, policy.cooldown_h) == (2, 1.0, 0.5)
    observation = _default_observation(now_h=0.0, progress_h=0.0, job_h=1.0, deadline_h=None, changeover_h=0.2,
                                       market=SPOT, spot_available=True, preempted=True, tick_h=15 / 3600)
    assert isinstance(observation, Observation)
    assert make_policy_for(SimpleNamespace(policy=None)).name == "default"


def test_replaying_the_same_ticks_gives_the_same_decisions():
    # the watcher rebuilds a policy's memory on restart by replaying recorded observations
    import random

    rng = random.Random(7)
    ticks = []
    progress = 0.0
    for i in range(300):
        ticks.append(obs(i / 6, progress, job=30.0, deadline=40.0, spot=rng.random() < 0.6,
                         market=rng.choice([None, SPOT, ON_DEMAND]), preempted=rng.random() < 0.1, tick=1 / 6))
        progress = min(30.0, progress + rng.choice([0.0, 1 / 6]))
    for name in POLICY_NAMES:
        first, second = make_policy(name), make_policy(name)
        assert [first.decide(t) for t in ticks] == [second.decide(t) for t in ticks], name

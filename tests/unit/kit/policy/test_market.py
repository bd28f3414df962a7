"""kit.policy on hand-made observations: safety net, UP hysteresis, threshold window and cooldown."""

from __future__ import annotations

from dataclasses import replace

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


def _cycles(policy, up_h, down_h, cycles, *, job, deadline, tick=1 / 6, t=0.0, progress=0.0):
    """Feed ``policy`` a market of outages of ``down_h`` then spot runs of ``up_h`` (held on spot)."""
    for _ in range(cycles):
        for _ in range(round(down_h / tick)):
            policy.decide(obs(t, progress, job=job, deadline=deadline, spot=False, tick=tick))
            t += tick
        for _ in range(round(up_h / tick)):
            policy.decide(obs(t, progress, job=job, deadline=deadline, spot=True, market=SPOT, tick=tick))
            t, progress = t + tick, progress + tick
    return t, progress


def test_default_takes_the_price_ratio_from_the_observation():
    def priced(t, spot_price, on_demand_price):
        return Observation(now_h=t, progress_h=0.0, job_h=5.0, deadline_h=100.0, changeover_h=0.2, market=None,
                           spot_available=True, preempted=False, tick_h=0.1, spot_price=spot_price,
                           on_demand_price=on_demand_price)

    def learned(**params):
        # spot runs of 0.4 h: worth a 0.2 h changeover when k (0.4 - 0.2) > 0.4, i.e. k > 2
        policy = make_policy("default", prior_weight=0.01, **params)
        t = 0.0
        for _ in range(20):
            for i in range(8):
                policy.decide(obs(t, 0.0, job=5.0, deadline=100.0, spot=i < 4, tick=0.1))
                t += 0.1
        return policy, t

    policy, t = learned()
    assert policy.price_ratio(priced(t, 2.0, 12.0)) == pytest.approx(6.0)
    assert policy.price_ratio(obs(t)) == 4.0  # no prices: the price_ratio parameter
    assert learned()[0].decide(priced(t, 1.0, 6.0)) == SPOT
    assert learned()[0].decide(priced(t, 1.0, 1.5)) == WAIT  # spot barely cheaper: not worth a changeover
    assert learned(price_ratio=1.5)[0].decide(obs(t, 0.0, job=5.0, deadline=100.0, spot=True, tick=0.1)) == WAIT
    assert Observation(now_h=0, progress_h=0, job_h=1, deadline_h=None, changeover_h=0, market=None,
                       spot_available=True, preempted=False, tick_h=1).spot_price is None  # old callers still work
    with pytest.raises(InputError):
        make_policy("default", price_ratio=1.0)
    with pytest.raises(InputError, match="lookahead_changeovers"):
        make_policy("default", lookahead_changeovers=0.0)


def test_default_with_pace_runs_on_demand_instead_of_waiting_below_the_uniform_line():
    from kit.policy.market import uniform_slack

    # R0 = 60, C0 = 48, d = 0.2: Uniform Progress keeps 11.8 (60 - t) / 60 hours of slack
    assert uniform_slack(obs(0.0, job=48.0, deadline=60.0)) == pytest.approx(11.8)
    assert uniform_slack(obs(30.0, job=48.0, deadline=60.0)) == pytest.approx(5.9)
    assert uniform_slack(obs(1.0, deadline=None)) is None
    # at t = 30 h half the line is 2.95 h: with 20 h done the slack is 30 - (28 + 0.2) = 1.8 h, below it;
    # with 23 h done, 4.8 h, above it. Idle in an outage, only the paced policy leaves waiting for on-demand
    behind, ahead = (obs(30.0, p, job=48.0, deadline=60.0, spot=False, tick=1 / 6) for p in (20.0, 23.0))
    for paced, expected in ((0.0, WAIT), (0.5, ON_DEMAND)):
        policy = make_policy("default", pace=paced)
        policy.decide(obs(0.0, 0.0, job=48.0, deadline=60.0, spot=True, market=SPOT, tick=1 / 6))
        assert policy.decide(behind) == expected, paced
    assert make_policy("default", pace=0.5).decide(ahead) == WAIT
    # a wait with spot available (a fresh run proving itself) is not an outage: pacing leaves it a wait
    waiting = make_policy("default", pace=0.5)
    waiting._choose = lambda o: WAIT
    assert waiting.decide(replace(behind, spot_available=True)) == WAIT
    assert waiting.decide(behind) == ON_DEMAND
    with pytest.raises(InputError, match="pace"):
        make_policy("default", pace=1.5)


def test_default_with_a_window_learns_from_its_latest_runs_and_outages_only():
    """A market that turned: five cycles of 4-h runs and 10-min outages, then eight of 10-min runs and 4-h
    outages. With a window of 5 the policy knows only the new regime; without, the old one still weighs."""
    from kit.policy.zones import MARKET_WINDOW, moving_market_policy

    def fed(**params):
        policy = make_policy("default", **params)
        t, p = _cycles(policy, 4.0, 1 / 6, 5, job=500.0, deadline=1000.0)
        _cycles(policy, 1 / 6, 4.0, 8, job=500.0, deadline=1000.0, t=t, progress=p)
        return policy

    windowed, whole = fed(window=5), fed()
    assert windowed.runs == pytest.approx([1 / 6] * 5) and windowed.outages == pytest.approx([4.0] * 5)
    assert len(whole.runs) == 12 and len(whole.outages) == 13  # the last run is still going
    stats = {name: policy.market_stats(obs(100.0, deadline=1000.0), 4.0) for name, policy in
             (("windowed", windowed), ("whole", whole))}
    assert stats["windowed"]["run_h"] < 1.0 < stats["whole"]["run_h"]
    assert stats["windowed"]["outage_h"] > 3.0 > stats["whole"]["outage_h"]
    assert moving_market_policy().window == MARKET_WINDOW and make_policy("default").window is None
    with pytest.raises(InputError, match="window"):
        make_policy("default", window=0)


def test_default_with_budget_se_takes_the_slack_budget_low_by_the_spread_of_its_outages():
    """2-h runs and outages of 10 min and 2 h in turn, half an hour into a new outage: the budget (waiting up to
    this long in every outage until the deadline) is 8.9 h, one standard error of the outages' mean lower 7.7 h.
    With 8 h of slack the plain budget sends the job to on-demand and the one taken low waits (the net can still
    undo a wait); with outages all as long as the prior's the two budgets are the same."""
    from kit.policy.zones import CONFIDENCE_SE, moving_market_policy

    tick = 1 / 6

    def at(slack, downs, **params):
        policy = make_policy("default", **params)
        t, progress = 0.0, 0.0
        for down in downs:
            t, progress = _cycles(policy, 2.0, down, 1, job=48.0, deadline=72.0, t=t, progress=progress)
        policy.decide(obs(t, progress, job=48.0, deadline=72.0, spot=False, tick=tick))  # the outage begins
        o = obs(t + 0.5, 48.0 - (72.0 - t - 0.5 - 0.2 - slack), job=48.0, deadline=72.0, spot=False, tick=tick)
        assert o.slack_h() == pytest.approx(slack)
        return policy, o

    def budget(policy, o):
        return policy._budget(o, policy.market_stats(o, policy.price_ratio(o)), 0.5)

    spread = [1 / 6, 2.0] * 4
    plain, low = at(8.0, spread), at(8.0, spread, budget_se=1.0)
    assert budget(*plain) == pytest.approx(8.93, abs=0.01) and budget(*low) == pytest.approx(7.68, abs=0.01)
    assert plain[0].decide(plain[1]) == ON_DEMAND and low[0].decide(low[1]) == WAIT
    short = at(7.0, spread, budget_se=1.0)  # below even the low budget
    assert short[0].decide(short[1]) == ON_DEMAND
    alike = [1.0] * 8
    assert budget(*at(8.0, alike, prior_outage_h=1.0)) == pytest.approx(
        budget(*at(8.0, alike, prior_outage_h=1.0, budget_se=1.0)))
    assert moving_market_policy().budget_se == CONFIDENCE_SE and make_policy("default").budget_se == 0.0
    with pytest.raises(InputError, match="budget_se"):
        make_policy("default", budget_se=-1.0)


def test_default_learns_which_spot_runs_pay():
    tick = 1 / 6
    # always-spot market, slack to spare: it waits out an outage instead of paying on-demand (Greedy)
    policy = make_policy("default")
    for i in range(40):
        policy.decide(obs(i * 0.5, i * 0.5, job=48.0, deadline=72.0, spot=True, market=SPOT))
    assert policy.decide(obs(20.0, 20.0, job=48.0, deadline=72.0, spot=False, preempted=True)) == WAIT
    # on on-demand with spot back: a flickering market (one 10-minute tick of spot in three) keeps it
    # on on-demand (a run must first outlast a tick), a steady one moves it to spot
    flicker, steady = make_policy("default"), make_policy("default")
    for i in range(60):
        flicker.decide(obs(i * tick, 0.0, job=48.0, deadline=60.0, spot=i % 3 == 0, tick=tick))
    steady.decide(obs(0.0, 0.0, job=48.0, deadline=60.0, spot=True, tick=tick))
    on_demand = obs(10.0, 8.0, job=48.0, deadline=60.0, spot=True, market=ON_DEMAND, tick=tick)
    assert flicker.decide(on_demand) == ON_DEMAND
    assert steady.decide(on_demand) == SPOT
    # idle: spot runs of one tick never make progress (d > tick); after a few it stops launching them
    short = make_policy("default")
    answers = [short.decide(obs(i * tick, 0.0, job=48.0, deadline=60.0, spot=i % 2 == 0, tick=tick))
               for i in range(60)]
    assert answers[0] == SPOT and SPOT not in answers[30:]


def test_default_goes_on_demand_only_through_long_outages_when_slack_is_scarce():
    tick = 1 / 6

    def next_outage(up_h, down_h, cycles, job, deadline):
        policy = make_policy("default")
        t, progress = _cycles(policy, up_h, down_h, cycles, job=job, deadline=deadline)
        return "".join(policy.decide(obs(t + i * tick, progress, job=job, deadline=deadline, spot=False, tick=tick))[0]
                       for i in range(18))

    # 2 h runs, 4 h outages, 11.8 h of slack for 54 h: it waits the first hour of an outage, then on-demand
    assert next_outage(2.0, 4.0, 3, 48.0, 72.0) == "w" * 6 + "o" * 12
    # the same market with a small job: the slack covers every outage, so Greedy
    assert next_outage(2.0, 4.0, 3, 10.0, 72.0) == "w" * 18
    # 10-minute outages: an on-demand launch cannot pay for itself, so it waits
    assert next_outage(2.0, 1 / 6, 3, 48.0, 60.0) == "w" * 18


def test_default_launches_no_spot_whose_changeover_would_end_at_the_safety_net():
    """With slack s, a launch leaves s - d once its changeover is over; with at most one tick left the net
    sends the job to on-demand right then, so the launch pays its changeover for nothing. A fresh default
    (which assumes 4-h runs) launches spot from idle or on-demand while s - d is above one tick, not once
    it is not (the net itself fires only at s <= one tick)."""
    tick, d = 1 / 6, 0.2
    for slack, launches in ((0.6, True), (0.3, False)):
        for market, otherwise in ((None, WAIT), (ON_DEMAND, ON_DEMAND)):
            o = obs(10.0, 40.0, job=48.0, deadline=10.0 + 8.0 + d + slack, d=d, market=market, tick=tick)
            assert o.slack_h() == pytest.approx(slack) and not safety_net(o)
            assert make_policy("default").decide(o) == (SPOT if launches else otherwise), (slack, market)


def test_default_tells_what_an_hour_of_slack_is_worth():
    """(lambda, abundant) for a multi-zone policy: the same market as above, abundant for a small job,
    not for a big one; without a deadline slack is worth nothing."""
    for job, abundant in ((10.0, True), (48.0, False)):
        policy = make_policy("default")
        t, progress = _cycles(policy, 2.0, 4.0, 3, job=job, deadline=72.0)
        lam, is_abundant = policy.slack_value(obs(t, progress, job=job, deadline=72.0, spot=False, tick=1 / 6))
        assert is_abundant is abundant and lam > 0
    assert make_policy("default").slack_value(obs(0, deadline=None)) == (0.0, True)


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


def test_a_restored_policy_answers_as_if_the_withdrawn_question_had_not_been_put():
    """The watcher asks with spot available before its capacity search runs; when the search finds none it
    restores the policy's snapshot and asks again. Every policy must then answer every later tick as one
    that was only ever asked the second question, and a snapshot must survive being restored twice."""
    import random

    rng = random.Random(11)
    ticks, progress = [], 0.0
    for i in range(240):
        ticks.append(obs(i / 6, progress, job=30.0, deadline=40.0, spot=rng.random() < 0.6,
                         market=rng.choice([None, SPOT]), preempted=rng.random() < 0.1, tick=1 / 6))
        progress = min(30.0, progress + rng.choice([0.0, 1 / 6]))
    for name in POLICY_NAMES:
        asked, clean = make_policy(name), make_policy(name)
        answers, expected = [], []
        for i, t in enumerate(ticks):
            if i % 7 == 3 and t.spot_available:  # a guess withdrawn: asked on spot, then on its absence
                state = asked.snapshot()
                asked.decide(t)
                asked.restore(state)
                asked.decide(replace(t, preempted=True))  # a second guess, taken back too
                asked.restore(state)
                t = replace(t, spot_available=False)
            answers.append(asked.decide(t))
            expected.append(clean.decide(t))
        assert answers == expected, name
    policy = make_policy("default")
    for t in ticks[:60]:
        policy.decide(t)
    state = policy.snapshot()
    policy.decide(replace(ticks[60], spot_available=False, preempted=True))
    assert policy.snapshot() != state  # the check below can fail: deciding changed what it learned
    policy.restore(state)
    assert policy.snapshot() == state

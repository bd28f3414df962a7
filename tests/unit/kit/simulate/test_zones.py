"""The multi-zone market (kit/simulate/zones.py) and its policies (kit/policy/zones.py).

Traces here are hand-made or seeded Markov; the bundled GCP set is replayed once (the CLI test).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kit.cli import app
from kit.errors import InputError
from kit.policy import ON_DEMAND, SPOT, make_policy
from kit.policy.offers import Moves, Offer, Shape, check_shapes, region_of
from kit.policy.zones import Failover, NettedZonePolicy, Pinned, ZoneDefault, ZonePolicy
from kit.simulate.single import Params, simulate_policy
from kit.simulate.zones import (
    ZoneSet,
    _ZoneOpt,
    _ZoneOptFront,
    load_offers,
    replay,
    shapes_from_flags,
    simulate_opt_zones,
    simulate_zones,
    zone_starts,
)
from kit.traces import Trace, markov_availability

runner = CliRunner()
MOVES = Moves(checkpoint_gb=50, transfer_gbps=10)  # 40 s transfer
ZONE_NAMES = ("us-east4-a", "us-east4-b", "us-central1-a", "europe-west1-c")


def zone_trace(zone: str, data, gap_seconds=600, spot=1.0, on_demand=4.0, **meta) -> Trace:
    metadata = {"gap_seconds": gap_seconds, "zone": zone, "spot_price_per_hour": spot,
                "on_demand_price_per_hour": on_demand, **meta}
    return Trace(path=Path(f"{zone}.json"), gap_seconds=gap_seconds, data=tuple(data), metadata=metadata)


def markov_set(seed: int, n: int = 600, nodes: int = 2) -> list[Trace]:
    """Zones with different availability, run lengths and prices: a small multi-zone market."""
    rng = random.Random(seed)
    return [zone_trace(z, markov_availability(seed * 31 + i, n, rng.uniform(0.2, 0.9), rng.uniform(1.5, 12), nodes),
                       spot=round(rng.uniform(0.8, 1.4), 3), on_demand=round(rng.uniform(3.8, 4.4), 3))
            for i, z in enumerate(ZONE_NAMES)]


def market_of(traces, params, shapes=None):
    return ZoneSet.of(traces, shapes or [Shape("t", params.nodes)], params)


def all_policies(market, moves, seed):
    return [ZoneDefault(market.offers, moves, seed=seed), Failover(market.offers, moves, seed=seed),
            *[Pinned(market.offers, moves, z, make_policy(p)) for z in market.zones for p in ("up", "default")]]


# --------------------------------------------------------------------------------------- no leak
class Peeker(NettedZonePolicy):
    """Cheats: reads every zone's capacity through a back door (the market object it was given)."""

    name = "peeker"

    def __init__(self, offers, moves, market):
        super().__init__(offers, moves)
        self.market, self.t = market, 0

    def _decide(self, obs, market):
        self.t += 1
        up = [o for o in self.spot_offers() if self.market.avail[o][self.start + self.t - 1]]
        return up[:1]


def scrambled(market: ZoneSet, start: int, revealed: set, seed: int) -> ZoneSet:
    """The same market, with every (zone, tick) the policy did not learn about redrawn at random."""
    rng = np.random.default_rng(seed)
    avail = {}
    for offer, series in market.avail.items():
        new = series.copy()
        for i in range(len(series) - start):
            if (offer.zone, i) not in revealed:
                new[start + i] = rng.random() < 0.5
        avail[offer] = new
    return replace(market, avail=avail)


def leaks(market, start, params, make) -> bool:
    """A policy leaks when its decisions change with what it never observed or probed."""
    first = replay(market, start, params, MOVES, make(market), record=True)
    for seed in range(3):
        other = scrambled(market, start, first.revealed, seed)
        again = replay(other, start, params, MOVES, make(other), record=True)
        if [row["offer"] for row in again.timeline] != [row["offer"] for row in first.timeline]:
            return True
    return False


@pytest.mark.parametrize("seed", [1, 2])
def test_no_policy_reads_zones_it_did_not_observe_or_probe(seed):
    params = Params(nodes=2, job_h=20, deadline_h=30, changeover_h=0.2, starts=3)
    market = market_of(markov_set(seed), params)
    for start in zone_starts(market, params):
        for index in range(len(all_policies(market, MOVES, start))):
            def make(m, index=index, start=start):
                return all_policies(m, MOVES, start)[index]
            assert not leaks(market, start, params, make), all_policies(market, MOVES, start)[index].name


def test_the_no_leak_check_catches_a_policy_that_peeks():
    params = Params(nodes=2, job_h=20, deadline_h=30, changeover_h=0.2, starts=2)
    market = market_of(markov_set(3), params)
    start = zone_starts(market, params)[1]

    def make(m):
        peeker = Peeker(m.offers, MOVES, m)
        peeker.start = start
        return peeker

    assert leaks(market, start, params, make)


# --------------------------------------------------------------------------------------- opt
class Script(ZonePolicy):
    """Plays a fixed schedule: one offer (or None: hold nothing) per tick, no safety net."""

    name = "script"

    def __init__(self, offers, moves, schedule):
        super().__init__(offers, moves)
        self.schedule = list(schedule)

    def decide(self, obs, market):
        choice = self.schedule.pop(0) if self.schedule else None
        return [] if choice is None or obs.remaining_h <= 1e-9 else [choice]


def brute_force(market, params, moves):
    """The cheapest of all 5^7 schedules replayed on a 2-zone market (None: every one misses)."""
    return min((r.cost for schedule in itertools.product((None, *market.offers), repeat=7)
                if not (r := replay(market, 0, params, moves, Script(market.offers, moves, schedule))).missed),
               default=None)


@pytest.mark.parametrize(("d", "moves"), [(0.2, MOVES), (0.5, Moves(checkpoint_gb=225, transfer_gbps=1)),
                                          (0.2001, MOVES)])
def test_opt_matches_brute_force_over_every_schedule(d, moves):
    """On a 2-zone market of 1-hour ticks, opt equals the cheapest of all 5^7 schedules replayed
    (transfer 0.5 h with 225 GB at 1 Gbit/s; d = 0.2001 h has no common unit with the tick)."""
    traces = [zone_trace("us-east4-a", [2, 2, 0, 2, 0, 2, 2, 0, 0], gap_seconds=3600, spot=1.0, on_demand=4.0),
              zone_trace("europe-west1-c", [0, 2, 2, 2, 2, 0, 2, 2, 2], gap_seconds=3600, spot=1.3, on_demand=3.6)]
    params = Params(nodes=2, job_h=3.5, deadline_h=7, changeover_h=d, starts=1)
    market = market_of(traces, params)
    best = brute_force(market, params, moves)
    assert best is not None
    assert simulate_opt_zones(market, 0, params, moves).cost == pytest.approx(best, abs=1e-9)


def test_opt_never_finishes_on_a_spot_offer_down_in_the_last_tick():
    """The job can end within one tick of a launch (d + what is left fits in it): the array program counted a
    finish in a tick where the spot offer was down (7.8 where every replayable schedule costs 13.2)."""
    from kit.simulate.zones import _ZoneOpt

    trace = zone_trace("us-east4-a", [2, 2, 2, 0, 0, 0, 0, 0], gap_seconds=3600, spot=1.0, on_demand=4.0)
    params = Params(nodes=2, job_h=3.5, deadline_h=6, changeover_h=0.2, starts=1)
    market = market_of([trace], params)
    best = brute_force(market, params, MOVES)
    assert best == pytest.approx(13.2)
    assert _ZoneOpt(market, 0, params, MOVES).solve().cost == pytest.approx(best, abs=1e-9)


@pytest.mark.parametrize(("d", "moves"), [(0.2001, MOVES), (0.5, Moves(checkpoint_gb=100, transfer_gbps=1.9)),
                                          (0.2, Moves(checkpoint_gb=100, transfer_gbps=1.9))])
def test_opt_is_exact_when_no_unit_makes_the_changeover_and_transfer_whole(d, moves):
    """The cheapest schedule moves once (the first zone's spot ends after 3 h, the second's starts then), so
    its waste holds a transfer T. With d = 0.2001 h (40-s transfer), or T = 100 GB at 1.9 Gbit/s (0.117 h),
    no unit of the 1-hour tick up to 1/240 makes d and d + T whole; opt rounded T down to whole ticks
    before and was below every schedule (12.680 vs 12.705; 16.500 vs 16.757; 15.180 vs 15.437)."""
    traces = [zone_trace("us-east4-a", [2, 2, 2, 0, 0, 0, 0, 0, 0], gap_seconds=3600, spot=1.0, on_demand=4.0),
              zone_trace("europe-west1-c", [0, 0, 0, 2, 2, 2, 2, 2, 2], gap_seconds=3600, spot=1.1, on_demand=4.2)]
    params = Params(nodes=2, job_h=4.5, deadline_h=7, changeover_h=d, starts=1)
    market = market_of(traces, params)
    assert not _ZoneOpt(market, 0, params, moves).waste.exact
    best = brute_force(market, params, moves)
    assert best is not None
    assert simulate_opt_zones(market, 0, params, moves).cost == pytest.approx(best, abs=1e-9)


@pytest.mark.parametrize("seed", [4, 5])
def test_opt_over_waste_fronts_equals_opt_over_waste_units(seed):
    """Where a unit of the tick makes d and T whole, both programs of opt run: the same cost, start by start."""
    params = Params(nodes=2, job_h=20, deadline_h=28, changeover_h=0.2, starts=3)
    market = market_of(markov_set(seed), params)
    for start in zone_starts(market, params):
        units = _ZoneOpt(market, start, params, MOVES)
        assert units.waste.exact
        assert _ZoneOptFront(market, start, params, MOVES).solve().cost == pytest.approx(units.solve().cost, abs=1e-9)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_opt_is_never_dearer_than_any_policy(seed):
    params = Params(nodes=2, job_h=20, deadline_h=28, changeover_h=0.2, starts=4)
    market = market_of(markov_set(seed), params)
    for start in zone_starts(market, params):
        opt = simulate_opt_zones(market, start, params, MOVES)
        for policy in all_policies(market, MOVES, start):
            run = replay(market, start, params, MOVES, policy)
            if not run.missed:
                assert opt.cost <= run.cost + 1e-9, policy.name


# --------------------------------------------------------------------------------------- model
def test_a_pinned_policy_costs_what_the_one_zone_replay_costs():
    """The multi-zone replay of a policy kept in one zone is the single-zone replay (cost in $)."""
    traces = markov_set(7)
    params = Params(nodes=2, job_h=20, deadline_h=30, changeover_h=0.2, starts=3)
    market = market_of(traces, params)
    for start in zone_starts(market, params):
        for trace in traces:
            for name in ("up", "default", "greedy"):
                single = simulate_policy(trace, start, name, params)
                multi = replay(market, start, params, MOVES, Pinned(market.offers, MOVES, trace.name, make_policy(name)))
                assert multi.cost == pytest.approx(single.cost, rel=1e-9), (trace.name, name)
                assert multi.missed == single.missed and multi.moves == 0 and multi.probes == 0


def test_a_pinned_policy_decides_on_each_ticks_spot_price_as_the_one_zone_replay_does():
    """On a trace whose spot price changes, the pinned policy gave its one-zone policy the trace's first price
    every tick: here 0.5 where it is 3.6 after the first tick (on-demand 4), and default launched spot as if
    it were cheap, dearer than the one-zone replay of the same policy."""
    n = 800
    trace = Trace(path=Path("us-east4-a.json"), gap_seconds=600, data=tuple(markov_availability(3, n, 0.5, 3, 2)),
                  metadata={"gap_seconds": 600, "zone": "us-east4-a", "on_demand_price_per_hour": 4.0},
                  prices=(0.5,) + (3.6,) * (n - 1))
    params = Params(nodes=2, job_h=20, deadline_h=30, changeover_h=0.2, starts=2)
    market = market_of([trace], params)
    for start in zone_starts(market, params):
        single = simulate_policy(trace, start, "default", params)
        multi = replay(market, start, params, MOVES, Pinned(market.offers, MOVES, trace.name, make_policy("default")))
        assert multi.cost == pytest.approx(single.cost, rel=1e-9)


def test_default_ranks_the_zones_by_this_ticks_spot_prices_not_their_first():
    """Two zones of one region, spot always there: us-east4-a is the cheaper at the first tick (0.5) and the
    dearer from then on (3.6; us-east4-b 1.0, on-demand 4). Ranked by the first tick's price (the offers' list
    price) the job launched us-east4-a and never left it (a move needed a price 30 % below 0.5), paying 3.6
    for the whole job; at each tick's price it runs on us-east4-b (a tick on us-east4-a at most)."""
    n = 200
    a = Trace(path=Path("us-east4-a.json"), gap_seconds=600, data=(2,) * n,
              metadata={"gap_seconds": 600, "zone": "us-east4-a", "on_demand_price_per_hour": 4.0},
              prices=(0.5,) + (3.6,) * (n - 1))
    b = zone_trace("us-east4-b", (2,) * n, spot=1.0)
    params = Params(nodes=2, job_h=10, deadline_h=14, changeover_h=0.2, starts=1)
    market = market_of([a, b], params)
    run = replay(market, 0, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0))
    on_b = 2 * 1.0 * (params.job_h + 2 * params.changeover_h + 2 * 600 / 3600)  # B's job, two launches, a tick on A
    assert run.cost < on_b + 2 * 3.6 * 600 / 3600 + 1e-9 and not run.missed, run


def test_a_move_pays_transfer_time_and_egress_across_regions_only():
    traces = [zone_trace("us-east4-a", [2, 2, 0, 0, 0, 0] * 4), zone_trace("us-east4-b", [0, 0] + [2] * 22),
              zone_trace("europe-west1-c", [0, 0] + [2] * 22)]
    params = Params(nodes=2, job_h=1.0, deadline_h=3, changeover_h=0.2, starts=1)
    market = market_of(traces, params)
    a, b, eu = (next(o for o in market.offers if o.zone == z and o.spot) for z in
                ("us-east4-a", "us-east4-b", "europe-west1-c"))
    within = replay(market, 0, params, MOVES, Script(market.offers, MOVES, [a, a] + [b] * 12))
    across = replay(market, 0, params, MOVES, Script(market.offers, MOVES, [a, a] + [eu] * 12))
    assert within.moves == across.moves == 1
    assert within.egress == 0 and across.egress == pytest.approx(50 * 0.05)  # Northern America <-> Europe
    # both: 2 launches x 0.2 h + one 40-s transfer billed without progress, at 2 nodes x $1/h
    assert within.cost == pytest.approx(2 * (1.0 + 0.4 + 40 / 3600))
    assert across.cost == pytest.approx(within.cost + 2.5)
    assert within.changeover_cost == across.changeover_cost == pytest.approx(2 * (0.4 + 40 / 3600))


def test_a_run_lost_before_its_first_step_leaves_the_checkpoint_where_it_was():
    """Progress in us-east4-a; a launch in Europe is lost within its changeover (one 10-min tick of a
    12-min changeover): the newest checkpoint is still the one in us-east4-a, so going back there is no
    move and pays no egress; only the trip to Europe did (the copy there)."""
    traces = [zone_trace("us-east4-a", [2, 2, 0, 0] + [2] * 20), zone_trace("europe-west1-c", [0, 0, 2] + [0] * 21)]
    params = Params(nodes=2, job_h=1.0, deadline_h=3.5, changeover_h=0.2, starts=1)
    market = market_of(traces, params)
    a, eu = (next(o for o in market.offers if o.zone == z and o.spot) for z in ("us-east4-a", "europe-west1-c"))
    run = replay(market, 0, params, MOVES, Script(market.offers, MOVES, [a, a, eu, None, a] + [a] * 18), record=True)
    assert [r["offer"] for r in run.timeline][:5] == [a.name, a.name, eu.name, None, a.name]
    assert run.moves == 1 and run.egress == pytest.approx(50 * 0.05) and run.launches == 3
    assert run.launches_without_progress == 1  # the one to Europe
    assert run.done_h is not None


def test_launches_without_progress_count_each_run_that_ended_inside_its_changeover():
    """Spot for one 10-minute tick at a time cannot pay a 12-minute changeover: two launches into that flicker
    make no progress, the third into a longer run does; a job whose every run is a flicker counts each one,
    the last one too (the window ends inside it). On-demand replacing a run that has progressed counts none."""
    params = Params(nodes=2, job_h=1.0, deadline_h=3.0, changeover_h=0.2, starts=1)
    market = market_of([zone_trace("us-east4-a", [2, 0, 2, 0] + [2] * 20)], params)
    spot = next(o for o in market.offers if o.spot)
    od = next(o for o in market.offers if not o.spot)
    run = replay(market, 0, params, MOVES, Script(market.offers, MOVES, [spot, None, spot, None] + [spot] * 20))
    assert (run.launches, run.launches_without_progress, run.done_h is not None) == (3, 2, True), run
    switched = replay(market, 0, params, MOVES, Script(market.offers, MOVES, [None, None, None, None, spot, spot] + [od] * 20))
    assert (switched.launches, switched.launches_without_progress) == (2, 0), switched
    flicker = market_of([zone_trace("us-east4-a", [2, 0] * 12)], params)
    spot = next(o for o in flicker.offers if o.spot)
    never = replay(flicker, 0, params, MOVES, Script(flicker.offers, MOVES, [spot] * 24))
    assert never.missed and never.launches == never.launches_without_progress > 1, never


def test_a_probe_is_billed_one_minute_when_it_succeeds_and_nothing_when_it_fails():
    traces = [zone_trace("us-east4-a", [0] * 30), zone_trace("us-east4-b", [2] * 30)]
    params = Params(nodes=2, job_h=1.0, deadline_h=4, changeover_h=0.2, starts=1)
    market = market_of(traces, params)
    a, b = (next(o for o in market.offers if o.zone == z and o.spot) for z in ("us-east4-a", "us-east4-b"))

    class Prober(Script):
        ticks = 0

        def decide(self, obs, view):
            Prober.ticks += 1
            assert view.probe(a) is False and view.probe(b) is True
            return [] if obs.now_h < 0.5 - 1e-9 else super().decide(obs, view)

    run = replay(market, 0, params, MOVES, Prober(market.offers, MOVES, [b] * 30))
    # one billed probe (b) per tick, but for the tick that launches b: that probe is the launch, kept;
    # the failed one (a) is free
    assert run.probes == Prober.ticks - 1 > 3
    assert run.cost == pytest.approx(2 * 1.0 * (1.0 + 0.2) + run.probes * 2 * 1.0 / 60)


@pytest.mark.parametrize("plan", ["probed", "other"])
def test_a_probe_the_same_tick_launches_is_billed_as_the_run_only(plan):
    """Probe b, then launch it in the same tick: one instance, billed as the run it becomes (as a capacity search
    that is the launch), not a minute more; a probe of b followed by a launch of c is a probe released, billed."""
    traces = [zone_trace(z, [2] * 30) for z in ("us-east4-b", "us-east4-c")]
    params = Params(nodes=2, job_h=1.0, deadline_h=4, changeover_h=0.2, starts=1)
    market = market_of(traces, params)
    b, c = (next(o for o in market.offers if o.zone == z and o.spot) for z in ("us-east4-b", "us-east4-c"))
    launch = b if plan == "probed" else c

    class ProbeThenLaunch(Script):
        def decide(self, obs, view):
            if obs.running is None:
                assert view.probe(b) is True
            return super().decide(obs, view)

    run = replay(market, 0, params, MOVES, ProbeThenLaunch(market.offers, MOVES, [launch] * 30))
    assert run.launches == 1 and run.probes == (0 if plan == "probed" else 1)
    assert run.cost == pytest.approx(2 * 1.0 * (1.0 + 0.2) + run.probes * 2 * 1.0 / 60)


def test_the_safety_net_counts_the_transfer_to_the_on_demand_zone():
    """Spot only early in a zone whose on-demand is dear; the deadline is met on the cheaper zone's
    on-demand, transfer included, by every policy."""
    traces = [zone_trace("us-east4-a", [2] * 3 + [0] * 200, on_demand=9.0),
              zone_trace("europe-west1-c", [0] * 203, on_demand=4.0)]
    params = Params(nodes=2, job_h=10, deadline_h=12, changeover_h=0.2, starts=1)
    market = market_of(traces, params, [Shape("t", 2)])
    for policy in all_policies(market, Moves(checkpoint_gb=900, transfer_gbps=1), 0):
        run = replay(market, 0, params, Moves(checkpoint_gb=900, transfer_gbps=1), policy)  # 2 h transfer
        assert not run.missed, policy.name


def test_default_never_misses_where_opt_meets_the_deadline():
    params = Params(nodes=2, job_h=20, deadline_h=24, changeover_h=0.2, starts=4)
    for seed in (8, 9):
        market = market_of(markov_set(seed), params)
        for start in zone_starts(market, params):
            if not simulate_opt_zones(market, start, params, MOVES).missed:
                assert not replay(market, start, params, MOVES, ZoneDefault(market.offers, MOVES, seed=start)).missed


def random_market(seed: int):
    """A small random market: 1-4 zones, ticks of 195 s to 1 h, a changeover that may have no unit in common
    with the tick (0.2001 h) or be a whole number of ticks, a transfer that may have none either."""
    rng = random.Random(seed)
    gap = rng.choice([195, 300, 600, 3600])
    job = rng.uniform(3, 15)
    params = Params(nodes=2, job_h=job, deadline_h=job * rng.uniform(1.05, 1.6), starts=2,
                    changeover_h=rng.choice([0.0, 0.1, 0.2, 0.2001, 0.5, gap / 3600, 2 * gap / 3600]))
    moves = Moves(checkpoint_gb=rng.choice([0, 50, 100, 225]), transfer_gbps=rng.choice([1, 1.9, 10]))
    ticks = max(rng.randint(150, 500), int(params.deadline_h * 3600 / gap) + 5)
    traces = [zone_trace(zone, markov_availability(seed * 7 + i, ticks, rng.uniform(0.1, 0.95), rng.uniform(1.5, 20), 2),
                         gap_seconds=gap, spot=round(rng.uniform(0.5, 2), 3), on_demand=round(rng.uniform(3, 5), 3))
              for i, zone in enumerate(ZONE_NAMES[:rng.randint(1, 4)])]
    return market_of(traces, params), params, moves


def assert_opt_below_every_policy_and_default_meets_what_opt_meets(market, params, moves):
    for start in zone_starts(market, params):
        opt = simulate_opt_zones(market, start, params, moves)
        for policy in all_policies(market, moves, start):
            run = replay(market, start, params, moves, policy)
            assert run.missed or opt.cost <= run.cost + 1e-6, (policy.name, opt.cost, run.cost)
            assert not (policy.name == "default" and run.missed and not opt.missed)


@pytest.mark.parametrize("seed", range(40))
def test_on_random_markets_opt_is_below_every_policy_and_default_meets_what_opt_meets(seed):
    """The bound and the net on markets no constant was chosen on, both programs of opt included (the
    fronts where d or T has no unit in common with the tick)."""
    market, params, moves = random_market(seed)
    assert_opt_below_every_policy_and_default_meets_what_opt_meets(market, params, moves)


REGIONS_ZONES = (*ZONE_NAMES, "us-central1-b", "asia-southeast1-b")


def random_shaped_market(seed: int):
    """A harder random market than :func:`random_market`: 1-6 zones in up to four regions (egress and transfer
    on some moves), a second shape of the same GPUs (one 2-GPU node; on-demand, spot or both, and the first
    shape sometimes spot only), slack from a few minutes to hours, changeovers up to three ticks or an hour."""
    rng = random.Random(seed)
    gap = rng.choice([195, 300, 600, 1800, 3600])
    job = rng.uniform(2, 15)
    d = rng.choice([0.0, 0.1, 0.2001, 0.5, 1.0, gap / 3600, 3 * gap / 3600])
    slack = rng.choice([rng.uniform(0.05, 0.5), rng.uniform(0.5, 8)])
    params = Params(nodes=2, job_h=job, deadline_h=job + d + max(slack, 1.5 * gap / 3600), starts=2, changeover_h=d)
    moves = Moves(checkpoint_gb=rng.choice([0, 50, 225, 900]), transfer_gbps=rng.choice([1, 1.9, 10]))
    ticks = max(rng.randint(150, 500), int(params.deadline_h * 3600 / gap) + 5)
    traces = [zone_trace(zone, markov_availability(seed * 11 + i, ticks, rng.uniform(0.05, 0.95), rng.uniform(1.2, 30), 2),
                         gap_seconds=gap, spot=round(rng.uniform(0.3, 3.5), 3), on_demand=round(rng.uniform(3, 5), 3))
              for i, zone in enumerate(rng.sample(REGIONS_ZONES, rng.randint(1, 6)))]
    big = Shape("big", 1, 2, markets=rng.choice([(ON_DEMAND,), (SPOT,), (SPOT, ON_DEMAND)]))
    first = Shape("t", 2, markets=(SPOT,) if ON_DEMAND in big.markets and rng.random() < 0.3 else (SPOT, ON_DEMAND))
    return market_of(traces, params, [first, big]), params, moves


@pytest.mark.parametrize("seed", range(60))
def test_on_random_markets_with_two_shapes_opt_is_below_every_policy_and_default_meets_what_opt_meets(seed):
    """The same two facts where the net's on-demand may be another shape, a spot shape may be the only one a
    zone sells, moves may pay egress and transfer, and the slack may be under an hour (seeds 0-7999 of this
    generator were replayed once, outside the suite, with no failure)."""
    market, params, moves = random_shaped_market(seed)
    assert len({o.shape for o in market.offers}) == 2
    assert_opt_below_every_policy_and_default_meets_what_opt_meets(market, params, moves)


def test_failover_tries_the_zone_that_preempted_last():
    traces = [zone_trace(z, [2] * 50) for z in ZONE_NAMES]
    params = Params(nodes=2, job_h=5, deadline_h=8, changeover_h=0.2, starts=1)
    market = market_of(traces, params)
    policy = Failover(market.offers, MOVES, seed=1)
    first = policy.decide(replace(_obs(), running=None), None)
    policy.decide(replace(_obs(), running=first[0]), None)
    again = policy.decide(replace(_obs(), zone=first[0].zone, preempted=True), None)
    assert again[-1].zone == first[0].zone and {o.zone for o in again} == set(ZONE_NAMES)
    assert all(o.market == SPOT for o in again)


def test_default_learns_from_a_spot_run_lost_in_the_tick_it_was_launched():
    """us-east4-a is cheapest and up every other tick: each launch there is lost in its first tick, before
    the changeover is done. Such a run is a run (and a loss) for the ranking, so default stops going back;
    counted as nothing, the zone looked untried and was launched into again and again."""
    flicker = zone_trace("us-east4-a", [2, 0] * 150, spot=0.5)
    steady = zone_trace("us-central1-a", [2] * 300, spot=1.0)
    params = Params(nodes=2, job_h=20, deadline_h=40, changeover_h=0.2, starts=1)
    market = market_of([flicker, steady], params)
    policy = ZoneDefault(market.offers, MOVES, seed=0)
    run = replay(market, 0, params, MOVES, policy, record=True)
    bad = next(o for o in market.offers if o.spot and o.zone == "us-east4-a")
    tried = [r["offer"] for r in run.timeline].count(bad.name)
    assert policy.losses[bad] == tried >= 1 and tried <= 3, (tried, policy.losses)
    assert not run.missed and run.launches <= 6, run.launches  # before: 16, 15 of them into us-east4-a


@pytest.mark.parametrize("start", [0, 7])
def test_default_gives_up_sooner_on_a_zone_whose_runs_cannot_pay_their_changeover(start):
    """us-central1-a is cheapest (0.6) but its runs last 2 ticks, under the 4-tick changeover: no launch there
    makes progress. europe-west1-c (1.0) gives 3-h runs and 2-h outages. With the pooled mean run weighing as
    much as a run of its own, after its first loss us-central1-a still looked half as good as the pool and was
    tried 3 times, 2.7 h of changeovers (1.33 / 1.44 x opt); weighed as 0.7 of a run, twice (1.28 / 1.22 x).
    Outages all 2 h long are the one-zone budget's weak case: it waits up to a in each outage, then runs
    on-demand, and here an excursion stops paying for its changeover long before the wait the slack affords,
    so the job waits out every outage and ends on on-demand at the pace line (start 0: 1.28 x; 1.20 x while
    the simulated inner policy counted its wait from its first idle tick, not the outage's start, as the
    watcher's does)."""
    good = zone_trace("europe-west1-c", (([2] * 18 + [0] * 12) * 20)[:600], spot=1.0)
    short = zone_trace("us-central1-a", (([2] * 2 + [0] * 3) * 120)[:600], spot=0.6)
    params = Params(nodes=2, job_h=20, deadline_h=40, changeover_h=4 / 6, starts=1)
    market = market_of([good, short], params)
    run = replay(market, start, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0), record=True)
    name = next(o for o in market.offers if o.spot and o.zone == "us-central1-a").name
    tries = sum(1 for before, now in zip([None, *run.timeline], run.timeline)
                if now["offer"] == name and (before is None or before["offer"] != name))
    opt = simulate_opt_zones(market, start, params, MOVES)
    assert tries <= 2 and not run.missed, tries
    assert run.cost_vs_on_demand <= 1.3 * opt.cost_vs_on_demand, (run.cost_vs_on_demand, opt.cost_vs_on_demand)


def test_default_counts_its_wait_from_the_outage_not_from_its_first_idle_tick():
    """The inner market policy goes on-demand in an outage once waiting this long in every outage left would
    not fit in the slack, so "this long" is the wait since the job last held something. The watcher asks its
    policy every tick, spot ticks included; the simulated default must tell its inner policy of those ticks
    too, or a loss after 3 h on spot counts as 3 h of waiting (it did: the wait counted from the first tick)."""
    up = zone_trace("us-central1-a", [2] * 18 + [0] * 282)
    down = zone_trace("us-east4-a", [0] * 300)
    params = Params(nodes=2, job_h=20, deadline_h=40, changeover_h=0.2, starts=1)
    market = market_of([up, down], params)
    seen = []

    class Watched(ZoneDefault):
        def _decide(self, obs, market):
            plan = super()._decide(obs, market)
            seen.append((obs.now_h, obs.running, self.inner.idle_since))
            return plan

    replay(market, 0, params, MOVES, Watched(market.offers, MOVES, seed=0))
    assert seen[0][2] == 0.0 and all(since is None for now, running, since in seen if running is not None and running.spot)
    lost = next((now, since) for now, running, since in seen if now > 0 and running is None)
    assert lost == (pytest.approx(3.0), pytest.approx(3.0)), lost


def test_default_forgets_a_zone_whose_runs_turned_into_flicker():
    """us-east4-a (0.8) gives 2-h runs for 26 h, then capacity every other tick; us-central1-a (1.0) 5-h runs
    and 1-h outages. Over its whole history us-east4-a's mean run stayed above an hour long after the change,
    and the job launched into its flicker 51 times (0.306 of on-demand, opt 0.236); its latest runs
    (RUN_WINDOW) show the change, and the job runs us-central1-a."""
    a = zone_trace("us-east4-a", ([2] * 12 + [0]) * 12 + [2, 0] * 150, spot=0.8)
    b = zone_trace("us-central1-a", (([2] * 30 + [0] * 6) * 13)[:456], spot=1.0)
    params = Params(nodes=2, job_h=30, deadline_h=60, changeover_h=0.2, starts=1)
    market = market_of([a, b], params)
    run = replay(market, 0, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0), record=True)
    into_flicker = sum(1 for r in run.timeline[156:] if r["offer"] and r["offer"].startswith("us-east4-a/"))
    opt = simulate_opt_zones(market, 0, params, MOVES)
    assert into_flicker <= 15 and not run.missed, into_flicker
    assert run.cost_vs_on_demand <= 1.2 * opt.cost_vs_on_demand, (run.cost_vs_on_demand, opt.cost_vs_on_demand)


def _one_cheap_zone_with_outages(deadline_h: float):
    """us-east4-a: spot at 0.8, 5-h runs and 1-h outages; us-central1-a: spot at 1.3, always up."""
    good = zone_trace("us-east4-a", ([2] * 30 + [0] * 6) * 12, spot=0.8)
    dear = zone_trace("us-central1-a", [2] * 432, spot=1.3)
    params = Params(nodes=2, job_h=20, deadline_h=deadline_h, changeover_h=0.2, starts=1)
    market = market_of([good, dear], params)
    run = replay(market, 0, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0), record=True)
    dear_ticks = sum(1 for r in run.timeline if r["offer"] and r["offer"].startswith("us-central1-a/"))
    return run, dear_ticks, simulate_opt_zones(market, 0, params, MOVES)


def test_default_waits_for_its_best_zone_when_the_slack_can_pay_for_it():
    """With 20 h of slack, the 1-h outages of the cheap zone are waited out: running the dearer zone in
    them saves slack the job does not need, at 60 % more per hour (before: 11 h on it, 0.2926 vs opt
    0.2079, because the dearer run went on after the cheap zone was back)."""
    run, dear_ticks, opt = _one_cheap_zone_with_outages(40)
    assert dear_ticks == 0 and not run.missed
    assert run.cost_vs_on_demand <= 1.01 * opt.cost_vs_on_demand, (run.cost_vs_on_demand, opt.cost_vs_on_demand)


def test_default_runs_a_dearer_zone_in_the_outages_when_the_slack_is_scarce():
    """With 2 h of slack, waiting out the cheap zone's outages would not finish in time: the dearer zone
    is worth its price, and the job does not miss."""
    run, dear_ticks, _ = _one_cheap_zone_with_outages(22)
    assert dear_ticks > 0 and not run.missed


def test_default_waits_for_a_few_good_zones_together_instead_of_a_pricey_one():
    """us-east4-a and -b (spot 0.8) each have 1-h runs and 1- or 2-h outages; both are down a third of the
    time. us-central1-a is up all the time, at 3.0 (on-demand 4.0). With 20 h of slack, waiting for either
    east4 zone finishes in time, though neither alone would: once the job has learned that, it waits
    instead of running the pricey zone (before: it kept running us-central1-a in some outages, because
    only the best zone alone was weighed, 0.5746 of on-demand vs opt 0.3738)."""
    n = 480
    a = zone_trace("us-east4-a", (([2] * 6 + [0] * 6) * 40)[:n], spot=0.8)
    b = zone_trace("us-east4-b", (([0] * 2 + [2] * 6 + [0] * 4) * 40)[:n], spot=0.8)
    pricey = zone_trace("us-central1-a", [2] * n, spot=3.0)
    params = Params(nodes=2, job_h=20, deadline_h=40, changeover_h=0.2, starts=1)
    market = market_of([a, b, pricey], params)
    run = replay(market, 0, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0), record=True)
    late = [r["offer"] for r in run.timeline[120:] if r["offer"]]
    opt = simulate_opt_zones(market, 0, params, MOVES)
    assert late and not any(o.startswith("us-central1-a/") for o in late) and not run.missed
    assert run.cost_vs_on_demand <= 1.4 * opt.cost_vs_on_demand, (run.cost_vs_on_demand, opt.cost_vs_on_demand)


@pytest.mark.parametrize("deadline_h", [24, 30])
def test_default_does_not_launch_a_pricey_zone_for_a_flicker_of_the_cheap_one(deadline_h):
    """us-east4-a (spot 0.8) is down for one tick every 3 h; europe-west1-c is up all the time at 3.4
    (on-demand 4.0). Launching the pricey zone in such a tick buys a changeover there and one back when
    the cheap zone returns, for no progress: the job waits the tick out. Before, with 4 or 10 h of slack,
    it ran europe-west1-c in 6 or 2 of the 7 flickers (0.3488 / 0.2588 of on-demand vs opt 0.2139), as at
    N = 16 on the bundled GCP traces, where it paid asia-south2-b's spot price for a tick of us-central1-a."""
    n = 6 * deadline_h
    cheap = zone_trace("us-east4-a", (([2] * 17 + [0]) * 40)[:n], spot=0.8)
    pricey = zone_trace("europe-west1-c", [2] * n, spot=3.4)
    params = Params(nodes=2, job_h=20, deadline_h=deadline_h, changeover_h=0.2, starts=1)
    market = market_of([cheap, pricey], params)
    run = replay(market, 0, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0), record=True)
    pricey_ticks = sum(1 for r in run.timeline if r["offer"] and r["offer"].startswith("europe-west1-c/"))
    opt = simulate_opt_zones(market, 0, params, MOVES)
    assert pricey_ticks == 0 and not run.missed, pricey_ticks
    assert run.cost_vs_on_demand <= 1.01 * opt.cost_vs_on_demand, (run.cost_vs_on_demand, opt.cost_vs_on_demand)


def test_a_stay_ends_at_the_first_of_the_run_and_the_return_of_a_zone_the_job_would_move_to():
    """stay_h: the mean of the minimum of exponentials, B's run and the rest of each outage of an offer found
    down that ranks below B's price by the move margin, that rest one standard error long."""
    shape = Shape("t", 2)
    cheap, mid, pricey, od = (Offer("us-east4-a", shape, SPOT, 0.8), Offer("us-east4-b", shape, SPOT, 3.0),
                              Offer("us-central1-a", shape, SPOT, 3.4), Offer("us-east4-a", shape, ON_DEMAND, 4.0))
    policy = ZoneDefault((cheap, mid, pricey, od), MOVES)
    obs = _obs()
    for offer in (cheap, mid):  # one ended outage of 0.5 h, and down since now
        policy.outages.ended[offer], policy.outages.since[offer] = [0.5], obs.now_h
    runs = {cheap: 2.0, mid: 2.0, pricey: 4.0}
    rest = (0.5 + policy.inner.prior_down) / 2 * (1 + 1 / math.sqrt(2))
    assert policy.stay_h(obs, pricey, runs, []) == 4.0
    assert policy.stay_h(obs, pricey, runs, [mid]) == 4.0  # not 30 % cheaper: the job would stay on B
    assert policy.stay_h(obs, pricey, runs, [cheap, mid]) == pytest.approx(1 / (1 / 4.0 + 1 / rest))


def test_default_tries_a_zone_it_has_not_seen_lose_after_a_bad_start_elsewhere():
    """The two us-east4 zones flicker (20-minute runs) from the start; europe-west1-c has no capacity for
    3 h, then all of it. The pooled mean run of the flickering zones made europe-west1-c look dearer
    than on-demand (egress spread over short runs), so it was never tried: 95 launches, 0.84 of
    on-demand (opt 0.25). An offer never seen to lose keeps the prior run in the ranking."""
    n = 600
    flicker_a = zone_trace("us-east4-a", ([2, 2, 0, 0] * n)[:n])
    flicker_b = zone_trace("us-east4-b", ([0, 0, 2, 2] * n)[:n])
    late = zone_trace("europe-west1-c", [0] * 18 + [2] * (n - 18))
    params = Params(nodes=2, job_h=20, deadline_h=40, changeover_h=0.2, starts=1)
    market = market_of([flicker_a, flicker_b, late], params)
    run = replay(market, 0, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0), record=True)
    in_europe = sum(1 for r in run.timeline if r["offer"] and r["offer"].startswith("europe-west1-c/"))
    opt = simulate_opt_zones(market, 0, params, MOVES)
    assert in_europe > 60 and not run.missed, (in_europe, run.launches)
    assert run.cost_vs_on_demand <= 1.3 * opt.cost_vs_on_demand, (run.cost_vs_on_demand, opt.cost_vs_on_demand)


def test_default_keeps_slack_for_a_zone_that_comes_up_late():
    """us-east4-a and -b (spot 0.8) give 20-minute runs, an hour apart; europe-west1-c (spot 1.0) has no
    capacity for 18 h, then all of it. With 12 h of slack, waiting through the flicker spent the slack
    before europe-west1-c came up, and the net kept the job on on-demand to the end (0.960 of on-demand,
    opt 0.415). The multi-zone ``default`` runs on-demand instead of waiting below half of Uniform
    Progress's slack, and still has slack to move when the long run comes."""
    n = 600
    a = zone_trace("us-east4-a", ([2, 2, 0, 0, 0, 0, 0, 0] * n)[:n], spot=0.8)
    b = zone_trace("us-east4-b", ([0, 0, 0, 0, 2, 2, 0, 0] * n)[:n], spot=0.8)
    late = zone_trace("europe-west1-c", [0] * 108 + [2] * (n - 108))
    params = Params(nodes=2, job_h=24, deadline_h=36, changeover_h=0.2, starts=1)
    market = market_of([a, b, late], params)
    run = replay(market, 0, params, MOVES, ZoneDefault(market.offers, MOVES, seed=0), record=True)
    in_europe = sum(1 for r in run.timeline if r["offer"] and r["offer"].startswith("europe-west1-c/")) / 6
    opt = simulate_opt_zones(market, 0, params, MOVES)
    assert in_europe > 12 and not run.missed, (in_europe, run.launches)
    assert run.cost_vs_on_demand <= 1.3 * opt.cost_vs_on_demand, (run.cost_vs_on_demand, opt.cost_vs_on_demand)


def test_outages_are_counted_only_when_watched_without_a_gap():
    from kit.policy.zones import OutageLog

    a, b = (Offer(z, Shape("t", 2), SPOT, 1.0) for z in ("a", "b"))
    log, tick = OutageLog([a, b]), 0.5
    for t, up in ((0, False), (0.5, False), (1.0, True)):  # watched every tick: a 1-h outage
        log.seen(a, up, t, tick)
    for t, up in ((0, False), (2.0, False), (2.5, True)):  # a gap: only the watched 0.5 h counts
        log.seen(b, up, t, tick)
    assert log.ended[a] == [1.0] and log.ended[b] == [0.5]
    log.seen(a, False, 3.0, tick)
    assert log.rest(a, 4.0, prior_h=0.25, weight=1.0) == pytest.approx((1.0 + 1.0 + 0.25) / 2)
    assert log.mean(a, prior_h=0.25, weight=1.0) == pytest.approx((1.0 + 0.25) / 2)


def _obs():
    from kit.policy.zones import ZoneObservation

    return ZoneObservation(now_h=1, progress_h=1, job_h=5, deadline_h=8, changeover_h=0.2, tick_h=1 / 6,
                           running=None, zone=None, checkpoint_zone=None)


# --------------------------------------------------------------------------------------- offers
def test_shapes_must_have_the_same_gpu_count():
    with pytest.raises(InputError, match="same total GPU count"):
        check_shapes([Shape("a3-highgpu-1g", 16, 1), Shape("a3-highgpu-8g", 1, 8)])
    check_shapes([Shape("a3-highgpu-1g", 16, 1), Shape("a3-highgpu-8g", 2, 8)])


def test_offers_file_shapes_and_prices(tmp_path):
    path = tmp_path / "offers.yaml"
    path.write_text("shapes:\n"
                    "  - {instance_type: a3-highgpu-1g, nodes: 16, markets: [spot]}\n"
                    "  - {instance_type: a3-highgpu-8g, nodes: 2, gpus_per_node: 8, markets: [on-demand],"
                    " on_demand_price: 80}\n")
    shapes, prices = load_offers(path)
    traces = [zone_trace("us-east4-a", [16] * 400, instance_type="a3-highgpu-1g")]
    market = ZoneSet.of(traces, shapes, Params(nodes=16), prices)
    assert [(o.shape.name, o.market, o.price) for o in market.offers] == [
        ("16xa3-highgpu-1g", SPOT, 16.0), ("2xa3-highgpu-8g", ON_DEMAND, 160.0)]
    path.write_text("shapes:\n  - {instance_type: x, nodes: 0}\n")
    with pytest.raises(InputError, match="nodes"):
        load_offers(path)


@pytest.mark.parametrize(("text", "where", "what"), [
    ("", "", "the offers file is empty"),
    ("- {instance_type: a, nodes: 1}\n", "", "must be a YAML mapping (key: value), not a list"),
    ("shapes: 3\n", ": shapes", "Input should be a valid list (got 3)"),
    ("shapes:\n  - a3-highgpu-1g\n", ": shapes.0", "Input should be a mapping (got 'a3-highgpu-1g')"),
    ("shapes:\n  - {instance_type: a, nodes: 1, zone: us-east4-a}\n", ": shapes.0.zone", "unknown key 'zone'"),
    ("shapes:\n  - {nodes: 1}\n", ": shapes.0.instance_type", "required field 'instance_type' is missing"),
])
def test_a_bad_offers_file_says_what_and_where_in_the_user_s_words(tmp_path, text, where, what):
    path = tmp_path / "offers.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_offers(path)
    assert info.value.where == f"{path}{where}" and what in info.value.what, info.value.render()
    assert "_ShapeFile" not in info.value.render() and "_OffersFile" not in info.value.render()
    assert info.value.fix


def test_regions_and_default_egress():
    assert region_of("us-central1-a") == "us-central1" and region_of("us-east-1a") == "us-east-1"
    moves = Moves()
    assert moves.egress("us-east4-a", "us-east4-b") == 0
    assert moves.egress("us-east4-a", "us-central1-a") == pytest.approx(50 * 0.02)
    assert moves.egress("us-east4-a", "asia-south2-b") == pytest.approx(50 * 0.08)
    assert moves.transfer_h(None, "us-east4-a") == 0 and moves.transfer_h("a", "b") == pytest.approx(40 / 3600)


def test_cli_zones_all_json_and_errors():
    result = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", "--zones", "us-central1-a,us-east4-a",
                                 "--starts", "2", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["zones"] == ["us-central1-a", "us-east4-a"] and summary["runs"] == 2
    assert set(summary["cost_vs_on_demand"]) == {"opt", "default", "failover", "up@mean-zone", "up@best-zone",
                                                 "default@mean-zone", "default@best-zone"}
    assert all(summary["cost_vs_on_demand"]["opt"] <= v + 1e-9 for v in summary["cost_vs_on_demand"].values())
    assert {"moves", "probes", "egress", "changeover_cost", "launches_without_progress", "deadline_misses"} <= set(summary)
    # opt's program does not rebuild its schedule: its schedule fields are null, not zeros
    assert summary["moves"]["opt"] is None and summary["changeover_cost"]["opt"] is None
    assert summary["changeover_cost"]["default"] > 0
    table = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", "--zones", "us-central1-a,us-east4-a", "--starts", "2"])
    assert table.exit_code == 0, table.output
    opt_row = next(line for line in table.output.splitlines() if line.startswith("opt "))
    assert opt_row.split()[-4:] == ["-", "-", "-", "-"], opt_row
    bad = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", "--zones", "mars-1a"])
    assert bad.exit_code != 0 and "--zones" in bad.output and "us-central1-a" in bad.output
    for policy in ("", ","):  # named no policy: crashed on the empty table before
        bad = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", "--zones", "us-east4-a", "--policy", policy])
        assert bad.exit_code == 2 and "--policy" in bad.output and "failover" in bad.output, bad.output


def test_the_mean_zone_row_misses_the_mean_over_zones_out_of_runs():
    """``P@mean-zone``'s cost is the mean over zones; its misses are too (each zone's count of the ``runs``
    starts), not the sum over zones, which counted every start once per zone and exceeded ``runs``."""
    params = Params(nodes=2, job_h=10, deadline_h=10.1, changeover_h=0.2, starts=3)  # past the deadline at once
    traces = [zone_trace("us-east4-a", markov_availability(1, 200, 0.5, 3, 2)), zone_trace("us-east4-b", [2] * 200)]
    summary = simulate_zones(traces, ["up@each", "up@us-east4-a", "up@us-east4-b"], params, MOVES)
    misses = summary["deadline_misses"]
    assert summary["runs"] == 3 and misses["up@us-east4-a"] == misses["up@us-east4-b"] == 3
    assert misses["up@mean-zone"] == 3.0 and misses["up@best-zone"] == 3


def test_simulate_zones_refuses_traces_with_different_ticks():
    params = Params(nodes=2, job_h=5, deadline_h=8, starts=1)
    with pytest.raises(InputError, match="same ticks"):
        simulate_zones([zone_trace("a-1a", [2] * 100), zone_trace("b-1a", [2] * 90)], ["opt"], params, MOVES)


def test_an_offer_is_hashable_and_named():
    offer = Offer("us-east4-a", Shape("t", 2), SPOT, 2.0)
    assert {offer: 1}[Offer("us-east4-a", Shape("t", 2), SPOT, 2.0)] == 1
    assert offer.name == "us-east4-a/2xt/spot"


def test_cli_offers_file_of_the_example():
    root = Path(__file__).resolve().parents[4]
    offers = root / "examples" / "offers-gcp-a3.yaml"
    result = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", "--zones", "us-central1-a,us-east4-a",
                                 "--offers", str(offers), "--starts", "1", "--policy", "opt,default", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["params"]["shapes"] == ["16xa3-highgpu-1g", "2xa3-highgpu-8g"]
    assert {o["offer"] for o in summary["offers"]} == {
        f"{z}/{s}" for z in ("us-central1-a", "us-east4-a") for s in ("16xa3-highgpu-1g/spot", "2xa3-highgpu-8g/on-demand")}
    alone = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", "--offers", str(offers)])
    assert alone.exit_code != 0 and "--zones all" in alone.output


SHAPE_FLAGS = ["--shape", "a3-highgpu-1g:16:1:spot", "--shape", "a3-highgpu-8g:2:8:on-demand"]


def test_shape_flags_give_the_shapes_of_the_example_offers_file():
    root = Path(__file__).resolve().parents[4]
    shapes, prices = shapes_from_flags(SHAPE_FLAGS[1::2])
    assert (shapes, prices) == load_offers(root / "examples" / "offers-gcp-a3.yaml")
    assert shapes_from_flags(["a3-highgpu-8g:2"])[0] == [Shape("a3-highgpu-8g", 2, 1, (SPOT, ON_DEMAND))]


@pytest.mark.parametrize(("flags", "match"), [
    (["a3-highgpu-1g"], "TYPE:NODES"), (["a:1:1:spot:x"], "TYPE:NODES"), (["a3-highgpu-1g:0"], "nodes"),
    (["a3-highgpu-1g:many"], "nodes"), (["a3-highgpu-1g:16:1:spot+reserved"], "markets"),
    (["a3-highgpu-1g:16:1:spot", "a3-highgpu-8g:1:8:on-demand"], "same total GPU count"),
    (["a3-highgpu-1g:16", "a3-highgpu-1g:16:1:spot"], "16xa3-highgpu-1g is sold spot twice"),
    (["a3-highgpu-1g:16:1:on-demand+on-demand"], "lists on-demand twice in its markets")])
def test_bad_shape_flags_are_input_errors_that_name_the_flag(flags, match):
    with pytest.raises(InputError, match=match) as error:
        shapes_from_flags(flags)
    assert "--shape" in error.value.where


def test_cli_shape_flags_replay_as_the_offers_file_does():
    root = Path(__file__).resolve().parents[4]
    common = ["simulate", "gcp-a3-h100-2025-10", "--zones", "us-central1-a,us-east4-a", "--starts", "1",
              "--policy", "opt,default", "--json"]
    flags = runner.invoke(app, [*common, *SHAPE_FLAGS])
    assert flags.exit_code == 0, flags.output
    from_file = runner.invoke(app, [*common, "--offers", str(root / "examples" / "offers-gcp-a3.yaml")])
    assert json.loads(flags.output) == json.loads(from_file.output)
    both = runner.invoke(app, [*common, *SHAPE_FLAGS, "--offers", str(root / "examples" / "offers-gcp-a3.yaml")])
    assert both.exit_code != 0 and "not both" in both.output
    one_zone = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", *SHAPE_FLAGS])
    assert one_zone.exit_code != 0 and "--zones all" in one_zone.output


def test_cli_table_keeps_its_columns_with_a_long_best_zone_name():
    result = runner.invoke(app, ["simulate", "gcp-a3-h100-2025-10", "--zones", "us-central1-a,asia-southeast1-c",
                                 "--starts", "1", "--policy", "default,up@each,default@each"])
    assert result.exit_code == 0, result.output
    rows = result.output.splitlines()[1:]
    assert any("(asia-southeast1-c)" in row for row in rows), result.output
    # every cost ends where the header's "cost vs on-demand" ends (8 columns of numbers close each row)
    header, *lines = rows
    ends = {header.index("cost vs on-demand") + len("cost vs on-demand")}
    ends |= {re.match(r"(.*?\S)(\s+\S+){8}$", line).end(1) for line in lines}
    assert len(ends) == 1, result.output


def test_traces_of_different_windows_are_not_one_market():
    """The set's zones are replayed as simultaneous; two zones a week apart made a market that never was."""
    params = Params(nodes=2, job_h=1.0, deadline_h=2, changeover_h=0.2, starts=1)
    a = zone_trace("us-east4-a", [2] * 24, start_utc="2025-10-04T00:10:00Z")
    b = zone_trace("us-east4-b", [2] * 24, start_utc="2025-10-11T00:10:00Z")
    with pytest.raises(InputError, match="us-east4-b starts at 2025-10-11T00:10Z, us-east4-a at 2025-10-04T00:10Z"):
        market_of([a, b], params)
    market_of([a, zone_trace("us-east4-b", [2] * 24, start_utc="2025-10-04T00:12:00Z")], params)  # within a tick


@pytest.mark.parametrize(("shape", "field", "what"), [
    ("{instance_type: a3-highgpu-1g, nodes: true}", "nodes", "not true/false"),  # was taken as 1 node
    ("{instance_type: a3-highgpu-1g, nodes: 1, gpus_per_node: yes}", "gpus_per_node", "not true/false"),
    ("{instance_type: a3-highgpu-1g, nodes: 1, spot_price: true}", "spot_price", "not true/false"),
    ("{instance_type: a3-highgpu-1g, nodes: 1, on_demand_price: 1.0e+308}", "on_demand_price", "less than or equal"),
    ("{instance_type: a3-highgpu-1g, nodes: 1001}", "nodes", "less than or equal"),
])
def test_an_offers_file_refuses_booleans_and_huge_prices(tmp_path, shape, field, what):
    path = tmp_path / "offers.yaml"
    path.write_text(f"shapes:\n  - {shape}\n")
    with pytest.raises(InputError) as info:
        load_offers(path)
    assert info.value.where == f"{path}: shapes.0.{field}" and what in info.value.what, info.value.render()


def test_shape_flags_are_strings_and_still_numbers():
    shapes, _ = shapes_from_flags(["a3-highgpu-1g:16:1:spot", "a3-highgpu-8g:2:8:on-demand"])
    assert [(s.instance_type, s.nodes, s.gpus_per_node) for s in shapes] == [
        ("a3-highgpu-1g", 16, 1), ("a3-highgpu-8g", 2, 8)]

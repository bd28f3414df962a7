"""The capacity search's order (kit.policy.zones.search_order), shared by the watcher and ``failover``."""
from __future__ import annotations

import random

import pytest

from kit.policy.market import SPOT
from kit.policy.offers import Offer, Shape

WIDE, TALL = Shape("local", 2, 1), Shape("local", 1, 2)


def offers(zones, shapes=(WIDE, TALL), markets=("spot", "on-demand")) -> tuple[Offer, ...]:
    return tuple(Offer(z, s, m, 2.0 if m == "spot" else 8.0 + (s is TALL)) for z in zones for s in shapes
                 for m in markets)


def test_the_running_zone_first_then_shuffled_zones_then_the_preempting_zone_last():
    from kit.policy.zones import search_order

    market = offers(["a", "b", "c", "d", "e"])
    running = market[0]  # a / WIDE / spot
    orders = set()
    for seed in range(30):
        order = search_order(market, "spot", random.Random(seed), current=running)
        zones = list(dict.fromkeys(o.zone for o in order))
        assert zones[0] == "a" and sorted(zones) == ["a", "b", "c", "d", "e"]
        assert all(o.market == "spot" for o in order) and len(order) == 10
        orders.add(tuple(zones))
        preempted = search_order(market, "spot", random.Random(seed), current=running, preempted_zone="a")
        assert [o.zone for o in preempted][-2:] == ["a", "a"]  # the zone that just preempted: last
        assert [o.shape for o in order[:2]] == [WIDE, TALL]  # the running shape first in a zone
    assert len(orders) > 5, "the other zones are shuffled"
    assert search_order(market, "spot", random.Random(3)) == search_order(market, "spot", random.Random(3))


def test_on_demand_cheapest_first_within_a_zone_and_only_offers_of_the_market():
    from kit.policy.zones import search_order

    market = offers(["a"]) + tuple(Offer("b", Shape("a3-highgpu-1g", 8, 1), "spot", 1.0) for _ in range(1))
    order = search_order(market, "on-demand", random.Random(0))
    assert [(o.zone, o.shape, o.price) for o in order] == [("a", WIDE, 8.0), ("a", TALL, 9.0)]
    assert search_order(market, "on-demand", random.Random(0), current=Offer("a", TALL, "spot", 2.0))[0].shape == TALL
    assert search_order((), "spot", random.Random(0)) == []


def test_an_on_demand_launch_stays_in_the_zone_whose_spot_was_just_lost():
    """A spot preemption in a says nothing about on-demand capacity there: the on-demand search starts in a
    (no checkpoint to move, no new disks) on the running shape, whatever the shuffle; then the other zones,
    the running shape first. A spot search still leaves a for last."""
    from kit.policy.zones import search_order

    market = offers(["a", "b", "c"])
    running = Offer("a", TALL, "spot", 2.0)
    for seed in range(20):
        order = search_order(market, "on-demand", random.Random(seed), current=running, preempted_zone="a")
        assert [(o.zone, o.shape) for o in order[:2]] == [("a", TALL), ("a", WIDE)], (seed, order)
        assert {o.zone for o in order[2:]} == {"b", "c"} and [o.shape for o in order[2:4]] == [TALL, TALL]
        assert search_order(market, "spot", random.Random(seed), current=running, preempted_zone="a")[-1].zone == "a"


def test_default_ranks_the_other_zones_by_what_their_spot_runs_were_worth():
    """After a preemption in a, the zones that held long runs come before those that preempted quickly,
    whatever the shuffle; a zone no run has been seen in is assumed good (the prior), the preempting zone
    is last and the running zone first otherwise; on-demand keeps the cheapest-first order."""
    from kit.policy.offers import Moves
    from kit.policy.zones import learned_order, search_order

    market = offers(["a", "b", "c", "d"], shapes=(WIDE,))
    spot = {o.zone: o for o in market if o.market == "spot"}
    hours = {spot["a"]: 10.0, spot["b"]: 30.0, spot["c"]: 0.6}  # c: three runs of 12 minutes
    losses = {spot["a"]: 1, spot["b"]: 1, spot["c"]: 3}
    kw = {"hours": hours, "losses": losses, "changeover_h": 0.2, "moves": Moves()}
    for seed in range(20):
        after = learned_order(market, "spot", random.Random(seed), current=spot["a"], preempted_zone="a", **kw)
        assert [o.zone for o in after] == ["b", "d", "c", "a"], (seed, after)
        staying = learned_order(market, "spot", random.Random(seed), current=spot["a"], **kw)
        assert [o.zone for o in staying] == ["a", "b", "d", "c"]
    same = {"hours": {}, "losses": {}, "changeover_h": 0.2, "moves": Moves()}
    zones = {tuple(o.zone for o in learned_order(market, "spot", random.Random(s), **same)) for s in range(20)}
    assert len(zones) > 3, "no history: the shuffle decides, as failover"
    assert learned_order(market, "on-demand", random.Random(1), **kw) == search_order(market, "on-demand", random.Random(1))


def test_the_capacity_search_tries_a_zone_it_has_not_seen_lose_before_known_short_ones():
    """a and c lost three 12-minute runs each, b one 1-h run: the pooled mean is under an hour. d has no
    run of its own, so it keeps the prior (4 h) and is tried first, not ranked as the pool's record."""
    from kit.policy.offers import Moves
    from kit.policy.zones import learned_order

    market = offers(["a", "b", "c", "d"], shapes=(WIDE,))
    spot = {o.zone: o for o in market if o.market == "spot"}
    hours = {spot["a"]: 0.6, spot["b"]: 1.0, spot["c"]: 0.6}
    losses = {spot["a"]: 3, spot["b"]: 1, spot["c"]: 3}
    for seed in range(10):
        order = learned_order(market, "spot", random.Random(seed), hours=hours, losses=losses, changeover_h=0.2,
                              moves=Moves())
        assert order[0].zone == "d" and order[1].zone == "b", (seed, [o.zone for o in order])


def test_the_capacity_search_leaves_out_spot_offers_dearer_per_hour_of_progress_than_on_demand():
    """a lost twelve 3-minute runs: with a 0.2-h changeover an hour of progress there costs far more than on
    the cheapest on-demand offer (the ceiling), so the search leaves it out, as the multi-zone ``default``
    never launches it; b, never seen to lose, stays. An on-demand price that is not known sets no ceiling."""
    from kit.policy.offers import Moves
    from kit.policy.zones import learned_order, spot_ceiling

    market = offers(["a", "b"], shapes=(WIDE,))
    spot = {o.zone: o for o in market if o.market == "spot"}
    kw = {"hours": {spot["a"]: 0.6}, "losses": {spot["a"]: 12}, "changeover_h": 0.2, "moves": Moves()}
    ceiling = spot_ceiling(market)
    assert ceiling == min(o.price for o in market if o.market == "on-demand")
    assert [o.zone for o in learned_order(market, "spot", random.Random(0), ceiling=ceiling, **kw)] == ["b"]
    assert {o.zone for o in learned_order(market, "spot", random.Random(0), **kw)} == {"a", "b"}
    assert spot_ceiling(tuple(Offer(o.zone, o.shape, o.market, 0.0 if o.market == "on-demand" else o.price)
                              for o in market)) is None


def test_the_run_record_keeps_the_latest_runs_of_each_offer():
    from kit.policy.zones import RUN_WINDOW, RunRecord

    a, b = (Offer(z, Shape("t", 2), SPOT, 1.0) for z in ("a", "b"))
    record = RunRecord([a, b])
    record.add(a, 20.0, lost=True)  # the old regime: one long run
    for _ in range(RUN_WINDOW - 1):
        record.add(a, 0.5, lost=True)
    assert record.hours[a] == pytest.approx(20.0 + 0.5 * (RUN_WINDOW - 1)) and record.losses[a] == RUN_WINDOW
    record.add(a, 0.5, lost=False)  # one more: the long run leaves the window; a left run is no loss
    assert record.hours[a] == pytest.approx(0.5 * RUN_WINDOW) and record.losses[a] == RUN_WINDOW - 1
    assert record.hours[b] == 0.0 and record.losses[b] == 0


class ListPrices:
    """A market whose prices are the offers' list prices and that a test's policy must not probe."""

    def probe(self, offer):
        raise AssertionError(f"probed {offer}")

    def price(self, offer):
        return offer.price


def test_default_makes_no_move_whose_changeover_would_end_at_the_safety_net():
    """Running spot at 3.0 with the same shape at 1.0 in the other zone of the region: the multi-zone default
    tries the cheaper zone while the slack left after the move's changeover and checkpoint transfer is above
    one tick, and stays once it is not (it would pay them, and the net would then send the job to
    on-demand). A 500 GB checkpoint at 1 Gbit/s takes 1.1 h to move."""
    from kit.policy.offers import Moves
    from kit.policy.zones import ZoneDefault, ZoneObservation

    shape = Shape("t", 2)
    dear, cheap = Offer("us-east4-a", shape, "spot", 3.0), Offer("us-east4-b", shape, "spot", 1.0)
    od = Offer("us-east4-a", shape, "on-demand", 4.0)
    fast, slow = Moves(), Moves(checkpoint_gb=500, transfer_gbps=1)
    tick, d = 1 / 6, 0.2
    for moves, slack, moved in ((fast, 0.9, True), (fast, 0.3, False), (slow, 2.0, True), (slow, 1.4, False)):
        policy = ZoneDefault((dear, cheap, od), moves)
        seen = ZoneObservation(now_h=10.0, progress_h=40.0, job_h=48.0, deadline_h=10.0 + 8.0 + d + slack,
                               changeover_h=d, tick_h=tick, running=dear, zone="us-east4-a",
                               checkpoint_zone="us-east4-a")
        plan = policy.decide(seen, market=ListPrices())  # a running job probes nothing
        assert plan[0] == (cheap if moved else dear), (moves, slack, plan)


def test_a_try_to_move_comes_once_staying_has_cost_what_a_failed_try_costs():
    """Ski rental: on spot at 3 $/h with progress elsewhere at 1 $/h, a failed try costs a changeover of 0.2 h at
    3 $/h (0.6 $), which staying costs again every 0.3 h (2 $/h more). Never for an offer that is not cheaper."""
    from kit.policy.zones import try_move

    assert not try_move(3.0, 1.0, launch_h=0.2, held_h=0.29)
    assert try_move(3.0, 1.0, launch_h=0.2, held_h=0.3)
    assert not try_move(3.0, 3.0, launch_h=0.2, held_h=100.0) and not try_move(3.0, 3.5, launch_h=0.2, held_h=100.0)
    assert try_move(3.0, 2.9, launch_h=0.2, held_h=6.0) and not try_move(3.0, 2.9, launch_h=0.2, held_h=5.9)

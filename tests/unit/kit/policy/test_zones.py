"""The capacity search's order (kit.policy.zones.search_order), shared by the watcher and ``failover``."""
from __future__ import annotations

import random

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

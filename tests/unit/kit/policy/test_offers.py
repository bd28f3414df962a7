"""kit.policy.offers: what a move costs, within bounds that keep every sum the replay forms finite, and
offer names as the ledger records them."""
from __future__ import annotations

import math

import pytest

from kit.errors import InputError
from kit.policy.offers import (
    MAX_CHECKPOINT_GB,
    MAX_EGRESS_PER_GB,
    MIN_TRANSFER_GBPS,
    Moves,
    Offer,
    Shape,
    offer_parts,
)


@pytest.mark.parametrize(("moves", "flag"), [
    (Moves(checkpoint_gb=1e308), "--checkpoint-gb"),  # 1e308 GB x 8 was inf, and round(inf) raised
    (Moves(checkpoint_gb=MAX_CHECKPOINT_GB * 1.01), "--checkpoint-gb"),
    (Moves(checkpoint_gb=-1), "--checkpoint-gb"),
    (Moves(transfer_gbps=1e-320), "--transfer-gbps"),  # a denormal rate: the transfer took inf hours
    (Moves(transfer_gbps=0), "--transfer-gbps"),
    (Moves(transfer_gbps=math.nan), "--transfer-gbps"),
    (Moves(egress_per_gb=1e308), "--egress-per-gb"),
    (Moves(egress_per_gb=-0.01), "--egress-per-gb"),
])
def test_moves_out_of_bounds_are_refused_with_the_flag_and_the_bounds(moves, flag):
    with pytest.raises(InputError) as info:
        moves.check()
    assert info.value.where == flag and "finite number" in info.value.fix, info.value.render()


def test_moves_at_the_bounds_stay_finite():
    moves = Moves(checkpoint_gb=MAX_CHECKPOINT_GB, transfer_gbps=MIN_TRANSFER_GBPS, egress_per_gb=MAX_EGRESS_PER_GB)
    moves.check()
    assert math.isfinite(moves.launch_h(1e5, "us-east4-a", "europe-west1-c"))
    assert math.isfinite(moves.egress("us-east4-a", "europe-west1-c"))
    Moves(checkpoint_gb=0, egress_per_gb=0).check()


def test_offer_parts_of_every_offer_name_and_of_a_type_with_a_slash():
    for offer in (Offer("us-east-1a", Shape("g5.4xlarge", 4), "spot", 1.0),
                  Offer("local", Shape("local", 2, 1), "on-demand", 1.0)):
        assert offer_parts(offer.name) == (offer.zone, offer.shape.name, offer.market)
    # a ledger written before instance types were checked (kit.spec.INSTANCE_TYPE_RE) may hold one with '/'
    assert offer_parts("us-east-1a/1xg5/4xlarge/spot") == ("us-east-1a", "1xg5/4xlarge", "spot")
    with pytest.raises(ValueError, match="not an offer name"):
        offer_parts("us-east-1a")

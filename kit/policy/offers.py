"""The multi-zone model: instance shapes, offers (zone x shape x market) and what a move costs.

An *offer* is somewhere the whole job can run: a zone, an instance shape and a market, at a price
for the whole gang per hour. Every shape of one job has the same total GPU count, so the trainer's
world size never changes (``check_shapes``). Moving the job to another zone costs the checkpoint's
transfer time (billed, without progress, on top of the launch's changeover) and, across regions,
egress per GB (``Moves``). docs/policies.md ("Many zones") documents the model exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kit.errors import InputError
from kit.policy.market import ON_DEMAND, SPOT

MARKETS = (SPOT, ON_DEMAND)
EACH = "each"  # ``--zones each`` / ``up@each``: every zone on its own, as a one-zone market
PROBE_H = 1 / 60  # a successful probe (launch, then release) is billed one minute, as the clouds bill a launch
DEFAULT_CHECKPOINT_GB = 50.0
# Copying a checkpoint between zones: a bucket read or a disk-to-disk copy at 10 Gbit/s (1.25 GB/s) is
# what GCS and S3 sustain for one multi-part transfer within a continent; 50 GB then takes 40 s.
DEFAULT_TRANSFER_GBPS = 10.0
# Bounds of what a user says about time, money and moves (the spec, kit simulate's flags): far beyond any
# real job, and small enough that every sum and product of them that the replay and the watcher form stays
# finite (1e308 GB x 8 / 3600 overflowed to inf, and round(inf) raised in the simulator's units).
# 1e6 $ per node-hour is 10,000x what the dearest 8-GPU instances list on-demand, under $100/h
# (aws.amazon.com/ec2/pricing/on-demand/, cloud.google.com/compute/gpus-pricing).
MAX_NODES = 1000  # a gang's size: the spec's nodes, kit simulate's --nodes, an offers file's shapes
MAX_HOURS = 1e5  # deadlines, changeovers, windows: 11 years
MAX_PRICE_PER_HOUR = 1e6  # $/h of a node or an instance (the list prices of GPU nodes are under 1e2)
MAX_CHECKPOINT_GB = 1e7  # 10 PB
MIN_TRANSFER_GBPS = 1e-6  # 1 kbit/s: a 10 PB checkpoint then moves in 2.2e10 h, still a finite number
MAX_EGRESS_PER_GB = 1e3  # $/GB (the clouds' list prices are under 0.2)

# Inter-region data transfer, $ per GB, by the continents of the two regions. Both clouds publish
# these rates per region pair; these are their list prices for VM/instance traffic between regions:
# GCP "Data transfer between regions" (cloud.google.com/vpc/network-pricing: $0.02 within Northern
# America and within Europe, $0.05 between them, $0.08 within or to Asia and elsewhere) and AWS "Data
# Transfer OUT to another AWS region" (aws.amazon.com/ec2/pricing/on-demand: $0.02 from US and EU
# regions, $0.09 from Asia Pacific). Within a region, moves are free.
EGRESS_PER_GB = {  # keys: the two continents, sorted
    ("na", "na"): 0.02, ("eu", "eu"): 0.02, ("eu", "na"): 0.05,
}
EGRESS_OTHER_PER_GB = 0.08
_CONTINENTS = {
    "us": "na", "northamerica": "na", "ca": "na",
    "europe": "eu", "eu": "eu",
    "asia": "asia", "ap": "asia", "me": "asia",
}


def region_of(zone: str) -> str:
    """The region of a zone: GCP ``us-central1-a`` -> ``us-central1``, AWS ``us-east-1a`` -> ``us-east-1``."""
    if re.fullmatch(r".+-[a-z]", zone):
        return zone[:-2]
    if re.fullmatch(r".+-\d+[a-z]", zone):
        return zone[:-1]
    return zone


def continent_of(region: str) -> str:
    return _CONTINENTS.get(region.split("-")[0], "other")


@dataclass(frozen=True)
class Shape:
    """How the job's GPUs are bought: ``nodes`` instances of ``instance_type`` with ``gpus_per_node`` each."""

    instance_type: str
    nodes: int
    gpus_per_node: int = 1
    markets: tuple[str, ...] = MARKETS

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def name(self) -> str:
        return f"{self.nodes}x{self.instance_type}"


@dataclass(frozen=True)
class Offer:
    """One place to run the whole job: ``price`` is $/h for the gang (list price; spot may vary by tick)."""

    zone: str
    shape: Shape
    market: str
    price: float

    @property
    def spot(self) -> bool:
        return self.market == SPOT

    @property
    def name(self) -> str:
        return f"{self.zone}/{self.shape.name}/{self.market}"


def offer_parts(name: str) -> tuple[str, str, str]:
    """(zone, shape name, market) of an :attr:`Offer.name` (as the ledger records it). Zones and markets
    hold no '/' (kit.spec.ZONE_RE, MARKETS); an instance type holds none since kit.spec.INSTANCE_TYPE_RE,
    but a ledger written before may name one that does: it stays in the shape's name."""
    zone, _, rest = name.partition("/")
    shape, _, market = rest.rpartition("/")
    if not (zone and shape and market):
        raise ValueError(f"{name!r} is not an offer name (zone/shape/market)")
    return zone, shape, market


def check_shapes(shapes: list[Shape], where: str = "shapes") -> None:
    """Every shape gives the job the same number of GPUs, and names markets kit knows."""
    if not shapes:
        raise InputError("no instance shape given", where=where, fix="give at least one shape")
    for i, shape in enumerate(shapes):
        bad = [m for m in shape.markets if m not in MARKETS]
        if bad or not shape.markets or shape.nodes < 1 or shape.gpus_per_node < 1:
            raise InputError(f"shape {shape.name}: needs nodes >= 1, gpus_per_node >= 1 and markets from "
                             f"{', '.join(MARKETS)} (got nodes={shape.nodes}, gpus_per_node={shape.gpus_per_node}, "
                             f"markets={list(shape.markets)})", where=f"{where}[{i}]", fix="fix the shape")
    seen: dict[tuple[str, str], int] = {}
    for i, shape in enumerate(shapes):
        for market in shape.markets:
            if (shape.name, market) in seen:
                # an offer is named zone/shape/market (the ledger records it so): a second one of the same
                # name would be the same offer counted twice, in the replay and in the watcher's search
                twice = (f"lists {market} twice in its markets" if seen[shape.name, market] == i
                         else f"is sold {market} twice (shapes {seen[shape.name, market]} and {i})")
                raise InputError(f"shape {shape.name} {twice}", where=f"{where}[{i}]",
                                 fix="give each instance type and node count once, with all its markets")
            seen[shape.name, market] = i
    counts = {s.name: s.gpus for s in shapes}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name} = {n} GPUs" for name, n in counts.items())
        raise InputError(f"shapes of one job must have the same total GPU count, so the trainer's world size never "
                         f"changes ({listed})", where=where,
                         fix="give every shape the same nodes x gpus_per_node, e.g. 16 x 1 GPU and 2 x 8 GPUs")


@dataclass(frozen=True)
class Moves:
    """What moving the checkpoint between zones costs: transfer time (billed without progress) and egress."""

    checkpoint_gb: float = DEFAULT_CHECKPOINT_GB
    transfer_gbps: float = DEFAULT_TRANSFER_GBPS
    egress_per_gb: float | None = None  # one flat rate across regions; None: the clouds' published rates

    def check(self) -> None:
        """The facts within their bounds (kit.spec's policy section has the same)."""
        for flag, value, low, high in (("--checkpoint-gb", self.checkpoint_gb, 0.0, MAX_CHECKPOINT_GB),
                                       ("--transfer-gbps", self.transfer_gbps, MIN_TRANSFER_GBPS, math.inf),
                                       ("--egress-per-gb", self.egress_per_gb, 0.0, MAX_EGRESS_PER_GB)):
            if value is not None and not (math.isfinite(value) and low <= value <= high):
                bound = f"from {low:g} to {high:g}" if high < math.inf else f">= {low:g}"
                raise InputError(f"got {value!r}", where=flag, fix=f"give a finite number {bound}")

    def transfer_h(self, src: str | None, dst: str) -> float:
        """Hours to bring the checkpoint from zone ``src`` (None: no checkpoint yet) to ``dst``."""
        if src is None or src == dst:
            return 0.0
        return self.checkpoint_gb * 8 / self.transfer_gbps / 3600

    def launch_h(self, changeover_h: float, src: str | None, dst: str) -> float:
        """Hours a launch in zone ``dst`` is billed without progress: the changeover d, and the checkpoint's
        transfer when it lies in another zone ``src``."""
        return changeover_h + self.transfer_h(src, dst)

    def rate(self, src_region: str, dst_region: str) -> float:
        """$/GB from one region to another (0 within a region)."""
        if src_region == dst_region:
            return 0.0
        if self.egress_per_gb is not None:
            return self.egress_per_gb
        pair = tuple(sorted((continent_of(src_region), continent_of(dst_region))))
        return EGRESS_PER_GB.get((pair[0], pair[1]), EGRESS_OTHER_PER_GB)

    def egress(self, src: str | None, dst: str) -> float:
        """$ to move the checkpoint from zone ``src`` to ``dst``."""
        if src is None:
            return 0.0
        return self.checkpoint_gb * self.rate(region_of(src), region_of(dst))

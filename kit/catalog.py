"""A small instance catalog: GPUs per node, GPU model, typical prices, placement/EFA support, zones.

Prices are per node, $/h, us-east-1 / us-central1 list prices (on-demand) and a typical recent spot
price; they are defaults for ``spec.prices`` and ``max_price`` only — the user may override both.
GCP A3/A2/G2 types carry their GPUs (accelerator-optimized); N1 types take a ``guest_accelerator``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    cloud: str
    name: str
    gpus: int
    gpu_model: str | None
    on_demand_per_hour: float
    spot_per_hour: float
    placement: bool = True        # AWS cluster placement group / GCP compact placement policy
    efa: bool = False             # AWS Elastic Fabric Adapter
    guest_accelerator: str | None = None  # GCP: accelerator type to attach (N1 only)
    on_demand: bool = True        # False: the cloud sells this type only as spot (or flex-start)
    note: str = ""
    disk_types: tuple[str, ...] = ()  # data-disk types the machine type can attach (first: kit's default)
    nic_type: str | None = None   # GCP network interface type the machine type needs (A3: GVNIC)


_A3_SPOT_ONLY = ("GCP sells a3-highgpu-1g/2g/4g only as Spot or Flex-start VMs: on-demand needs "
                 "a3-highgpu-8g")


# Data-disk types per machine family. EBS volume types attach to every instance type. GCP: A3 High
# and G2 take no Standard PD, N1 takes no Hyperdisk (GCP docs, "Accelerator-optimized machine
# family" and "General-purpose machine family": supported disk types per series).
EBS_TYPES = ("gp3", "gp2", "io1", "io2", "st1")
_GCP_A3 = ("pd-balanced", "pd-ssd", "hyperdisk-balanced")
_GCP_A2 = ("pd-balanced", "pd-ssd", "pd-standard")
_GCP_G2 = ("pd-balanced", "pd-ssd")
_GCP_N1 = ("pd-balanced", "pd-ssd", "pd-standard")
_A3 = {"disk_types": _GCP_A3, "nic_type": "GVNIC"}


def _t(cloud: str, *args, **kw) -> InstanceType:
    kw.setdefault("disk_types", EBS_TYPES if cloud == "aws" else ())
    return InstanceType(cloud, *args, **kw)


_TYPES = [
    # AWS G5: A10G 24 GB. Cluster placement groups are supported; EFA only on the large sizes.
    _t("aws", "g5.xlarge", 1, "A10G", 1.006, 0.40),
    _t("aws", "g5.2xlarge", 1, "A10G", 1.212, 0.48),
    _t("aws", "g5.4xlarge", 1, "A10G", 1.624, 0.65),
    _t("aws", "g5.8xlarge", 1, "A10G", 2.448, 0.98, efa=True),
    _t("aws", "g5.12xlarge", 4, "A10G", 5.672, 2.27, efa=True),
    _t("aws", "g5.16xlarge", 1, "A10G", 4.096, 1.64, efa=True),
    _t("aws", "g5.24xlarge", 4, "A10G", 8.144, 3.26, efa=True),
    _t("aws", "g5.48xlarge", 8, "A10G", 16.288, 6.52, efa=True),
    _t("aws", "p4d.24xlarge", 8, "A100-40GB", 32.7726, 13.11, efa=True),
    _t("aws", "p5.48xlarge", 8, "H100-80GB", 55.04, 22.02, efa=True),
    # GCP accelerator-optimized: GPUs come with the machine type. Compact placement: A2, A3 and G2
    # (GCP docs, "Compact placement policy and workload policy overview": supported machine types
    # A4X, A4, A3 Ultra/Mega/High/Edge, A2, G4, G2); not N1. A3 needs gVNIC.
    # a3-highgpu-1g/2g/4g are sold only as Spot (or Flex-start) VMs (GCP "consumption option
    # availability by machine type"; dstack's gpuhunt dropped their on-demand offers for this reason,
    # gpuhunt PR #176): no on-demand fallback. The on-demand price is the 8g's per GPU, the baseline.
    _t("gcp", "a3-highgpu-1g", 1, "H100-80GB", 11.06, 2.95, on_demand=False, note=_A3_SPOT_ONLY, **_A3),
    _t("gcp", "a3-highgpu-2g", 2, "H100-80GB", 22.12, 5.90, on_demand=False, note=_A3_SPOT_ONLY, **_A3),
    _t("gcp", "a3-highgpu-4g", 4, "H100-80GB", 44.24, 11.80, on_demand=False, note=_A3_SPOT_ONLY, **_A3),
    _t("gcp", "a3-highgpu-8g", 8, "H100-80GB", 88.49, 23.60, **_A3),
    _t("gcp", "a2-highgpu-1g", 1, "A100-40GB", 3.67, 1.47, disk_types=_GCP_A2),
    _t("gcp", "a2-highgpu-8g", 8, "A100-40GB", 29.39, 11.76, disk_types=_GCP_A2),
    _t("gcp", "g2-standard-4", 1, "L4", 0.71, 0.28, disk_types=_GCP_G2),
    _t("gcp", "g2-standard-8", 1, "L4", 0.85, 0.34, disk_types=_GCP_G2),
    _t("gcp", "g2-standard-16", 1, "L4", 1.15, 0.46, disk_types=_GCP_G2),
    _t("gcp", "g2-standard-48", 4, "L4", 4.00, 1.60, disk_types=_GCP_G2),
    # N1 + guest accelerator (one T4 each here); N1 does not support compact placement policies.
    _t("gcp", "n1-standard-8", 1, "T4", 0.73, 0.25, placement=False, guest_accelerator="nvidia-tesla-t4",
       note="GPU attached as guest_accelerator nvidia-tesla-t4 x1", disk_types=_GCP_N1),
    _t("gcp", "n1-standard-16", 1, "T4", 1.11, 0.38, placement=False, guest_accelerator="nvidia-tesla-t4",
       note="GPU attached as guest_accelerator nvidia-tesla-t4 x1", disk_types=_GCP_N1),
]

CATALOG: dict[tuple[str, str], InstanceType] = {(t.cloud, t.name): t for t in _TYPES}

# region -> zones, for the regions kit's examples and tests use.
ZONES: dict[str, dict[str, tuple[str, ...]]] = {
    "aws": {
        "us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"),
        "us-east-2": ("us-east-2a", "us-east-2b", "us-east-2c"),
        "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"),
        "eu-west-1": ("eu-west-1a", "eu-west-1b", "eu-west-1c"),
    },
    "gcp": {
        "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
        "us-east4": ("us-east4-a", "us-east4-b", "us-east4-c"),
        "us-east5": ("us-east5-a", "us-east5-b", "us-east5-c"),
        "us-west1": ("us-west1-a", "us-west1-b", "us-west1-c"),
        "europe-west4": ("europe-west4-a", "europe-west4-b", "europe-west4-c"),
        "asia-northeast1": ("asia-northeast1-a", "asia-northeast1-b", "asia-northeast1-c"),
    },
}


def lookup(cloud: str, instance_type: str | None) -> InstanceType | None:
    if not instance_type:
        return None
    return CATALOG.get((cloud, instance_type))


def zones_of(cloud: str, region: str) -> tuple[str, ...] | None:
    """Known zones of a region, or None if the region is not in the map (then only the prefix is checked)."""
    return ZONES.get(cloud, {}).get(region)

"""AWS: the spec, the instance catalog, tags, capacity errors, the data disk and the event source."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, StrictBool, field_validator, model_validator

from kit.clouds.base import Cloud, InstanceType, Variable
from kit.policy.offers import MAX_PRICE_PER_HOUR
from kit.spec import CloudSpec, Finite, SpecProblem, ZoneName, _Model
from kit.validation import shown

if TYPE_CHECKING:
    from kit.backends.base import Node

AMI_RE = re.compile(r"ami-[0-9a-f]{8,17}")
# EC2 resource ids are a prefix and 8 or 17 hexadecimal characters
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html); any id of letters and digits
# after the prefix is let through, and nothing else reaches the rendered Terraform
VPC_ID_RE, SUBNET_ID_RE = re.compile(r"vpc-[0-9a-z]{1,17}"), re.compile(r"subnet-[0-9a-z]{1,17}")


def _resource_id(pattern: re.Pattern[str], example: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise SpecProblem("", f"{shown(value)} is not an EC2 id like {example}", f"use an id like {example}")
        return value

    return AfterValidator(check)


VpcId = Annotated[str, _resource_id(VPC_ID_RE, "vpc-0a1b2c3d")]
SubnetId = Annotated[str, _resource_id(SUBNET_ID_RE, "subnet-0a1b2c3d")]
EBS_TYPES = ("gp3", "gp2", "io1", "io2", "st1")  # every EBS volume type attaches to every instance type


class AwsNetwork(_Model):
    vpc_id: VpcId | None = None       # existing VPC (default: the region's default VPC)
    subnet_id: SubnetId | None = None    # existing subnet in the zone (default: the zone's default subnet)
    # A subnet lives in one Availability Zone (CreateSubnet's AvailabilityZone,
    # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSubnet.html): a job with several
    # zones names one existing subnet per zone, and the offer's zone's is rendered.
    subnet_ids: dict[ZoneName, SubnetId] = Field(default_factory=dict)
    egress_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"])  # outbound, every port

    @field_validator("egress_cidrs")
    @classmethod
    def _canonical(cls, cidrs: list[str]) -> list[str]:
        for i, cidr in enumerate(cidrs):
            try:
                ipaddress.IPv4Network(cidr, strict=True)
            except ValueError as error:
                raise SpecProblem(f"network.egress_cidrs[{i}]", f"not an IPv4 CIDR: {shown(cidr)} ({error})",
                                  "write it as a network, e.g. 0.0.0.0/0 or 10.0.0.0/8") from None
        return [str(ipaddress.IPv4Network(c)) for c in cidrs]

    @model_validator(mode="after")
    def _one_way_to_name_subnets(self) -> AwsNetwork:
        if self.subnet_id is not None and self.subnet_ids:
            raise SpecProblem("network.subnet_ids", "network.subnet_id and network.subnet_ids both name the subnet",
                              "keep subnet_id for a job in one zone, or subnet_ids (one per zone) for several")
        return self


class AwsSpec(CloudSpec):
    cloud: Literal["aws"]
    max_price: Annotated[Finite, Field(le=MAX_PRICE_PER_HOUR)] | None = None  # spot cap, $/h per node (unset: on-demand's)
    network: AwsNetwork = Field(default_factory=AwsNetwork)
    efa: StrictBool = False
    monitoring: StrictBool = False   # CloudWatch detailed monitoring (billed per instance)

    @model_validator(mode="after")
    def _aws_rules(self) -> AwsSpec:
        if self.max_price is not None and self.max_price <= 0:
            raise SpecProblem("max_price", f"max_price must be positive (got {self.max_price})",
                              "remove it (default: the on-demand price) or set a positive $/h")
        if self.image is not None and not AMI_RE.fullmatch(self.image):
            raise SpecProblem("image", f"{shown(self.image)} is not an AMI id",
                              "use an AMI id of the region (ami-0123456789abcdef0), or leave image out for the AWS "
                              "Deep Learning Base AMI (Ubuntu 22.04)")
        if self.efa:
            # An EFA interface is only useful with the EFA installer, aws-ofi-nccl, the NCCL environment
            # and every interface the type has; kit does not set those up yet, so it refuses rather than
            # create an interface nothing uses.
            raise SpecProblem("efa", "EFA is not supported by kit yet (it needs the EFA installer, aws-ofi-nccl "
                              "and one interface per network card, which kit does not set up)",
                              "remove efa (NCCL then uses TCP sockets over the ENA interface)")
        _check_places_of_ids(self)
        return self

    @property
    def subnet_id(self) -> str | None:
        """The existing subnet of the spec's zone (None: the zone's default subnet)."""
        return self.network.subnet_id or self.network.subnet_ids.get(self.zone)


def _check_places_of_ids(spec: AwsSpec) -> None:
    """Ids that name something in one place fit every place the job may move to: a subnet is in one
    Availability Zone (RunInstances with a subnet of another zone fails "Subnet '...' is in the
    availability zone ..."), a VPC and an AMI are in one region (an AMI is used elsewhere only as a copy
    with another id: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CopyImage.html). Moves
    render the offer's zone and region (CloudSpec.with_offer) and are not validated again, so it is
    checked here."""
    zones, regions, net = spec.zone_list, spec.region_list, spec.network
    if net.subnet_id is not None and len(zones) > 1:
        raise SpecProblem("network.subnet_id", f"subnet {net.subnet_id} is in one Availability Zone, but the job may "
                          f"run in {', '.join(zones)}",
                          "list only the subnet's zone in zones, name one subnet per zone (network.subnet_ids: "
                          "{zone: subnet-...}), or leave it out for each zone's default subnet")
    for zone in net.subnet_ids:
        if zone not in zones:
            raise SpecProblem(f"network.subnet_ids.{zone}", f"{shown(zone)} is not one of the job's zones",
                              f"key subnet_ids by the zones ({', '.join(zones)})")
    missing = [z for z in zones if net.subnet_ids and z not in net.subnet_ids]
    if missing:
        raise SpecProblem("network.subnet_ids", f"no subnet for {', '.join(missing)}",
                          "name an existing subnet of each zone the job may run in")
    regional = (("network.vpc_id", net.vpc_id, "each region's default VPC, or the VPC of each zone's subnet_ids entry"),
                ("image", spec.image, "the AWS Deep Learning Base AMI of each region"))
    for field, value, default in regional:
        if value is not None and len(regions) > 1:
            raise SpecProblem(field, f"{value} is in one region, but the job's zones are in {', '.join(regions)}",
                              f"list zones of one region only, or leave {field} out (kit then uses {default})")


def _t(name: str, gpus: int, gpu: str, on_demand: float, spot: float, *, efa: bool = False) -> InstanceType:
    return InstanceType(name, gpus, gpu, on_demand, spot, efa=efa, disk_types=EBS_TYPES)


class Aws(Cloud[AwsSpec]):
    name = "aws"
    state_backend = "s3"
    bucket_schemes = ("s3",)
    bucket_packages = ("s3fs==2026.9.0",)  # fsspec's S3 (aiobotocore); pins its fsspec
    spec_model = AwsSpec
    cluster_tag = "kit:cluster"
    tags_variable = "tags"
    disk_types = EBS_TYPES
    # EBS, us-east-1 (aws.amazon.com/ebs/pricing): storage only (gp3's and io*'s extra IOPS/throughput not counted)
    disk_prices: ClassVar[dict[str, float]] = {"gp3": 0.08, "gp2": 0.10, "io1": 0.125, "io2": 0.125, "st1": 0.045}
    # EC2 error texts that mean "no capacity right now" (retry later or elsewhere), not a bug.
    # MaxSpotInstanceCountExceeded is no stockout but the account's Spot vCPU quota, per Region and per
    # family group (G and VT, P, ...; https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-limits.html,
    # "request a quota increase if ... you receive the error Max spot instance count exceeded"). It stays
    # here because the capacity search's answer to it is still the useful one: another region, another
    # shape's family or on-demand (quotas of their own) may launch. EC2's text ("Max spot instance count
    # exceeded") names no quota, so the capacity error, kept in the ledger and the log, says which one to
    # raise in Service Quotas and how (capacity_hint).
    spot_quota_error: ClassVar[str] = r"MaxSpotInstanceCountExceeded"
    capacity_patterns = (r"InsufficientInstanceCapacity", r"InsufficientCapacity", r"capacity-not-available",
                         r"capacity-oversubscribed", r"SpotMaxPriceTooLow", r"price-too-low",
                         spot_quota_error, r"UnfulfillableCapacity",
                         r"There is no Spot capacity available")
    spot_quota_docs: ClassVar[str] = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-limits.html"
    # The Spot vCPU quota ("All <group> Spot Instance Requests") of each instance family, as that page lists them
    spot_quotas: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"(g|vt)\d", "G and VT"), (r"p5", "P5"), (r"p[234]", "P4, P3 and P2"), (r"dl\d", "DL"), (r"inf\d", "Inf"),
        (r"trn\d", "Trn"), (r"f\d", "F"), (r"x\d", "X"), (r"[acdhimrtz]\d", "Standard (A, C, D, H, I, M, R, T, Z)"))

    def capacity_hint(self, spec: AwsSpec, message: str) -> str | None:
        """The Spot vCPU quota to raise when EC2 refused a launch for it (MaxSpotInstanceCountExceeded)."""
        if not re.search(self.spot_quota_error, message, re.IGNORECASE):
            return None
        family = spec.instance_type.split(".")[0]
        group = next((name for pattern, name in self.spot_quotas if re.match(pattern, family)), None)
        quota = f'"All {group} Spot Instance Requests"' if group else f"the Spot Instance Requests quota of {family}"
        return (f"it is the account's Spot vCPU quota in {spec.region}, not a stockout: raise {quota} for "
                f"{spec.region} in the Service Quotas console (Amazon EC2), see {self.spot_quota_docs}")
    # G5: A10G 24 GB; cluster placement groups for all; EFA only on the large sizes. Prices: us-east-1.
    instance_types = (
        _t("g5.xlarge", 1, "A10G", 1.006, 0.40),
        _t("g5.2xlarge", 1, "A10G", 1.212, 0.48),
        _t("g5.4xlarge", 1, "A10G", 1.624, 0.65),
        _t("g5.8xlarge", 1, "A10G", 2.448, 0.98, efa=True),
        _t("g5.12xlarge", 4, "A10G", 5.672, 2.27, efa=True),
        _t("g5.16xlarge", 1, "A10G", 4.096, 1.64, efa=True),
        _t("g5.24xlarge", 4, "A10G", 8.144, 3.26, efa=True),
        _t("g5.48xlarge", 8, "A10G", 16.288, 6.52, efa=True),
        _t("p4d.24xlarge", 8, "A100-40GB", 32.7726, 13.11, efa=True),
        _t("p5.48xlarge", 8, "H100-80GB", 55.04, 22.02, efa=True),
    )
    zones: ClassVar[dict[str, tuple[str, ...]]] = {
        "us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"),
        "us-east-2": ("us-east-2a", "us-east-2b", "us-east-2c"),
        "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"),
        "eu-west-1": ("eu-west-1a", "eu-west-1b", "eu-west-1c"),
    }

    def tags(self, spec: AwsSpec) -> dict[str, str]:
        return {**spec.labels, self.cluster_tag: spec.name, "kit:managed-by": "kit"}

    def instance_variables(self, spec: AwsSpec) -> list[Variable]:
        return [Variable("max_price", "number", "Spot price cap, $/h per node.", spec.max_price, nullable=True),
                Variable("image", "string", "AMI id (null: latest AWS Deep Learning Base AMI, Ubuntu 22.04).",
                         spec.image, nullable=True),
                Variable("vpc_id", "string", "Existing VPC (null: default VPC).", spec.network.vpc_id, nullable=True),
                Variable("subnet_id", "string", "Existing subnet (null: default subnet of the zone).",
                         spec.subnet_id, nullable=True),
                Variable("detailed_monitoring", "bool", "CloudWatch detailed monitoring.", spec.monitoring),
                *self.bucket_variables(spec)]

    def bucket_variables(self, spec: AwsSpec) -> list[Variable]:
        parts = spec.bucket_parts
        return [Variable("checkpoint_bucket", "string", "S3 bucket of the checkpoints (null: none).",
                         parts[0] if parts else None, nullable=True),
                Variable("checkpoint_prefix", "string", "This job's key prefix in it (the nodes may write only there).",
                         parts[1] if parts else "")]

    def access_variables(self, spec: AwsSpec) -> list[Variable]:
        return [Variable("egress_cidrs", "list(string)", "CIDRs the nodes may reach on every port.",
                         list(spec.network.egress_cidrs))]

    def data_device(self, node: dict) -> str:
        """An EBS volume on a Nitro instance is an NVMe device whose serial is the volume id without
        its dash (EC2 docs, "Amazon EBS and NVMe")."""
        disk_id = node.get("disk_id") or ""
        return "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_" + disk_id.replace("-", "") if disk_id else ""

    def event_source(self, spec: AwsSpec, deploy_dir: Path):
        from kit.watch.sources.aws import AwsSource

        return AwsSource(cluster=spec.name, regions=spec.region_list)

    def backend(self, spec: AwsSpec, deploy_dir: Path, *, watcher_url=None, watcher_token=None):
        from kit.backends.cloud import TerraformBackend

        return TerraformBackend(spec, deploy_dir, watcher_url=watcher_url, watcher_token=watcher_token)

    host_key_source = "cloud-init's SSH HOST KEY KEYS block of the console output (EC2 GetConsoleOutput)"

    def host_keys(self, spec: AwsSpec, node: Node) -> list[str]:
        from kit.backends.aws_host_keys import published_host_keys

        return published_host_keys(spec.region, node.instance_id)


CLOUD = Aws()

"""GCP: the spec, the machine-type catalog, labels, capacity errors, the data disk and the event source."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, StrictBool, model_validator

from kit.clouds.base import Cloud, InstanceType, Variable
from kit.errors import KitError
from kit.spec import CloudSpec, SpecProblem, SshSection, _Model
from kit.validation import shown

if TYPE_CHECKING:
    from kit.backends.base import Node

ACCELERATOR_IMAGE = ("projects/ubuntu-os-accelerator-images/global/images/family/"
                     "ubuntu-accelerator-2204-amd64-with-nvidia-550")
# Data-disk types per machine family: A3 High and G2 take no Standard PD, N1 takes no Hyperdisk (GCP
# docs, "Accelerator-optimized machine family" and "General-purpose machine family").
PD_TYPES = ("pd-balanced", "pd-ssd", "pd-standard", "hyperdisk-balanced")
_A3_DISKS = ("pd-balanced", "pd-ssd", "hyperdisk-balanced")
_A2_DISKS = ("pd-balanced", "pd-ssd", "pd-standard")
_G2_DISKS = ("pd-balanced", "pd-ssd")
_N1_DISKS = ("pd-balanced", "pd-ssd", "pd-standard")
_A3_SPOT_ONLY = "GCP sells a3-highgpu-1g/2g/4g only as Spot or Flex-start VMs: on-demand needs a3-highgpu-8g"
_N1_GPU = "GPU attached as guest_accelerator nvidia-tesla-t4 x1"
# A project id: 6-30 lowercase letters, digits and hyphens, a letter first, no hyphen last
# (https://cloud.google.com/resource-manager/docs/creating-managing-projects); a network or subnetwork:
# a resource name (RFC 1035, https://cloud.google.com/compute/docs/naming-resources), or its path
PROJECT_RE = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_NAME = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
NETWORK_RE = re.compile(rf"(projects/{PROJECT_RE.pattern}/global/networks/)?{_NAME}")
SUBNETWORK_RE = re.compile(rf"(projects/{PROJECT_RE.pattern}/regions/[a-z0-9-]+/subnetworks/)?{_NAME}")
# Where Compute Engine is reached when not at compute.googleapis.com (a Private Service Connect endpoint, an
# emulator): Terraform's Google provider reads it from this variable, as "https://HOST/compute/v1/"
# (registry.terraform.io/providers/hashicorp/google/latest/docs/guides/provider_reference, "Custom endpoints"),
# and kit's own Compute clients (the watcher, the host keys, the firewall check) take the same one, so that
# they read the API Terraform wrote to.
COMPUTE_ENDPOINT_ENV = "GOOGLE_COMPUTE_CUSTOM_ENDPOINT"
_COMPUTE_ENDPOINT_RE = re.compile(r"(?P<base>https?://[A-Za-z0-9.\-\[\]:]+)(/compute/v1)?/?")


def compute_api_endpoint() -> str | None:
    """``$GOOGLE_COMPUTE_CUSTOM_ENDPOINT`` as the Python clients' ``api_endpoint`` (scheme and host: they add
    ``/compute/v1/`` themselves); None when it is unset (compute.googleapis.com)."""
    value = os.environ.get(COMPUTE_ENDPOINT_ENV, "").strip()
    if not value:
        return None
    match = _COMPUTE_ENDPOINT_RE.fullmatch(value)
    if match is None:
        raise KitError(f"{shown(value)} is not a Compute Engine v1 endpoint", where=COMPUTE_ENDPOINT_ENV,
                       fix="set it as Terraform's Google provider takes it, e.g. "
                           "https://compute-myendpoint.p.googleapis.com/compute/v1/, or unset it")
    return match.group("base")


def _named(pattern: re.Pattern[str], what: str, example: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise SpecProblem("", f"{shown(value)} is not a {what}", f"use a {what} like {example}")
        return value

    return AfterValidator(check)


def _a3(name: str, gpus: int, on_demand: float, spot: float, *, spot_only: bool) -> InstanceType:
    return InstanceType(name, gpus, "H100-80GB", on_demand, spot, on_demand=not spot_only,
                        note=_A3_SPOT_ONLY if spot_only else "", disk_types=_A3_DISKS, nic_type="GVNIC")


def _n1(name: str, on_demand: float, spot: float) -> InstanceType:
    return InstanceType(name, 1, "T4", on_demand, spot, placement=False, guest_accelerator="nvidia-tesla-t4",
                        note=_N1_GPU, disk_types=_N1_DISKS)


class GcpSsh(SshSection):
    os_login: StrictBool = False  # log in with OS Login (users' Google identities) instead of a metadata key


class GcpNetwork(_Model):
    create: StrictBool | None = None  # a network of the cluster's own (default unless name/subnetwork is given)
    name: Annotated[str, _named(NETWORK_RE, "network name", "default")] | None = None  # an existing one (opt-in)
    subnetwork: Annotated[str, _named(SUBNETWORK_RE, "subnetwork name", "my-subnet")] | None = None  # of it
    cidr: str = "10.42.0.0/20"        # the created subnetwork's range

    @model_validator(mode="after")
    def _one_or_the_other(self) -> GcpNetwork:
        if self.create and (self.name or self.subnetwork):
            raise SpecProblem("network.create", "create: true makes a new network; name/subnetwork name an existing one",
                              "use one or the other")
        if self.create is False and not self.name:
            raise SpecProblem("network.create", "create: false needs the existing network to use",
                              "name it (network.name: default, for the project's default network), or leave create out")
        try:
            self.cidr = str(ipaddress.IPv4Network(self.cidr, strict=True))
        except ValueError:
            raise SpecProblem("network.cidr", f"not a CIDR: {shown(self.cidr)}", "use e.g. 10.42.0.0/20") from None
        return self


class GcpSpec(CloudSpec):
    cloud: Literal["gcp"]
    project: Annotated[str, _named(PROJECT_RE, "GCP project id", "my-project-123")]
    ssh: GcpSsh = Field(default_factory=GcpSsh)
    network: GcpNetwork = Field(default_factory=GcpNetwork)

    @model_validator(mode="after")
    def _subnetwork_in_every_region(self) -> GcpSpec:
        """A subnetwork is a regional resource (https://cloud.google.com/vpc/docs/subnets): a VM of another
        region cannot use it, and a move renders the offer's region unvalidated (CloudSpec.with_offer)."""
        regions = self.region_list
        if self.network.subnetwork is not None and len(regions) > 1:
            raise SpecProblem("network.subnetwork", f"subnetwork {self.network.subnetwork} is in one region, but the "
                              f"job's zones are in {', '.join(regions)}",
                              "list zones of one region only, or leave subnetwork out (an auto-mode network, e.g. "
                              "default, gives each region its subnetwork; or leave network out for kit's own)")
        return self

    @property
    def creates_network(self) -> bool:
        net = self.network
        return net.create if net.create is not None else not (net.name or net.subnetwork)

    @property
    def existing_network(self) -> str | None:
        return None if self.creates_network else (self.network.name or "default")

    @property
    def installs_ssh_key(self) -> bool:
        return not self.ssh.os_login


class Gcp(Cloud[GcpSpec]):
    name = "gcp"
    state_backend = "gcs"
    bucket_schemes = ("gs",)
    bucket_packages = ("gcsfs==2026.10.1",)  # fsspec's GCS; pins its fsspec
    spec_model = GcpSpec
    cluster_tag = "kit-cluster"
    tags_variable = "labels"
    disk_types = PD_TYPES
    # Persistent Disk, us-central1 (cloud.google.com/compute/disks-image-pricing); Hyperdisk is priced
    # per GB plus provisioned IOPS and throughput, so it is left unknown
    disk_prices: ClassVar[dict[str, float]] = {"pd-standard": 0.04, "pd-balanced": 0.10, "pd-ssd": 0.17}
    capacity_patterns = (r"ZONE_RESOURCE_POOL_EXHAUSTED", r"does not have enough resources available", r"STOCKOUT",
                         r"resource pool exhausted")
    # Accelerator-optimized types carry their GPUs. Compact placement: A2, A3 and G2 (GCP docs,
    # "Compact placement policy and workload policy overview"), not N1. a3-highgpu-1g/2g/4g are sold
    # only as Spot (or Flex-start) VMs (GCP "consumption option availability by machine type";
    # dstack's gpuhunt PR #176): their on-demand price is the 8g's per GPU, the baseline.
    instance_types = (
        _a3("a3-highgpu-1g", 1, 11.06, 2.95, spot_only=True),
        _a3("a3-highgpu-2g", 2, 22.12, 5.90, spot_only=True),
        _a3("a3-highgpu-4g", 4, 44.24, 11.80, spot_only=True),
        _a3("a3-highgpu-8g", 8, 88.49, 23.60, spot_only=False),
        InstanceType("a2-highgpu-1g", 1, "A100-40GB", 3.67, 1.47, disk_types=_A2_DISKS),
        InstanceType("a2-highgpu-8g", 8, "A100-40GB", 29.39, 11.76, disk_types=_A2_DISKS),
        InstanceType("g2-standard-4", 1, "L4", 0.71, 0.28, disk_types=_G2_DISKS),
        InstanceType("g2-standard-8", 1, "L4", 0.85, 0.34, disk_types=_G2_DISKS),
        InstanceType("g2-standard-16", 1, "L4", 1.15, 0.46, disk_types=_G2_DISKS),
        InstanceType("g2-standard-48", 4, "L4", 4.00, 1.60, disk_types=_G2_DISKS),
        _n1("n1-standard-8", 0.73, 0.25),
        _n1("n1-standard-16", 1.11, 0.38),
    )
    zones: ClassVar[dict[str, tuple[str, ...]]] = {
        "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
        "us-east4": ("us-east4-a", "us-east4-b", "us-east4-c"),
        "us-east5": ("us-east5-a", "us-east5-b", "us-east5-c"),
        "us-west1": ("us-west1-a", "us-west1-b", "us-west1-c"),
        "europe-west4": ("europe-west4-a", "europe-west4-b", "europe-west4-c"),
        "asia-northeast1": ("asia-northeast1-a", "asia-northeast1-b", "asia-northeast1-c"),
    }

    def tags(self, spec: GcpSpec) -> dict[str, str]:
        return {**spec.labels, self.cluster_tag: spec.name, "kit-managed-by": "kit"}

    def identity_variables(self, spec: GcpSpec) -> list[Variable]:
        return [Variable("project", "string", "GCP project id.", spec.project)]

    def instance_variables(self, spec: GcpSpec) -> list[Variable]:
        itype = spec.instance
        accel = ({"type": itype.guest_accelerator, "count": itype.gpus}
                 if itype is not None and itype.guest_accelerator else None)
        out = [Variable("guest_accelerator", "object({ type = string, count = number })",
                        "GPU to attach for N1 types (null: the machine type carries its GPUs).", accel, nullable=True),
               Variable("image", "string", "Boot image.", spec.image or ACCELERATOR_IMAGE),
               Variable("nic_type", "string", "GVNIC where the machine type needs it (null: provider default).",
                        itype.nic_type if itype is not None else None, nullable=True),
               Variable("os_login", "bool", "Log in with OS Login instead of the ssh-keys metadata key.",
                        spec.ssh.os_login),
               Variable("checkpoint_bucket", "string", "GCS bucket of the checkpoints (null: none; the VMs then "
                        "get no service account).", spec.bucket_parts[0] if spec.bucket_parts else None,
                        nullable=True)]
        if spec.creates_network:
            return out + [Variable("subnet_cidr", "string", "Range of the created subnetwork.", spec.network.cidr)]
        return out + [Variable("network", "string", "Existing network.", spec.network.name or "default"),
                      Variable("subnetwork", "string", "Existing subnetwork (null: auto).", spec.network.subnetwork,
                               nullable=True)]

    def data_device(self, node: dict) -> str:
        """The attached disk's device_name (``kit-data``, in the instances module) under by-id."""
        return "/dev/disk/by-id/google-kit-data"

    def plan_warnings(self, spec: GcpSpec) -> list[str]:
        from kit.backends.gcp_firewall import network_warnings

        return network_warnings(spec, api_endpoint=compute_api_endpoint())

    def event_source(self, spec: GcpSpec, deploy_dir: Path):
        from kit.watch.sources.gcp import GcpSource

        return GcpSource(cluster=spec.name, project=spec.project, zones=spec.zone_list,
                         api_endpoint=compute_api_endpoint())

    def backend(self, spec: GcpSpec, deploy_dir: Path, *, watcher_url=None, watcher_token=None):
        from kit.backends.cloud import TerraformBackend

        return TerraformBackend(spec, deploy_dir, watcher_url=watcher_url, watcher_token=watcher_token)

    host_key_source = "the guest attributes hostkeys/ that Google's guest agent writes (instances.getGuestAttributes)"

    def host_keys(self, spec: GcpSpec, node: Node) -> list[str]:
        from kit.backends.gcp_host_keys import published_host_keys

        return published_host_keys(spec.project, node.zone or spec.zone, node.name,
                                   api_endpoint=compute_api_endpoint())


CLOUD = Gcp()

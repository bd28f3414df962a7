"""The interface every cloud implements (``kit/clouds/<cloud>.py``), and the instance catalog's entry.

A cloud holds what differs between clouds: its spec model, its instance types and zones, the tag
or label that names a cluster, the errors that mean "no capacity", the device path of a node's data
disk, the Terraform variables only it has, its event source and its backend. Code outside
``kit/clouds`` asks ``kit.clouds.get(spec.cloud)`` instead of branching on the name.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from kit.backends.base import Backend, Node
    from kit.spec import SpecBase
    from kit.watch.sources.base import EventSource


@dataclass(frozen=True)
class InstanceType:
    """One catalog entry. Prices are per node, $/h: list on-demand and a typical recent spot price
    (defaults for ``spec.prices`` only; the user may override them)."""

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
    disk_types: tuple[str, ...] = ()  # data-disk types the type can attach (first: kit's default)
    nic_type: str | None = None   # GCP network interface type the machine type needs (A3: GVNIC)


@dataclass(frozen=True)
class Variable:
    """A Terraform input variable of a rendered root module, with its value."""

    name: str
    type: str
    description: str
    value: Any
    nullable: bool = False


S = TypeVar("S", bound="SpecBase")  # the cloud's own spec model


class Cloud(ABC, Generic[S]):
    name: ClassVar[str]
    spec_model: ClassVar[type[SpecBase]]
    renders_terraform: ClassVar[bool] = True
    nodes_outlive_kit: ClassVar[bool] = True  # a cloud's instances run on when kit stops (and are billed)
    cluster_tag: ClassVar[str] = ""        # the tag (AWS) / label (GCP) whose value is the cluster name
    tags_variable: ClassVar[str] = "tags"  # the rendered variable holding the tags or labels
    capacity_patterns: ClassVar[tuple[str, ...]] = ()
    instance_types: ClassVar[tuple[InstanceType, ...]] = ()
    zones: ClassVar[dict[str, tuple[str, ...]]] = {}  # region -> zones, for the regions kit knows
    disk_types: ClassVar[tuple[str, ...]] = ()        # every data-disk type the cloud has
    state_backend: ClassVar[str] = ""                 # Terraform's backend for state in this cloud's storage
    # $ per GB-month of each data-disk type (list prices of one region, like the instance catalog;
    # a type missing here leaves the disks' cost unknown)
    disk_prices: ClassVar[dict[str, float]] = {}
    # checkpoint_bucket: the URL schemes its nodes can write (fsspec), and what they install for them
    bucket_schemes: ClassVar[tuple[str, ...]] = ()
    bucket_packages: ClassVar[tuple[str, ...]] = ()

    def disk_price(self, spec: S) -> float | None:
        """$ per GB-month of the spec's data disks (None: unknown)."""
        return self.disk_prices.get(getattr(spec, "disk_type", ""))

    def instance(self, name: str | None) -> InstanceType | None:
        return next((t for t in self.instance_types if t.name == name), None)

    def zones_of(self, region: str) -> tuple[str, ...] | None:
        """Known zones of a region, or None if the region is not in the map (then only the prefix is checked)."""
        return self.zones.get(region)

    def is_capacity_error(self, message: str) -> bool:
        return any(re.search(p, message, re.IGNORECASE) for p in self.capacity_patterns)

    def capacity_hint(self, spec: S, message: str) -> str | None:
        """What the user can do about a capacity error (``message``) that is no stockout but a limit of the
        account (a quota), said with the error; None when there is nothing to say but to wait."""
        return None

    def tags(self, spec: S) -> dict[str, str]:
        return dict(spec.labels)

    # The Terraform variables only this cloud has, in the rendered roots' order: after the cluster's
    # name (identity), after its instance type/market/placement (instance), after the SSH access.
    def identity_variables(self, spec: S) -> list[Variable]:
        return []

    def instance_variables(self, spec: S) -> list[Variable]:
        return []

    def access_variables(self, spec: S) -> list[Variable]:
        return []

    def data_device(self, node: dict) -> str:
        """The stable device path of a node's data disk ("" when the bootstrap should not mount one)."""
        return ""

    def agent_url(self, advertise_url: str | None, server_url: str, listening_on_all: bool) -> str | None:
        """Where the nodes' agents post (None: nowhere; kit reads progress from the nodes instead).
        Cloud nodes post only to a URL they can reach: the advertised one, or the server's own
        when it listens on a specific address."""
        return advertise_url or (server_url if not listening_on_all else None)

    def listen_default(self, advertise_url: str | None) -> str:
        """The endpoint is only opened to the network when the nodes are told where to reach it."""
        return "0.0.0.0:8787" if advertise_url else "127.0.0.1:0"

    def plan_warnings(self, spec: S) -> list[str]:
        """What a reviewer of ``kit plan`` must know that the plan cannot show (e.g. firewall rules
        of an existing network that admit SSH more widely than the spec); looked up, never fatal."""
        return []

    @abstractmethod
    def event_source(self, spec: S, deploy_dir: Path) -> EventSource:
        """The poller that tells the watcher what the cloud says about the cluster's instances."""

    @abstractmethod
    def backend(self, spec: S, deploy_dir: Path, *, watcher_url: str | None = None,
                watcher_token: str | None = None) -> Backend:
        """What the watcher acts through: apply, bootstrap, destroy."""

    # Where the cloud publishes a node's SSH host keys (said in the error when it published none)
    host_key_source: ClassVar[str] = "nowhere kit knows"

    def host_keys(self, spec: S, node: Node) -> list[str]:
        """The SSH host keys ("<type> <base64>") the cloud's API publishes for ``node``, which kit pins
        (kit.remote.KnownHosts); [] while it has published none (yet). KitError when the API refuses."""
        return []

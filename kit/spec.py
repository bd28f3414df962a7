"""The cluster spec (``cluster.yaml``): pydantic v2 models, defaults from the catalog, clear errors.

``load_spec(path)`` returns a ``ClusterSpec`` or raises ``InputError`` naming the field
(``where="cluster.yaml: ssh.allowed_cidrs"``) and the fix. Nothing is written while loading.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt, ValidationError

from kit import catalog
from kit.errors import InputError

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")  # S3 and GCS naming rules, together
PREFIX_RE = re.compile(r"^[A-Za-z0-9._/-]{1,200}$")
REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-?[0-9]+$")
WORLD_PREFIX = 8  # a CIDR wider than /8 (e.g. 0.0.0.0/1 + 128.0.0.0/1) counts as world-open


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class DiskSection(_Model):
    size_gb: StrictInt = 200
    type: str | None = None  # default: gp3 (aws) / pd-balanced (gcp)


class SshSection(_Model):
    user: str = "ubuntu"
    public_key: str = "~/.ssh/id_ed25519.pub"
    allowed_cidrs: list[str] = Field(default_factory=list)
    allow_world: StrictBool = False
    os_login: StrictBool = False    # gcp: log in with OS Login (users' Google identities) instead of a metadata key


class NetworkSection(_Model):
    create: StrictBool | None = None  # gcp: a network of the cluster's own (default unless name/subnetwork is given)
    vpc_id: str | None = None       # aws: existing VPC (default: the region's default VPC)
    subnet_id: str | None = None    # aws: existing subnet in the zone (default: default subnet of the zone)
    name: str | None = None         # gcp: existing network name (default "default")
    subnetwork: str | None = None   # gcp: existing subnetwork
    cidr: str = "10.42.0.0/20"      # gcp create: subnetwork range
    egress_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"])  # aws: outbound, every port


class BackendSection(_Model):
    type: Literal["local", "s3", "gcs"] = "local"
    bucket: str | None = None
    prefix: str | None = None       # key prefix (s3) / prefix (gcs); default kit/<name>
    region: str | None = None       # s3 only; default the cluster region


class PricesSection(_Model):
    spot_per_hour: float | None = None
    on_demand_per_hour: float | None = None


class TrainingSection(_Model):
    model: str = "vit_base_patch16_224"
    image_size: StrictInt = 224
    num_classes: StrictInt = 1000
    batch_size: StrictInt = 32
    steps: StrictInt = 1000
    lr: float = 1e-3
    warmup_steps: StrictInt = 100
    ckpt_every: StrictInt = 100
    ckpt_every_seconds: float | None = None
    keep: StrictInt = 3
    seed: StrictInt = 0
    data: str = "synthetic"
    log_every: StrictInt = 10
    device: Literal["cpu", "cuda"] | None = None
    deterministic: StrictBool = False
    compile: StrictBool = False
    ckpt_dir: str = "/mnt/kit-disk/ckpt"


class ThresholdSection(_Model):
    k: StrictInt = 3
    window_hours: float = 6.0
    cooldown_hours: float = 6.0


class PolicySection(_Model):
    name: str = "default"
    deadline_hours: float | None = None
    changeover_hours: float = 0.2
    threshold: ThresholdSection = Field(default_factory=ThresholdSection)


class LocalSection(_Model):
    trace: str | None = None
    time_scale: float = 3600.0
    preempt_every_seconds: float | None = None
    grace_seconds: float = 5.0
    preemptions: StrictBool = True


class ClusterSpec(_Model):
    name: str
    cloud: Literal["aws", "gcp", "local"]
    region: str | None = None
    zone: str | None = None
    project: str | None = None
    nodes: StrictInt = 1
    instance_type: str | None = None
    gpus_per_node: StrictInt | None = None
    market: Literal["spot", "on-demand"] = "spot"
    max_price: float | None = None
    placement: Literal["cluster", "none"] = "none"
    disk: DiskSection = Field(default_factory=DiskSection)
    image: str | None = None
    ssh: SshSection = Field(default_factory=SshSection)
    network: NetworkSection = Field(default_factory=NetworkSection)
    efa: StrictBool = False
    monitoring: StrictBool = False  # aws: CloudWatch detailed monitoring (billed per instance)
    labels: dict[str, str] = Field(default_factory=dict)
    backend: BackendSection = Field(default_factory=BackendSection)
    prices: PricesSection = Field(default_factory=PricesSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    policy: PolicySection = Field(default_factory=PolicySection)
    local: LocalSection = Field(default_factory=LocalSection)
    # Where the spec came from (not a YAML field): the generated-file header names it.
    _source: str | None = PrivateAttr(default=None)

    @property
    def source(self) -> str | None:
        return self._source

    def with_market(self, market: str) -> ClusterSpec:
        if market not in ("spot", "on-demand"):
            raise InputError(f"unknown market {market!r}", where="market", fix="use spot or on-demand")
        itype = self.instance
        if market == "on-demand" and itype is not None and not itype.on_demand:
            raise InputError(f"{self.instance_type} cannot run on-demand ({itype.note})", where="market",
                             fix="use spot, or an instance type sold on-demand")
        return self.model_copy(update={"market": market}, deep=True)

    @property
    def instance(self) -> catalog.InstanceType | None:
        return catalog.lookup(self.cloud, self.instance_type)

    @property
    def disk_type(self) -> str:
        itype = self.instance
        if self.disk.type:
            return self.disk.type
        if itype is not None and itype.disk_types:
            return itype.disk_types[0]
        return "gp3" if self.cloud == "aws" else "pd-balanced"

    @property
    def existing_network(self) -> str | None:
        """GCP: the existing network the spec names (an explicit opt-in), else None."""
        if self.cloud != "gcp" or self.creates_network:
            return None
        return self.network.name or "default"

    @property
    def creates_network(self) -> bool:
        """GCP: the cluster gets a network of its own (its only SSH rule is ssh.allowed_cidrs) unless
        the spec names an existing one."""
        net = self.network
        return self.cloud == "gcp" and (net.create if net.create is not None
                                        else not (net.name or net.subnetwork))


# ------------------------------------------------------------------------------------------------
# Errors: turn pydantic's into one InputError naming the field and the fix.

_FIXES = {
    "extra_forbidden": "remove it (check the spelling against docs/infrastructure.md)",
    "missing": "add it",
    "literal_error": "use one of the allowed values",
    "int_parsing": "use a whole number",
    "int_type": "use a whole number",
    "int_from_float": "use a whole number",
    "float_type": "use a number",
    "bool_type": "use true or false",
    "float_parsing": "use a number",
    "bool_parsing": "use true or false",
    "string_type": "use a string",
    "dict_type": "use a mapping (key: value)",
    "list_type": "use a list",
    "model_type": "use a mapping with the documented keys",
}


def _where(path: str, loc: tuple[Any, ...]) -> str:
    field = ".".join(str(p) for p in loc) if loc else "(top level)"
    return f"{path}: {field}"


def _from_validation_error(error: ValidationError, path: str) -> InputError:
    first = error.errors()[0]
    kind = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    if kind == "extra_forbidden":
        what = f"unknown key {loc[-1]!r}"
    elif kind == "missing":
        what = "required field is missing"
    else:
        what = f"{msg} (got {first.get('input')!r})"
    more = len(error.errors()) - 1
    if more:
        what += f" (and {more} more problem{'s' if more > 1 else ''})"
    return InputError(what, where=_where(path, loc), fix=_FIXES.get(kind, "see docs/infrastructure.md"))


def _bad(path: str, field: str, what: str, fix: str) -> InputError:
    return InputError(what, where=f"{path}: {field}", fix=fix)


def _check(spec: ClusterSpec, path: str) -> None:
    if not NAME_RE.match(spec.name):
        raise _bad(path, "name", f"invalid cluster name {spec.name!r}",
                   "use 1-31 characters: a lowercase letter, then lowercase letters, digits or '-'")
    if spec.nodes < 1:
        raise _bad(path, "nodes", f"nodes must be at least 1 (got {spec.nodes})", "set nodes: 1 or more")
    if spec.disk.size_gb <= 0:
        raise _bad(path, "disk.size_gb", f"disk size must be positive (got {spec.disk.size_gb})",
                   "set disk.size_gb to e.g. 200")
    if spec.max_price is not None and spec.max_price <= 0:
        raise _bad(path, "max_price", f"max_price must be positive (got {spec.max_price})",
                   "remove it (default: the on-demand price) or set a positive $/h")
    for key, value in spec.labels.items():
        if not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(value):
            raise _bad(path, f"labels.{key}", f"label {key}={value!r} is not valid on both clouds",
                       "use lowercase letters, digits, '_' and '-' (keys start with a letter, ≤63 chars)")
    if spec.policy.name:
        from kit.policy import POLICY_NAMES

        if spec.policy.name not in POLICY_NAMES:
            raise _bad(path, "policy.name", f"unknown policy {spec.policy.name!r}",
                       f"use one of {', '.join(POLICY_NAMES)}")
    if spec.backend.type in ("s3", "gcs") and not spec.backend.bucket:
        raise _bad(path, "backend.bucket", f"backend {spec.backend.type} needs a bucket",
                   "set backend.bucket to an existing bucket, or use backend.type: local")
    _check_backend_names(spec, path)
    if spec.cloud == "local":
        return
    _check_backend_choice(spec, path)
    # -- cloud clusters ---------------------------------------------------------------------
    for field in ("region", "zone", "instance_type"):
        if not getattr(spec, field):
            raise _bad(path, field, f"{field} is required for cloud {spec.cloud}", f"add {field}: ...")
    if spec.cloud == "gcp" and not spec.project:
        raise _bad(path, "project", "project is required for cloud gcp", "add project: <your GCP project id>")
    if spec.cloud == "aws" and spec.project:
        raise _bad(path, "project", "project is a GCP field", "remove it for cloud aws")
    zones = catalog.zones_of(spec.cloud, spec.region)
    if zones is not None and spec.zone not in zones:
        raise _bad(path, "zone", f"zone {spec.zone!r} is not in region {spec.region!r}",
                   f"use one of {', '.join(zones)}")
    if zones is None and not spec.zone.startswith(spec.region):
        raise _bad(path, "zone", f"zone {spec.zone!r} is not in region {spec.region!r}",
                   f"use a zone of {spec.region}, e.g. {spec.region}{'a' if spec.cloud == 'aws' else '-a'}")
    itype = spec.instance
    if itype is None and spec.gpus_per_node is None:
        raise _bad(path, "gpus_per_node", f"instance type {spec.instance_type!r} is not in kit's catalog",
                   "set gpus_per_node (and prices) yourself, or use a catalog type (kit/catalog.py)")
    if itype is not None and spec.gpus_per_node is not None and spec.gpus_per_node != itype.gpus:
        raise _bad(path, "gpus_per_node", f"{spec.instance_type} has {itype.gpus} GPU(s), not {spec.gpus_per_node}",
                   f"remove gpus_per_node or set it to {itype.gpus}")
    if itype is not None and not itype.on_demand:
        if spec.market == "on-demand":
            raise _bad(path, "market", f"{spec.instance_type} cannot run on-demand ({itype.note})",
                       "set market: spot, or use an instance type sold on-demand")
        if policy_may_use_on_demand(spec):
            raise _bad(path, "policy", f"policy {spec.policy.name!r}"
                       f"{' with a deadline' if spec.policy.deadline_hours is not None else ''} may move the job "
                       f"to on-demand, but {spec.instance_type} has no on-demand ({itype.note})",
                       "use policy.name: spot (or default/greedy/up) without deadline_hours, "
                       "or an instance type sold on-demand")
    if spec.placement == "cluster" and itype is not None and not itype.placement:
        raise _bad(path, "placement", f"{spec.instance_type} does not support cluster/compact placement",
                   "set placement: none, or use a type that supports it (AWS g5/p4d/p5, GCP a2/a3)")
    if spec.placement == "cluster" and spec.cloud == "gcp" and spec.nodes > 1500:
        raise _bad(path, "nodes", "a compact placement policy holds at most 1500 VMs", "use fewer nodes")
    if spec.efa:
        # An EFA interface is only useful with the EFA installer, aws-ofi-nccl, the NCCL environment
        # and every interface the type has; kit does not set those up yet, so it refuses rather than
        # create an interface nothing uses.
        raise _bad(path, "efa", "EFA is not supported by kit yet (it needs the EFA installer, aws-ofi-nccl "
                   "and one interface per network card, which kit does not set up)",
                   "remove efa (NCCL then uses TCP sockets over the ENA interface)")
    if spec.monitoring and spec.cloud != "aws":
        raise _bad(path, "monitoring", "monitoring is AWS detailed monitoring", f"remove it for cloud {spec.cloud}")
    if spec.ssh.os_login and spec.cloud != "gcp":
        raise _bad(path, "ssh.os_login", "OS Login is a GCP feature", f"remove ssh.os_login for cloud {spec.cloud}")
    _check_disk_type(spec, path)
    if spec.cloud == "gcp" and spec.max_price is not None:
        raise _bad(path, "max_price", "GCP Spot VMs have no price cap",
                   "remove max_price for cloud gcp (it is an AWS spot option)")
    if spec.cloud == "aws" and spec.image is not None and not AMI_RE.match(spec.image):
        raise _bad(path, "image", f"{spec.image!r} is not an AMI id",
                   "use an AMI id of the region (ami-0123456789abcdef0), or leave image out for the AWS Deep "
                   "Learning Base AMI (Ubuntu 22.04)")
    # -- ssh -------------------------------------------------------------------------------
    if not spec.ssh.allowed_cidrs:
        raise _bad(path, "ssh.allowed_cidrs", "no CIDR allowed to reach SSH",
                   "list the networks that may SSH in, e.g. allowed_cidrs: [203.0.113.7/32]")
    for i, cidr in enumerate(spec.ssh.allowed_cidrs):
        try:
            net = ipaddress.ip_network(cidr, strict=True)
        except ValueError as error:
            raise _bad(path, f"ssh.allowed_cidrs[{i}]", f"not a CIDR: {cidr!r} ({error})",
                       "write it as a network, e.g. 203.0.113.0/24 or 203.0.113.7/32") from None
        if net.version != 4:
            raise _bad(path, f"ssh.allowed_cidrs[{i}]", f"IPv6 CIDR {cidr!r} is not supported yet",
                       "use an IPv4 CIDR")
        if net.prefixlen < WORLD_PREFIX and not spec.ssh.allow_world:
            raise _bad(path, f"ssh.allowed_cidrs[{i}]",
                       f"SSH open to {net.num_addresses:,} addresses ({cidr}) is refused as world-open",
                       "list your own networks (/8 or narrower), or set ssh.allow_world: true if you really mean it")
    if not spec.ssh.user or not re.match(r"^[a-z_][a-z0-9_-]*$", spec.ssh.user):
        raise _bad(path, "ssh.user", f"invalid user name {spec.ssh.user!r}", "use e.g. ubuntu")
    key = spec.ssh.public_key
    if not (key.startswith("~") or Path(key).is_absolute()):
        # Terraform reads it with file() from the rendered root module's directory, not from here.
        raise _bad(path, "ssh.public_key", f"relative key path {key!r}",
                   "use an absolute path or one under ~, e.g. ~/.ssh/id_ed25519.pub")
    if not key.endswith(".pub"):
        raise _bad(path, "ssh.public_key", f"{key!r} does not look like a public key file",
                   "point it at the .pub half of your key pair (kit finds the private half beside it)")
    # -- network -----------------------------------------------------------------------------
    net = spec.network
    if spec.cloud == "aws" and (net.name or net.subnetwork or net.create is not None):
        raise _bad(path, "network", "network.name/subnetwork/create are GCP fields",
                   "for AWS use network.vpc_id and network.subnet_id (or leave network out: default VPC)")
    if spec.cloud == "gcp" and (net.vpc_id or net.subnet_id):
        raise _bad(path, "network", "network.vpc_id/subnet_id are AWS fields",
                   "for GCP use network.name (+ subnetwork) or network.create: true")
    if spec.cloud == "gcp" and net.create and (net.name or net.subnetwork):
        raise _bad(path, "network.create", "create: true makes a new network; name/subnetwork name an existing one",
                   "use one or the other")
    if spec.cloud == "gcp" and net.create is False and not net.name:
        raise _bad(path, "network.create", "create: false needs the existing network to use",
                   "name it (network.name: default, for the project's default network), or leave create out")
    try:
        ipaddress.ip_network(net.cidr, strict=True)
    except ValueError:
        raise _bad(path, "network.cidr", f"not a CIDR: {net.cidr!r}", "use e.g. 10.42.0.0/20") from None
    if spec.cloud == "gcp" and net.egress_cidrs != ["0.0.0.0/0"]:
        raise _bad(path, "network.egress_cidrs", "egress_cidrs is an AWS field (GCP networks allow all egress)",
                   "remove it for cloud gcp, or restrict egress with your own firewall rules")
    for i, cidr in enumerate(net.egress_cidrs):
        try:
            ipaddress.IPv4Network(cidr, strict=True)
        except ValueError as error:
            raise _bad(path, f"network.egress_cidrs[{i}]", f"not an IPv4 CIDR: {cidr!r} ({error})",
                       "write it as a network, e.g. 0.0.0.0/0 or 10.0.0.0/8") from None


_DISK_TYPES = {"aws": catalog.EBS_TYPES, "gcp": ("pd-balanced", "pd-ssd", "pd-standard", "hyperdisk-balanced")}


def _check_disk_type(spec: ClusterSpec, path: str) -> None:
    """The data-disk type exists on the cloud, and the machine type can attach it (catalog)."""
    known = _DISK_TYPES[spec.cloud]
    if spec.disk.type and spec.disk.type not in known:
        raise _bad(path, "disk.type", f"unknown {spec.cloud} disk type {spec.disk.type!r}", f"use one of {', '.join(known)}")
    itype = spec.instance
    if itype is not None and itype.disk_types and spec.disk_type not in itype.disk_types:
        raise _bad(path, "disk.type", f"{spec.instance_type} cannot attach a {spec.disk_type} disk",
                   f"use one of {', '.join(itype.disk_types)}")


def _check_backend_choice(spec: ClusterSpec, path: str) -> None:
    if spec.cloud in ("aws", "gcp") and "backend" not in spec.model_fields_set:
        raise _bad(path, "backend", "a cloud cluster needs its Terraform state somewhere that outlives this machine",
                   f"add backend: {{type: {'s3' if spec.cloud == 'aws' else 'gcs'}, bucket: <an existing bucket>}}, "
                   "or backend: {type: local} to keep the state in deploy/<name>/ on this machine only")


def spec_warnings(spec: ClusterSpec) -> list[str]:
    """What a valid spec still risks, for the commands that act on it to print."""
    out = []
    if spec.cloud in ("aws", "gcp") and spec.backend.type == "local":
        out.append("the Terraform state stays in deploy/<name>/ on this machine (backend: local): if it is lost, "
                   "kit no longer knows the cluster's instances and data disks, and `kit destroy` cannot delete "
                   "them; use an s3/gcs backend for anything that matters")
    if spec.cloud == "gcp" and not spec.creates_network:
        out.append(f"network {spec.network.name or spec.network.subnetwork!r} is not the cluster's own: its other "
                   "firewall rules reach the nodes too (the default network's default-allow-ssh admits SSH from "
                   "0.0.0.0/0); `kit plan` lists the ones wider than ssh.allowed_cidrs; leave network out for a "
                   "network whose only SSH rule is ssh.allowed_cidrs")
    return out


def policy_may_use_on_demand(spec: ClusterSpec) -> bool:
    """Whether the spec's policy can ever answer on-demand: with a deadline every policy keeps the
    safety net; without one, only ``on-demand`` and ``threshold`` (its cooldown) leave spot."""
    return spec.policy.deadline_hours is not None or spec.policy.name in ("on-demand", "threshold")


def _check_backend_names(spec: ClusterSpec, path: str) -> None:
    """Values that go into the rendered backend blocks: refuse what no bucket/prefix/region can be."""
    b = spec.backend
    if b.type == "local":
        for field in ("bucket", "prefix", "region"):
            if getattr(b, field) is not None:
                raise _bad(path, f"backend.{field}", f"backend.{field} is only for s3/gcs backends",
                           "remove it, or set backend.type: s3 or gcs")
        return
    if not BUCKET_RE.match(b.bucket):
        raise _bad(path, "backend.bucket", f"{b.bucket!r} is not a valid bucket name",
                   "use lowercase letters, digits, '-', '.', '_' (3-222 chars, starting and ending with a letter/digit)")
    if b.prefix is not None and (not PREFIX_RE.match(b.prefix) or b.prefix.startswith("/") or ".." in b.prefix):
        raise _bad(path, "backend.prefix", f"{b.prefix!r} is not a usable state prefix",
                   "use letters, digits, '.', '_', '-' and '/' (no leading '/', no '..'), e.g. kit/my-cluster")
    if b.region is not None and (b.type != "s3" or not REGION_RE.match(b.region)):
        raise _bad(path, "backend.region", f"backend.region {b.region!r} is not an AWS region for an s3 backend",
                   "use e.g. us-east-1 (s3 only; leave it out to use the cluster's region)")


def _fill_defaults(spec: ClusterSpec) -> ClusterSpec:
    itype = spec.instance
    update: dict[str, Any] = {}
    if spec.gpus_per_node is None:
        update["gpus_per_node"] = itype.gpus if itype else (1 if spec.cloud == "local" else None)
    prices = spec.prices.model_copy()
    if itype is not None:
        if prices.spot_per_hour is None:
            prices.spot_per_hour = itype.spot_per_hour
        if prices.on_demand_per_hour is None:
            prices.on_demand_per_hour = itype.on_demand_per_hour
    elif spec.cloud == "local":
        meta = _local_trace_prices(spec)
        if prices.spot_per_hour is None:
            prices.spot_per_hour = meta.get("spot_per_hour", 1.0)
        if prices.on_demand_per_hour is None:
            prices.on_demand_per_hour = meta.get("on_demand_per_hour", 4.0)
    update["prices"] = prices
    # max_price stays None unless set: AWS then caps spot at the *region's* on-demand price, which
    # the catalog's us-east-1 list price is not (a lower cap would fail launches elsewhere).
    return spec.model_copy(update=update)


def _local_trace_prices(spec: ClusterSpec) -> dict[str, float]:
    """Prices from the local trace's metadata, when it has them (``local.trace`` is resolved by then)."""
    if not spec.local.trace:
        return {}
    from kit.traces import load_trace

    meta = load_trace(spec.local.trace).metadata
    out = {}
    for key, name in (("spot_per_hour", "spot_price_per_hour"), ("on_demand_per_hour", "on_demand_price_per_hour")):
        if meta.get(name) is not None:
            out[key] = float(meta[name])
    return out


def _resolve_local_trace(spec: ClusterSpec, path: str) -> ClusterSpec:
    """``local.trace`` as an absolute path: a file from the current directory or the spec's, or a
    trace bundled with kit (``gcp-a3-h100-2025-10/us-central1-c.json``). Refused here, before
    anything is written, when it does not exist or is not a valid trace file."""
    if spec.cloud != "local" or not spec.local.trace:
        return spec
    from kit.traces import load_trace, resolve

    where = f"{path}: local.trace"
    found = resolve(spec.local.trace, relative_to=Path(path).parent, where=where)
    if not found.is_file():
        raise _bad(path, "local.trace", f"{spec.local.trace!r} is a directory; local mode replays one zone's file",
                   f"name one file of the set, e.g. {spec.local.trace.rstrip('/')}/<zone>.json")
    load_trace(found)  # a bad file is refused with its own where/fix
    return spec.model_copy(update={"local": spec.local.model_copy(update={"trace": str(found)})})


def parse_spec(data: Any, path: str = "cluster.yaml") -> ClusterSpec:
    if not isinstance(data, dict):
        raise InputError("the spec must be a YAML mapping", where=path, fix="start from examples/aws-g5-spot.yaml")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as error:
        raise _from_validation_error(error, path) from None
    _check(spec, path)
    spec = _resolve_local_trace(spec, path)
    spec = _fill_defaults(spec)
    spec._source = path
    return spec


def load_spec(path: str | Path) -> ClusterSpec:
    path = Path(path)
    shown = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("spec file not found", where=shown, fix="pass the path of your cluster.yaml") from None
    except OSError as error:
        raise InputError(f"cannot read the spec: {error.strerror}", where=shown, fix="check the path") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark else shown
        raise InputError(f"not valid YAML: {getattr(error, 'problem', error)}", where=where,
                         fix="fix the YAML syntax (indentation, colons, quotes)") from None
    return parse_spec(data, shown)


def check_ssh_key(spec: ClusterSpec) -> str:
    """Before a render, plan or apply (not in ``kit validate``: a spec is often checked where the
    key is not): the public key must exist and be an OpenSSH public key; returns its one line."""
    if spec.cloud not in ("aws", "gcp"):
        return ""
    path = Path(spec.ssh.public_key).expanduser()
    try:
        text = path.read_text().strip()
    except OSError as error:
        raise InputError(f"ssh public key {spec.ssh.public_key} cannot be read ({error.strerror})",
                         where="ssh.public_key",
                         fix="create a key pair with `ssh-keygen -t ed25519` or point ssh.public_key at yours") from None
    if not re.match(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+) [A-Za-z0-9+/=]+", text):
        raise InputError(f"{spec.ssh.public_key} is not an OpenSSH public key", where="ssh.public_key",
                         fix="use the .pub file ssh-keygen wrote (one line starting with ssh-ed25519, ssh-rsa, ...)")
    return text.splitlines()[0].strip()


def training_args(spec: ClusterSpec) -> list[str]:
    """``training.train`` flags for the spec's training section (boolean flags only when true)."""
    t = spec.training
    args = ["--model", t.model, "--image-size", str(t.image_size), "--num-classes", str(t.num_classes),
            "--batch-size", str(t.batch_size), "--steps", str(t.steps), "--lr", repr(t.lr),
            "--warmup-steps", str(t.warmup_steps), "--ckpt-dir", t.ckpt_dir, "--ckpt-every", str(t.ckpt_every),
            "--keep", str(t.keep), "--seed", str(t.seed), "--data", t.data, "--log-every", str(t.log_every)]
    if t.ckpt_every_seconds is not None:
        args += ["--ckpt-every-seconds", repr(t.ckpt_every_seconds)]
    if t.device is not None:
        args += ["--device", t.device]
    if t.deterministic:
        args.append("--deterministic")
    if t.compile:
        args.append("--compile")
    return args

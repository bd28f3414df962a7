"""The cluster spec (``cluster.yaml``): one pydantic model per cloud, discriminated on ``cloud``.

``load_spec(path)`` returns the cloud's model (``kit/clouds/<cloud>.py``: ``AwsSpec``, ``GcpSpec``,
``LocalSpec``, all :class:`SpecBase`) or raises ``InputError`` naming the field
(``where="cluster.yaml: ssh.allowed_cidrs[1]"``) and the fix. Every rule is a validator on the model
it concerns; a rule's failure is a :class:`SpecProblem` that carries its field and fix. Nothing is
written while loading.

This module holds what every cloud shares: the sections (disk, ssh, backend, prices, training,
policy), :class:`SpecBase` and :class:`CloudSpec` (the rules of a real cloud: region and zone,
instance type, placement, disk type, SSH), and the loading functions.
"""

from __future__ import annotations

import ipaddress
import os
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from kit.errors import InputError
from kit.policy import DEFAULT_CHANGEOVER_H, POLICY_NAMES
from kit.policy.offers import (
    DEFAULT_CHECKPOINT_GB,
    DEFAULT_TRANSFER_GBPS,
    MAX_CHECKPOINT_GB,
    MAX_EGRESS_PER_GB,
    MAX_HOURS,
    MAX_NODES,
    MAX_PRICE_PER_HOUR,
    MIN_TRANSFER_GBPS,
    Moves,
)
from kit.validation import (
    SHOWN_CHARS,
    Finite,
    describe,
    field_of,
    more_problems,
    require_mapping,
    shown,
)
from training.config import FIELDS as TRAINING_FIELDS
from training.config import to_flags
from training.contract import MARKETS

NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,30}")
LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")  # S3 and GCS naming rules, together
PREFIX_RE = re.compile(r"[A-Za-z0-9._/-]{1,200}")
REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-?[0-9]+")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
WORLD_PREFIX = 8  # a CIDR wider than /8 (e.g. 0.0.0.0/1 + 128.0.0.0/1) counts as world-open
MAX_DISK_GB = 65536
# a day: 98.7 % of the spot outages (no node free) of a zone in the bundled GCP H100 traces are shorter (835
# outages, median 10 min, longest 141 h): a job that left for one can still come back to its disks
DEFAULT_KEEP_LEFT_HOURS = 24.0
MAX_KEEP_LEFT_HOURS = 24.0 * 365
# A zone: GCP's are resource names, RFC 1035 labels `[a-z]([-a-z0-9]*[a-z0-9])?` of at most 63 characters
# (https://cloud.google.com/compute/docs/naming-resources#resource-name-format); an AWS Availability Zone is
# its Region code followed by a letter, e.g. us-east-1a
# (https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html). A zone also
# names a directory and a file (the local cloud's deploy/<name>/local/disks/<zone>/, a trace set's
# <zone>.json) and one part of an offer's name (<zone>/<shape>/<market>): no '/', '.' or space.
ZONE_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
ZONE_RULE = ("lowercase letters, digits and '-' (a letter first, not '-' last, at most 63), "
             "e.g. us-central1-a or us-east-1a")
# An instance type: AWS's are family and generation, a period and the size (g5.4xlarge, u-6tb1.metal,
# c7i.metal-24xl: https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html), GCP's
# machine types are resource names (a3-highgpu-8g, n1-custom-8-30720; the page above on GCP's names). The
# type is part of an offer's name too, so no '/'.
INSTANCE_TYPE_RE = re.compile(r"[a-z][-a-z0-9]{0,62}(\.[a-z0-9][-a-z0-9]{0,30})?")
INSTANCE_TYPE_RULE = "lowercase letters, digits and '-', with at most one '.' (e.g. g5.4xlarge or a3-highgpu-8g)"
# What no string of a spec may hold: the C0 control characters and DEL. Its values reach command lines
# (a NUL cannot: execve takes C strings), paths and rendered files.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class SpecProblem(ValueError):
    """A rule of the spec that failed: the field (dotted, from the spec's root; "" where pydantic found the
    value, for a rule of a type used in many fields), what, and the fix."""

    def __init__(self, field: str, what: str, fix: str):
        super().__init__(what)
        self.field, self.what, self.fix = field, what, fix


def _at(parent: str, key: Any) -> str:
    """The field path of the user's own ``key`` under ``parent`` (quoted and bounded unless short and plain)."""
    plain = isinstance(key, str) and len(key) <= SHOWN_CHARS and not CONTROL_RE.search(key)
    return f"{parent}.{key if plain else shown(key)}"


def _printable(text: str) -> str:
    found = CONTROL_RE.search(text)
    if found:
        raise SpecProblem("", f"{shown(text)} holds the control character {found.group()!r}",
                          "remove it (the value goes into command lines and paths)")
    return text


def _zone_name(zone: str) -> str:
    if not ZONE_RE.fullmatch(zone):
        raise SpecProblem("", f"{shown(zone)} is not a zone name", f"use {ZONE_RULE}")
    return zone


def _instance_type_name(name: str) -> str:
    if not INSTANCE_TYPE_RE.fullmatch(name):
        raise SpecProblem("", f"{shown(name)} is not an instance type name", f"use {INSTANCE_TYPE_RULE}")
    return name


Hours = Annotated[Finite, Field(le=MAX_HOURS)]
Price = Annotated[Finite, Field(gt=0, le=MAX_PRICE_PER_HOUR)]  # $/h
Text = Annotated[str, AfterValidator(_printable)]  # any string of the spec without a rule of its own
ZoneName = Annotated[str, AfterValidator(_zone_name)]
InstanceTypeName = Annotated[str, AfterValidator(_instance_type_name)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


# ------------------------------------------------------------------------------------------------
# Sections every cloud has


class DiskSection(_Model):
    size_gb: StrictInt = 200
    type: Text | None = None  # default: the machine family's first disk type (catalog)
    # A job that moved may come back to a zone (spot outages there last hours): its disks are kept this
    # many hours after the last node left them, then deleted (null: until the job ends)
    keep_left_hours: Finite | None = DEFAULT_KEEP_LEFT_HOURS

    @field_validator("keep_left_hours")
    @classmethod
    def _keep(cls, value: float | None) -> float | None:
        if value is not None and not (0 <= value <= MAX_KEEP_LEFT_HOURS):
            raise SpecProblem("disk.keep_left_hours", f"must be 0 to {MAX_KEEP_LEFT_HOURS:g} hours (got {value})",
                              "e.g. 24, or null to keep the disks of zones the job left until it ends")
        return value

    @field_validator("size_gb")
    @classmethod
    def _size(cls, value: int) -> int:
        if not 0 < value <= MAX_DISK_GB:
            raise SpecProblem("disk.size_gb", f"disk size must be 1 to {MAX_DISK_GB} GB (got {value})",
                              "set disk.size_gb to e.g. 200")
        return value


class SshSection(_Model):
    user: Text = "ubuntu"
    public_key: Text = "~/.ssh/id_ed25519.pub"
    allowed_cidrs: list[str] = Field(default_factory=list)
    allow_world: StrictBool = False
    # Connect only to the host keys the cloud's API published for each node (kit.remote.KnownHosts);
    # false: accept whatever key answers, for images that publish none
    verify_host_keys: StrictBool = True

    @field_validator("allowed_cidrs")
    @classmethod
    def _canonical_cidrs(cls, cidrs: list[str]) -> list[str]:
        for i, cidr in enumerate(cidrs):
            try:
                net = ipaddress.ip_network(cidr, strict=True)
            except ValueError as error:
                raise SpecProblem(f"ssh.allowed_cidrs[{i}]", f"not a CIDR: {shown(cidr)} ({error})",
                                  "write it as a network, e.g. 203.0.113.0/24 or 203.0.113.7/32") from None
            if net.version != 4:
                raise SpecProblem(f"ssh.allowed_cidrs[{i}]", f"IPv6 CIDR {shown(cidr)} is not supported yet",
                                  "use an IPv4 CIDR")
        return [str(ipaddress.ip_network(c)) for c in cidrs]


class BackendSection(_Model):
    type: Literal["local", "s3", "gcs"] = "local"
    bucket: str | None = None
    prefix: str | None = None       # key prefix (s3) / prefix (gcs); default kit/<name>
    region: str | None = None       # s3 only; default the cluster region

    @model_validator(mode="after")
    def _names(self) -> BackendSection:
        """Values that go into the rendered backend blocks: refuse what no bucket/prefix/region can be."""
        if self.type == "local":
            for field in ("bucket", "prefix", "region"):
                if getattr(self, field) is not None:
                    raise SpecProblem(f"backend.{field}", f"backend.{field} is only for s3/gcs backends",
                                      "remove it, or set backend.type: s3 or gcs")
            return self
        if not self.bucket:
            raise SpecProblem("backend.bucket", f"backend {self.type} needs a bucket",
                              "set backend.bucket to an existing bucket, or use backend.type: local")
        if not BUCKET_RE.fullmatch(self.bucket):
            raise SpecProblem("backend.bucket", f"{shown(self.bucket)} is not a valid bucket name",
                              "use lowercase letters, digits, '-', '.', '_' (3-222 chars, starting and ending "
                              "with a letter/digit)")
        if self.prefix is not None and (not PREFIX_RE.fullmatch(self.prefix) or self.prefix.startswith("/")
                                        or ".." in self.prefix):
            raise SpecProblem("backend.prefix", f"{shown(self.prefix)} is not a usable state prefix",
                              "use letters, digits, '.', '_', '-' and '/' (no leading '/', no '..'), e.g. kit/my-cluster")
        if self.region is not None and (self.type != "s3" or not REGION_RE.fullmatch(self.region)):
            raise SpecProblem("backend.region", f"backend.region {shown(self.region)} is not an AWS region for an "
                              "s3 backend",
                              "use e.g. us-east-1 (s3 only; leave it out to use the cluster's region)")
        return self


SCALARS = (str, bool, int, float)


class BootstrapSection(_Model):
    """``bootstrap.vars``: values for kit's Ansible roles (their ``defaults/main.yml``), e.g. a package
    mirror (``python_env_pip_extra_args``) or the versions an image already has installed, so that the
    roles find them present instead of installing (``python_env_torch_version``). Names must carry a
    role's prefix; what kit itself sets (cluster layout, paths, the agent's endpoint) cannot be set here."""

    vars: dict[str, Any] = Field(default_factory=dict)

    @field_validator("vars")
    @classmethod
    def _role_variables(cls, values: dict[str, Any]) -> dict[str, Any]:
        from kit.bootstrap import KIT_VARS, ROLES

        for name, value in values.items():
            if not any(name.startswith(f"{role}_") for role in ROLES):
                raise SpecProblem(_at("bootstrap.vars", name), f"{shown(name)} is not a variable of kit's roles",
                                  f"use a variable of {', '.join(ROLES)} (ansible/roles/<role>/defaults/main.yml; "
                                  "each starts with its role's name)")
            if name in KIT_VARS:
                raise SpecProblem(_at("bootstrap.vars", name), f"kit sets {name} itself (from the spec and the deployment)",
                                  "remove it; change the spec field it comes from instead")
            items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
            if not all(isinstance(v, SCALARS) for v in items) or (isinstance(value, dict) and not all(
                    isinstance(k, str) for k in value)):
                raise SpecProblem(_at("bootstrap.vars", name), f"{shown(name)} is a nested {type(value).__name__}: roles' "
                                  "variables here are strings, numbers, booleans, or lists or mappings of them",
                                  "write e.g. python_env_pip_extra_args: [--no-index] or "
                                  "trainer_extra_env: {NCCL_SOCKET_IFNAME: ens5}")
        return values


class ZonePrices(_Model):
    spot_per_hour: Price | None = None
    on_demand_per_hour: Price | None = None


class PricesSection(ZonePrices):
    # Where a zone or a region prices the spec's own instance type otherwise (GCP sets prices per region,
    # https://cloud.google.com/compute/vm-instance-pricing; AWS spot prices per Availability Zone,
    # https://aws.amazon.com/ec2/spot/pricing/): its entry, a zone's before its region's, before the two above.
    # The offers, the capacity search's ranking and the recorded cost of each node use it.
    zones: dict[str, ZonePrices] = Field(default_factory=dict)

    def of(self, zone: str | None) -> ZonePrices:
        """The prices in ``zone`` (None: the top-level ones), each one from the most specific entry that says it."""
        from kit.policy.offers import region_of

        entries = [self.zones.get(zone), self.zones.get(region_of(zone))] if zone else []
        pick = {key: next((getattr(e, key) for e in entries if e is not None and getattr(e, key) is not None),
                          getattr(self, key)) for key in ("spot_per_hour", "on_demand_per_hour")}
        return ZonePrices(**pick)


def _training_section() -> type[_Model]:
    """The spec's ``training:`` section: the trainer's settings (training/config.py), their defaults
    and bounds, as a pydantic model; ``training_args`` turns it back into the trainer's flags."""
    fields: dict[str, Any] = {}
    for s in TRAINING_FIELDS:
        kind: Any = {int: StrictInt, bool: StrictBool, float: Finite, str: Text}[s.type]
        if s.choices:
            kind = Literal[s.choices]
        bounds = {"ge": s.minimum} if s.minimum is not None else ({"gt": 0} if s.positive else {})
        kind = Annotated[kind, Field(**bounds, description=s.help)]
        fields[s.name] = (kind | None if s.optional else kind, s.default)
    return create_model("TrainingSection", __base__=_Model, **fields)


if TYPE_CHECKING:  # statically a model; its fields exist only at run time, built from training/config.py
    class TrainingSection(_Model):
        def __getattr__(self, name: str) -> Any: ...
else:
    TrainingSection = _training_section()


class ThresholdSection(_Model):
    k: StrictInt = Field(3, ge=1)
    window_hours: Annotated[Hours, Field(gt=0)] = 6.0
    cooldown_hours: Annotated[Hours, Field(ge=0)] = 6.0


class PolicySection(_Model):
    name: str = "default"
    deadline_hours: Annotated[Hours, Field(gt=0)] | None = None
    changeover_hours: Annotated[Hours, Field(ge=0)] = DEFAULT_CHANGEOVER_H
    # What a move to another zone costs a job that may move (kit.policy.offers.Moves): the checkpoint's
    # size and transfer rate (hours billed without progress) and egress $/GB (None: the clouds' list
    # prices). The same facts as ``kit simulate --checkpoint-gb / --transfer-gbps / --egress-per-gb``,
    # so the watcher ranks the zones as the simulator does. No size: the trainer's newest checkpoint.
    # (bounds: Moves.check's, kit.policy.offers)
    checkpoint_gb: Annotated[Finite, Field(ge=0, le=MAX_CHECKPOINT_GB)] | None = None
    transfer_gbps: Annotated[Finite, Field(ge=MIN_TRANSFER_GBPS)] = DEFAULT_TRANSFER_GBPS
    egress_per_gb: Annotated[Finite, Field(ge=0, le=MAX_EGRESS_PER_GB)] | None = None
    threshold: ThresholdSection = Field(default_factory=ThresholdSection)

    def moves(self, measured_gb: float | None = None) -> Moves:
        """What moving this job's checkpoint costs: of ``checkpoint_gb``, else of the size the trainer
        reported (``measured_gb``), else of the simulator's default size."""
        size = next((gb for gb in (self.checkpoint_gb, measured_gb) if gb is not None), DEFAULT_CHECKPOINT_GB)
        return Moves(checkpoint_gb=size, transfer_gbps=self.transfer_gbps, egress_per_gb=self.egress_per_gb)

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in POLICY_NAMES:
            raise SpecProblem("policy.name", f"unknown policy {shown(name)}", f"use one of {', '.join(POLICY_NAMES)}")
        return name


class ShapeSection(_Model):
    """One way to buy the job's GPUs: ``nodes`` x ``instance_type`` (a cloud) or ``nodes`` x
    ``gpus_per_node`` processes (local), on ``markets`` (default: every market the type is sold on).
    Every shape of a job has the same GPU count, so the trainer's world size never changes."""

    instance_type: InstanceTypeName | None = None
    nodes: StrictInt = Field(ge=1, le=MAX_NODES)
    gpus_per_node: StrictInt | None = Field(None, ge=1)
    markets: list[Literal["spot", "on-demand"]] | None = Field(None, min_length=1)


# The URL schemes of ``checkpoint_bucket`` (fsspec): what each cloud's nodes can write to.
BUCKET_URL_RE = re.compile(r"(?P<scheme>[a-z0-9]+)://(?P<rest>\S+)")


# ------------------------------------------------------------------------------------------------
# The spec


class SpecBase(_Model):
    """What every cluster has, whatever its cloud."""

    name: str
    cloud: str
    nodes: StrictInt = 1
    market: Literal["spot", "on-demand"] = "spot"
    gpus_per_node: StrictInt | None = Field(None, ge=1)
    disk: DiskSection = Field(default_factory=DiskSection)
    ssh: SshSection = Field(default_factory=SshSection)
    labels: dict[str, str] = Field(default_factory=dict)
    backend: BackendSection = Field(default_factory=BackendSection)
    prices: PricesSection = Field(default_factory=PricesSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    policy: PolicySection = Field(default_factory=PolicySection)
    # Where the job may run (kit.policy.offers): candidate zones and instance shapes; the job starts on
    # the spec's own zone and shape (the first of each list when those are left out).
    zones: list[ZoneName] | None = Field(None, min_length=1)
    shapes: list[ShapeSection] | None = Field(None, min_length=1)
    # The durable checkpoint tier (training/bucket.py): s3://bucket/prefix, gs://bucket/prefix, file:///dir.
    checkpoint_bucket: Text | None = None
    # Where the spec came from (not a YAML field): the generated-file header names it.
    _source: str | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.fullmatch(name):
            raise SpecProblem("name", f"invalid cluster name {shown(name)}",
                              "use 1-31 characters: a lowercase letter, then lowercase letters, digits or '-'")
        return name

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, nodes: int) -> int:
        if not 1 <= nodes <= MAX_NODES:
            raise SpecProblem("nodes", f"nodes must be 1 to {MAX_NODES} (got {nodes})", "set nodes: 1 or more")
        return nodes

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(value):
                raise SpecProblem(_at("labels", key), f"label {shown(key)}={shown(value)} is not valid on both clouds",
                                  "use lowercase letters, digits, '_' and '-' (keys start with a letter, ≤63 chars)")
        return labels

    @model_validator(mode="before")
    @classmethod
    def _start_on_the_first_shape(cls, data: Any) -> Any:
        """``shapes`` without top-level ``nodes``/``gpus_per_node``: the job starts on the first shape."""
        if isinstance(data, dict) and isinstance(data.get("shapes"), list) and data["shapes"]:
            first = data["shapes"][0]
            if isinstance(first, dict):
                data = dict(data)
                # a cloud shape's GPUs come from the catalog (checked per shape); a local one's are processes
                keys = ("nodes", "instance_type") if first.get("instance_type") else ("nodes", "gpus_per_node")
                for key in keys:
                    if key in first and key not in data and key in cls.model_fields:
                        data[key] = first[key]
        return data

    @model_validator(mode="after")
    def _where_to_run(self) -> SpecBase:
        from kit.policy.offers import check_shapes

        zones = self.zone_list
        self._check_places()
        if len(set(zones)) != len(zones):
            raise SpecProblem("zones", f"zones are listed twice: {shown(zones)}", "list each zone once")
        try:
            check_shapes(self.shape_list())
        except InputError as error:
            raise SpecProblem(error.where or "shapes", error.what, error.fix or "fix the shapes") from None
        if self.shapes and not any(_same_gpus(s, self.own_shape) for s in self.shape_list()):
            raise SpecProblem("shapes", f"the job's own shape ({self.nodes} x {self.start_type}) is not one of shapes",
                              "leave nodes/instance_type out (the job starts on the first shape) or list it")
        self._check_bucket()
        self._check_zone_prices()
        return self

    def _check_zone_prices(self) -> None:
        """Each entry of ``prices.zones`` names one of the job's zones or their region."""
        from kit.policy.offers import region_of

        places = list(dict.fromkeys([*self.zone_list, *(region_of(z) for z in self.zone_list)]))
        for key in self.prices.zones:
            if key not in places:
                raise SpecProblem(_at("prices.zones", key), f"{shown(key)} is not one of the job's zones or their "
                                  "regions",
                                  f"use one of {', '.join(places)} (or add the zone to zones)")

    def _check_places(self) -> None:
        """The cloud's own rules for the listed zones and shapes (its catalog), before the shared ones."""

    def _check_bucket(self) -> None:
        url = self.checkpoint_bucket
        if url is None:
            return
        schemes = self.cloud_facts.bucket_schemes
        m = BUCKET_URL_RE.fullmatch(url)
        if m is None or m.group("scheme") not in schemes:
            raise SpecProblem("checkpoint_bucket", f"{shown(url)} is not a {' or '.join(schemes)} URL",
                              f"use {' or '.join(f'{s}://...' for s in schemes)}, e.g. {schemes[0]}://my-bucket/kit")
        rest = m.group("rest")
        if m.group("scheme") == "file":
            if not rest.startswith("/") or ".." in rest.split("/"):
                raise SpecProblem("checkpoint_bucket", f"{shown(url)} is not an absolute directory",
                                  "use file:///absolute/path")
            _check_writable(url, Path(rest))
        elif not BUCKET_RE.fullmatch(rest.split("/", 1)[0]) or ".." in rest:
            raise SpecProblem("checkpoint_bucket", f"{shown(url)} does not start with a valid bucket name",
                              "use lowercase letters, digits, '-', '.', '_' for the bucket (no '..' in the path), "
                              f"e.g. {m.group('scheme')}://my-bucket/kit")

    # -- where to run -------------------------------------------------------------------------
    @property
    def zone_list(self) -> list[str]:
        """The candidate zones (a spec without ``zones`` runs in its one zone)."""
        return list(self.zones or [self.start_zone])

    @property
    def start_zone(self) -> str:
        return "local"

    @property
    def start_type(self) -> str:
        return "local"

    @property
    def own_shape(self):
        """The shape the spec itself names (kit.policy.offers.Shape): its type, nodes and GPUs per node,
        on every market the type is sold on."""
        from kit.policy.offers import Shape

        itype = self.start_type
        return Shape(itype, self.nodes, self.gpus_of(itype, self.gpus_per_node), self.sold_markets(itype))

    def own_offer(self, market: str):
        """The offer of the spec's own zone, shape and ``market`` (where a first launch starts), or None."""
        own = self.own_shape
        return next((o for o in self.offers() if o.zone == self.start_zone and o.market == market
                     and _same_gpus(o.shape, own)), None)

    def gpus_of(self, instance_type: str, given: int | None) -> int:
        """GPUs per node: as given, else the catalog's, else 1 (a local node's processes)."""
        itype = self.cloud_facts.instance(instance_type)
        return int(given or (itype.gpus if itype is not None else 1))

    def sold_markets(self, instance_type: str) -> tuple[str, ...]:
        """The markets the cloud sells ``instance_type`` on (the catalog's; unknown types: both)."""
        itype = self.cloud_facts.instance(instance_type)
        return MARKETS if itype is None or itype.on_demand else ("spot",)

    def shape_list(self) -> list:
        """The shapes (kit.policy.offers.Shape); a spec without ``shapes`` has its own, on every market
        its type is sold on."""
        from kit.policy.offers import Shape

        if not self.shapes:
            return [self.own_shape]
        out = []
        for s in self.shapes:
            itype = s.instance_type or self.start_type
            out.append(Shape(itype, s.nodes, self.gpus_of(itype, s.gpus_per_node),
                             tuple(s.markets or self.sold_markets(itype))))
        return out

    @property
    def can_move(self) -> bool:
        """Whether the job may change zone or shape (and so needs its checkpoints beyond its disks)."""
        return len(self.zone_list) > 1 or len(self.shape_list()) > 1

    def job_prefix(self, bucket: str) -> str:
        """This job's place in a checkpoint bucket URL: ``<bucket>/<name>``."""
        return f"{bucket.rstrip('/')}/{self.name}"

    @property
    def bucket_url(self) -> str | None:
        """This job's prefix in ``checkpoint_bucket`` (the trainer's ``--ckpt-bucket``)."""
        return self.job_prefix(self.checkpoint_bucket) if self.checkpoint_bucket else None

    @property
    def bucket_parts(self) -> tuple[str, str] | None:
        """(bucket, key prefix) of this job's checkpoints in an object store, for the nodes' access."""
        if not self.bucket_url or self.bucket_url.startswith("file://"):
            return None
        bucket, _, prefix = self.bucket_url.split("://", 1)[1].partition("/")
        return bucket, prefix

    def node_price(self, shape, market: str, zone: str | None = None) -> float | None:
        """$/h per node of ``shape`` in ``zone`` (None: the spec's own): the spec's prices for its own type
        (``prices.zones`` where it names the zone or its region), the catalog's for the others (None: unknown,
        e.g. a type outside the catalog whose price the spec does not say)."""
        from training.contract import SPOT

        instance_type = shape.instance_type
        itype = self.cloud_facts.instance(instance_type)
        if instance_type == self.start_type or itype is None:
            prices = self.prices.of(zone or self.start_zone)
            price = prices.spot_per_hour if market == SPOT else prices.on_demand_per_hour
            return None if price is None else float(price)
        return itype.spot_per_hour if market == SPOT else itype.on_demand_per_hour

    def offers(self) -> tuple:
        """Every (zone, shape, market) the job may run on (kit.policy.offers.Offer), $/h for the gang."""
        from kit.policy.offers import Offer

        return tuple(Offer(zone, shape, market, shape.nodes * (self.node_price(shape, market, zone) or 0.0))
                     for zone in self.zone_list for shape in self.shape_list() for market in shape.markets)

    def with_offer(self, offer) -> SpecBase:
        """This spec on ``offer``: its zone, shape and market (what a move or a shape switch renders)."""
        from training.contract import ON_DEMAND, SPOT

        shape = offer.shape
        # prices per node of the new type (the zones' entries are for the spec's own type), so that the moved
        # spec's offers and costs stay its own
        prices = self.prices if shape.instance_type == self.start_type else PricesSection(
            spot_per_hour=self.node_price(shape, SPOT, offer.zone),
            on_demand_per_hour=self.node_price(shape, ON_DEMAND, offer.zone))
        update = {"nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node, "market": offer.market,
                  "prices": prices, **self._offer_update(offer)}
        return self.model_copy(update=update, deep=True)

    def _offer_update(self, offer) -> dict:
        return {}

    @property
    def source(self) -> str | None:
        return self._source

    @property
    def summary(self) -> str:
        return f"{self.nodes} x local node ({self.gpus_per_node} GPU each) on {self.cloud} {self.market}"

    @property
    def cloud_facts(self):
        """This spec's cloud (kit.clouds): catalog, tags, Terraform variables, event source, backend."""
        from kit import clouds

        return clouds.get(self.cloud)

    @property
    def instance(self):
        return None

    @property
    def creates_network(self) -> bool:
        """Whether the cluster gets a network of its own (GCP)."""
        return False

    @property
    def existing_network(self) -> str | None:
        """The existing network the spec opts into, whose other firewall rules reach the nodes (GCP)."""
        return None

    @property
    def installs_ssh_key(self) -> bool:
        """Whether kit installs ``ssh.public_key`` on the nodes (not with GCP's OS Login)."""
        return True

    def with_run_options(self, **options: Any) -> SpecBase:
        """``kit train``'s options that change how this cloud runs the job (the local cloud's
        time scale and injected preemptions); other clouds have none and refuse them."""
        given = {k: v for k, v in options.items() if v is not None and v is not False}
        if given:
            flag = "--" + next(iter(given)).replace("_", "-")
            raise InputError(f"{flag} is for cloud local, not {self.cloud}", where=flag, fix=f"drop {flag}")
        return self

    def with_market(self, market: str) -> SpecBase:
        if market not in MARKETS:
            raise InputError(f"unknown market {shown(market)}", where="market", fix="use spot or on-demand")
        itype = self.instance
        if market == "on-demand" and itype is not None and not itype.on_demand:
            raise InputError(f"{itype.name} cannot run on-demand ({itype.note})",
                             where="market", fix="use spot, or an instance type sold on-demand")
        return self.model_copy(update={"market": market}, deep=True)


def _check_writable(url: str, path: Path) -> None:
    """A ``file://`` bucket is a directory of this machine (the local cloud's nodes are processes of this
    user): it, or the nearest of its parents that exists (the trainer creates the rest), must be a directory
    this user may write. Otherwise every upload would fail, and the nodes only log that."""
    here = path
    try:
        while not here.exists():
            here = here.parent  # the root exists
        # an existing path, in full (the OS bounds its length)
        problem = (f"{here} is not a directory" if not here.is_dir()
                   else None if os.access(here, os.W_OK | os.X_OK) else f"{here} is not writable by this user")
    except OSError as error:  # e.g. a name too long
        problem = f"{shown(str(here))} cannot be looked up ({error.strerror})"
    if problem:
        raise SpecProblem("checkpoint_bucket", f"no checkpoint can be written to {shown(url)}: {problem}",
                          "use a directory this user can write or create, e.g. file:///tmp/kit-ckpts, or leave "
                          "checkpoint_bucket out (kit then uses deploy/<name>/local/bucket)")


def _same_gpus(a, b) -> bool:
    """Two shapes buy the GPUs the same way (type, nodes, GPUs per node), whatever markets they list."""
    return (a.instance_type, a.nodes, a.gpus_per_node) == (b.instance_type, b.nodes, b.gpus_per_node)


ClusterSpec = SpecBase  # the type every cloud's spec has


class CloudSpec(SpecBase):
    """A real cloud: one region and zone, an instance type, placement, a data-disk type, SSH from
    allowed networks, and Terraform state that must be said where it lives."""

    region: Text
    zone: ZoneName
    instance_type: InstanceTypeName
    placement: Literal["cluster", "none"] = "none"
    image: Text | None = None
    backend: BackendSection | None = None  # type: ignore[assignment]  # required: said, even when local
    bootstrap: BootstrapSection = Field(default_factory=BootstrapSection)

    @property
    def instance(self):
        return self.cloud_facts.instance(self.instance_type)

    @model_validator(mode="before")
    @classmethod
    def _start_in_the_first_zone(cls, data: Any) -> Any:
        """``zones`` without ``zone``: the job starts in the first; ``region`` defaults to its region."""
        from kit.policy.offers import region_of

        if isinstance(data, dict) and isinstance(data.get("zones"), list) and data["zones"] and "zone" not in data:
            data = {**data, "zone": data["zones"][0]}
            if "region" not in data and isinstance(data["zone"], str):
                data["region"] = region_of(data["zone"])
        return data

    @property
    def start_zone(self) -> str:
        return self.zone

    def _check_places(self) -> None:
        for i, zone in enumerate(self.zone_list):
            _check_zone(self, zone, f"zones[{i}]" if self.zones else "zone")
        if self.zones and self.zone not in self.zones:
            raise SpecProblem("zone", f"zone {shown(self.zone)} is not one of zones {shown(self.zones)}",
                              "leave zone out (the job starts in the first of zones) or add it to zones")
        _check_shapes(self)

    @property
    def start_type(self) -> str:
        return self.instance_type

    @property
    def region_list(self) -> list[str]:
        """The regions of the candidate zones, the spec's own first."""
        from kit.policy.offers import region_of

        return list(dict.fromkeys([self.region, *(region_of(z) for z in self.zone_list)]))

    def _offer_update(self, offer) -> dict:
        from kit.policy.offers import region_of

        itype = self.cloud_facts.instance(offer.shape.instance_type)
        # one node has nothing to be placed near; a type without placement support gets none
        placement = self.placement if offer.shape.nodes > 1 and (itype is None or itype.placement) else "none"
        update = {"zone": offer.zone, "region": region_of(offer.zone), "instance_type": offer.shape.instance_type,
                  "placement": placement}
        if self.state.type == "s3" and self.state.region is None:
            # The state stays in its bucket, whose region is the spec's (an S3 backend defaults to it); a
            # move to another region must not point the backend elsewhere (S3 answers PermanentRedirect,
            # and `terraform init` sees a changed backend).
            update["backend"] = self.state.model_copy(update={"region": self.region})
        return update

    @property
    def state(self) -> BackendSection:
        """Where the Terraform state lives (validation made sure the spec says)."""
        if self.backend is None:
            raise RuntimeError("a validated cloud spec always has a backend")
        return self.backend

    @property
    def summary(self) -> str:
        return (f"{self.nodes} x {self.instance_type} ({self.gpus_per_node} GPU each) on {self.cloud} {self.zone} "
                f"{self.market}")

    @property
    def disk_type(self) -> str:
        itype = self.instance
        if self.disk.type:
            return self.disk.type
        return itype.disk_types[0] if itype is not None and itype.disk_types else self.cloud_facts.disk_types[0]

    @model_validator(mode="after")
    def _cloud_rules(self) -> CloudSpec:
        _check_state(self)
        _check_instance_type(self)
        _check_disk_type(self)
        _check_ssh(self)
        self._fill_defaults()
        return self

    def _fill_defaults(self) -> None:
        """gpus_per_node and prices from the catalog where the spec leaves them out. max_price stays
        unset: AWS then caps spot at the region's own on-demand price, which the catalog's
        us-east-1 list price is not (a lower cap would fail launches elsewhere)."""
        itype = self.instance
        if itype is None:
            return
        self.gpus_per_node = self.gpus_per_node or itype.gpus
        self.prices = self.prices.model_copy(update={
            "spot_per_hour": self.prices.spot_per_hour or itype.spot_per_hour,
            "on_demand_per_hour": self.prices.on_demand_per_hour or itype.on_demand_per_hour})


def _check_state(spec: CloudSpec) -> None:
    if spec.backend is None:
        hint = spec.cloud_facts.state_backend
        raise SpecProblem("backend", "a cloud cluster needs its Terraform state somewhere that outlives this machine",
                          f"add backend: {{type: {hint}, bucket: <an existing bucket>}}, or backend: {{type: local}} "
                          "to keep the state in deploy/<name>/ on this machine only")


def _check_zone(spec: CloudSpec, zone: str, field: str) -> None:
    """``zone`` is a zone of its region (the spec's region for its own zone; a listed zone's own)."""
    from kit.policy.offers import region_of

    region = spec.region if zone == spec.zone else region_of(zone)
    zones = spec.cloud_facts.zones_of(region)
    if zones is not None and zone not in zones:
        raise SpecProblem(field, f"zone {shown(zone)} is not in region {shown(region)}", f"use one of {', '.join(zones)}")
    if zones is None and (not zone.startswith(region) or zone == region or not REGION_RE.fullmatch(region)):
        raise SpecProblem(field, f"zone {shown(zone)} is not in region {shown(region)}",
                          f"use a zone of {region}, e.g. {region}-a" if REGION_RE.fullmatch(region)
                          else "use a region such as us-east-1 or us-central1, and a zone of it")


def _check_shapes(spec: CloudSpec) -> None:
    """Each listed shape names an instance type the catalog knows (or says its GPUs), on markets the
    cloud sells it on."""
    for i, shape in enumerate(spec.shapes or []):
        where = f"shapes[{i}]"
        name = shape.instance_type or spec.instance_type  # a shape without a type: the spec's own
        itype = spec.cloud_facts.instance(name)
        if itype is None and shape.gpus_per_node is None:
            raise SpecProblem(f"{where}.gpus_per_node", f"instance type {shown(name)} is not in kit's catalog",
                              "set gpus_per_node yourself, or use a catalog type (kit/clouds/<cloud>.py)")
        if itype is not None and shape.gpus_per_node is not None and shape.gpus_per_node != itype.gpus:
            raise SpecProblem(f"{where}.gpus_per_node", f"{itype.name} has {itype.gpus} GPU(s), not {shape.gpus_per_node}",
                              f"remove gpus_per_node or set it to {itype.gpus}")
        if itype is not None and not itype.on_demand and "on-demand" in (shape.markets or ()):
            raise SpecProblem(f"{where}.markets", f"{itype.name} cannot run on-demand ({itype.note})",
                              "list only spot for it, and add a shape of a type sold on-demand as the fallback")


def _check_instance_type(spec: CloudSpec) -> None:
    itype = spec.instance
    if itype is None and spec.gpus_per_node is None:
        raise SpecProblem("gpus_per_node", f"instance type {shown(spec.instance_type)} is not in kit's catalog",
                          "set gpus_per_node (and prices) yourself, or use a catalog type (kit/clouds/<cloud>.py)")
    if itype is not None and spec.gpus_per_node is not None and spec.gpus_per_node != itype.gpus:
        raise SpecProblem("gpus_per_node", f"{spec.instance_type} has {itype.gpus} GPU(s), not {spec.gpus_per_node}",
                          f"remove gpus_per_node or set it to {itype.gpus}")
    if itype is not None and not itype.on_demand:
        if spec.market == "on-demand":
            raise SpecProblem("market", f"{spec.instance_type} cannot run on-demand ({itype.note})",
                              "set market: spot, or use an instance type sold on-demand")
        if policy_may_use_on_demand(spec) and not any("on-demand" in s.markets for s in spec.shape_list()):
            raise SpecProblem("policy", f"policy {shown(spec.policy.name)}"
                              f"{' with a deadline' if spec.policy.deadline_hours is not None else ''} may move the "
                              f"job to on-demand, but {spec.instance_type} has no on-demand ({itype.note})",
                              "use policy.name: spot (or default/greedy/up) without deadline_hours, "
                              "or add a shape of a type sold on-demand (shapes:)")
    if spec.placement == "cluster" and itype is not None and not itype.placement:
        raise SpecProblem("placement", f"{spec.instance_type} does not support cluster/compact placement",
                          "set placement: none, or use a type that supports it (AWS g5/p4d/p5, GCP a2/a3/g2)")


def _check_disk_type(spec: CloudSpec) -> None:
    """The data-disk type exists on the cloud, and every shape's machine type can attach it (catalog): a
    move or a shape switch renders the offer's own disks root with this type (kit.render). Left out, each
    shape gets its own family's default (``disk_type`` of the offer's spec), which it always attaches."""
    known = spec.cloud_facts.disk_types
    chosen = spec.disk.type
    if chosen and chosen not in known:
        raise SpecProblem("disk.type", f"unknown {spec.cloud} disk type {shown(chosen)}",
                          f"use one of {', '.join(known)}")
    if not chosen:
        return
    catalog = [spec.cloud_facts.instance(s.instance_type) for s in spec.shape_list()]
    attachable = [t.disk_types for t in catalog if t is not None and t.disk_types]
    common = [d for d in known if all(d in types for types in attachable)]
    for i, itype in enumerate(catalog):
        if itype is None or not itype.disk_types or chosen in itype.disk_types:
            continue
        where = f"shapes[{i}] ({itype.name})" if spec.shapes else spec.instance_type
        every = f"use one that every shape attaches ({', '.join(common)}), or " if common else ""
        raise SpecProblem("disk.type", f"{where} cannot attach a {chosen} disk (it takes {', '.join(itype.disk_types)})",
                          f"{every}leave disk.type out (each shape then gets its own default type)")


def _check_ssh(spec: CloudSpec) -> None:
    ssh = spec.ssh
    if not ssh.allowed_cidrs:
        raise SpecProblem("ssh.allowed_cidrs", "no CIDR allowed to reach SSH",
                          "list the networks that may SSH in, e.g. allowed_cidrs: [203.0.113.7/32]")
    for i, cidr in enumerate(ssh.allowed_cidrs):
        net = ipaddress.ip_network(cidr)
        if net.prefixlen < WORLD_PREFIX and not ssh.allow_world:
            raise SpecProblem(f"ssh.allowed_cidrs[{i}]",
                              f"SSH open to {net.num_addresses:,} addresses ({cidr}) is refused as world-open",
                              "list your own networks (/8 or narrower), or set ssh.allow_world: true if you really mean it")
    if not USER_RE.fullmatch(ssh.user):
        raise SpecProblem("ssh.user", f"invalid user name {shown(ssh.user)}", "use e.g. ubuntu")
    if not (ssh.public_key.startswith("~") or Path(ssh.public_key).is_absolute()):
        raise SpecProblem("ssh.public_key", f"relative key path {shown(ssh.public_key)}",
                          "use an absolute path or one under ~, e.g. ~/.ssh/id_ed25519.pub")
    if not ssh.public_key.endswith(".pub") or "\n" in ssh.public_key:
        raise SpecProblem("ssh.public_key", f"{shown(ssh.public_key)} does not look like a public key file",
                          "point it at the .pub half of your key pair (kit finds the private half beside it)")


def policy_may_use_on_demand(spec: SpecBase) -> bool:
    """Whether the spec's policy can ever answer on-demand: with a deadline every policy keeps the
    safety net; without one, only ``on-demand`` and ``threshold`` (its cooldown) leave spot."""
    return spec.policy.deadline_hours is not None or spec.policy.name in ("on-demand", "threshold")


def spec_warnings(spec: SpecBase) -> list[str]:
    """What a valid spec still risks, for the commands that act on it to print."""
    out = []
    if isinstance(spec, CloudSpec) and spec.backend is not None and spec.backend.type == "local":
        out.append("the Terraform state stays in deploy/<name>/ on this machine (backend: local): if it is lost, "
                   "kit no longer knows the cluster's instances and data disks, and `kit destroy` cannot delete "
                   "them; use an s3/gcs backend for anything that matters")
    if spec.existing_network is not None:
        out.append(f"network {shown(spec.existing_network)} is not the cluster's own: its other firewall rules reach the "
                   "nodes too (the default network's default-allow-ssh admits SSH from 0.0.0.0/0); `kit plan` "
                   "lists the ones wider than ssh.allowed_cidrs; leave network out for a network whose only SSH "
                   "rule is ssh.allowed_cidrs")
    return out


# ------------------------------------------------------------------------------------------------
# Loading: pydantic's errors become one InputError naming the field and the fix (kit.validation).


@cache
def _adapter() -> TypeAdapter:
    from kit import clouds

    models = tuple(clouds.get(name).spec_model for name in clouds.NAMES)
    union: Any = Annotated[Union[models], Field(discriminator="cloud")]  # noqa: UP007 - a runtime tuple
    return TypeAdapter(union)


def _from_validation_error(error: ValidationError, path: str, cloud: Any) -> InputError:
    errors = error.errors(include_url=False)
    first = errors[0]
    kind = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if loc and loc[0] == cloud:  # the discriminated union puts the tag first
        loc = loc[1:]
    problem = (first.get("ctx") or {}).get("error")
    if isinstance(problem, SpecProblem):  # a rule of a type (field ""): the field pydantic found the value in
        field = problem.field or _field_path(loc)
        return InputError(problem.what + more_problems(errors), where=f"{path}: {field}", fix=problem.fix)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        from kit import clouds

        return InputError(f"unknown cloud {shown(cloud)}" if cloud is not None else "cloud is missing",
                          where=f"{path}: cloud", fix=f"use one of the allowed values: {', '.join(clouds.NAMES)}")
    what, fix = describe(first, loc, doc="docs/infrastructure.md", unknown_hint="; it may be another cloud's field")
    if kind == "extra_forbidden" and isinstance(cloud, str):
        what += f" for cloud {cloud}"
    return InputError(what + more_problems(errors), where=f"{path}: {field_of(loc)}", fix=fix)


def _field_path(loc: tuple[Any, ...]) -> str:
    """A location as SpecProblem's fields say it: ``shapes[0].instance_type``, ``local.zone``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f"{'.' if i else ''}{_at('', part)[1:]}"
                   for i, part in enumerate(loc))


def parse_spec(data: Any, path: str = "cluster.yaml") -> SpecBase:
    require_mapping(data, path, what="spec", fix="start from `kit example aws-g5-spot`")
    try:
        spec = _adapter().validate_python(data, context={"path": path})
    except ValidationError as error:
        raise _from_validation_error(error, path, data.get("cloud")) from None
    spec._source = path
    return spec


def spec_path(info: ValidationInfo) -> str:
    """The spec file being validated (relative paths in it are relative to its directory)."""
    return str((info.context or {}).get("path") or "cluster.yaml")


def load_spec(path: str | Path) -> SpecBase:
    from kit.yamlfile import read_yaml

    data = read_yaml(path, what="spec file", fix="fix the YAML syntax (indentation, colons, quotes)")
    return parse_spec(data, str(path))


def check_ssh_key(spec: SpecBase) -> str:
    """Before a render, plan or apply (not in ``kit validate``: a spec is often checked where the
    key is not): the public key must exist and be an OpenSSH public key; returns its one line."""
    if not isinstance(spec, CloudSpec):
        return ""
    from kit.yamlfile import read_regular_file

    max_bytes = 64 << 10  # a .pub file is one line: even a 16384-bit RSA key is under 3 KB
    data = read_regular_file(Path(spec.ssh.public_key).expanduser(), what=f"ssh public key {spec.ssh.public_key}",
                             limit=max_bytes, where="ssh.public_key",
                             fix="create a key pair with `ssh-keygen -t ed25519` or point ssh.public_key at yours")
    text = data.decode("utf-8", errors="replace").strip()  # other bytes are no key: refused just below
    if not re.match(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+) [A-Za-z0-9+/=]+", text):
        raise InputError(f"{spec.ssh.public_key} is not an OpenSSH public key", where="ssh.public_key",
                         fix="use the .pub file ssh-keygen wrote (one line starting with ssh-ed25519, ssh-rsa, ...)")
    return text.splitlines()[0].strip()


def training_args(spec: SpecBase) -> list[str]:
    """``training.train`` flags for the spec's training section (boolean flags only when true)."""
    flags = to_flags(spec.training.model_dump())
    return flags + (["--ckpt-bucket", spec.bucket_url] if spec.bucket_url else [])

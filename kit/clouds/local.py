"""The local "cloud": node processes on this machine, preemptions replayed from a capacity trace."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, ValidationInfo, model_validator

from kit.clouds.base import Cloud
from kit.errors import InputError
from kit.policy.offers import MAX_HOURS
from kit.spec import (
    Finite,
    PricesSection,
    SpecBase,
    SpecProblem,
    Text,
    ZoneName,
    ZonePrices,
    _Model,
    spec_path,
)
from kit.validation import shown

if TYPE_CHECKING:
    from kit.traces import Trace

DEFAULT_PRICES = (1.0, 4.0)  # spot, on-demand $/h per node when the trace says none
# the spec's prices and the trace metadata's keys that give them
TRACE_PRICES = {"spot_per_hour": "spot_price_per_hour", "on_demand_per_hour": "on_demand_price_per_hour"}
# Trace seconds per wall second, at most: a day of trace in 0.09 s, past anything a replay can follow (a
# trace's tick is 10 min: 1e6 is 1,700 ticks a second). The virtual clock multiplies wall seconds by it, and
# at 1e308 it reached inf (a NaN tick index in the preemption injector).
MAX_TIME_SCALE = 1e6
MAX_SECONDS = MAX_HOURS * 3600  # the injector's timings: --preempt-every, local.grace_seconds


class LocalSection(_Model):
    trace: Text | None = None  # one zone's file; with ``zones``: a trace set (a directory of <zone>.json)
    zone: ZoneName | None = None   # the zone the job runs in (default: the first of zones); a move sets it
    time_scale: Annotated[Finite, Field(gt=0, le=MAX_TIME_SCALE)] = 3600.0
    preempt_every_seconds: Annotated[Finite, Field(gt=0, le=MAX_SECONDS)] | None = None
    grace_seconds: Annotated[Finite, Field(ge=0, le=MAX_SECONDS)] = 5.0
    preemptions: StrictBool = True


class LocalSpec(SpecBase):
    cloud: Literal["local"]
    gpus_per_node: StrictInt = Field(1, ge=1)  # processes per node
    local: LocalSection = Field(default_factory=LocalSection)

    @property
    def start_zone(self) -> str:
        return self.local.zone or (self.zones[0] if self.zones else "local")

    def trace_of(self, zone: str) -> str | None:
        """The capacity trace zone ``zone`` replays (each zone of a set its own file)."""
        if self.local.trace and self.zones:
            return str(Path(self.local.trace) / f"{zone}.json")
        return self.local.trace

    def node_price(self, shape, market: str, zone: str | None = None) -> float | None:
        """The spec's prices are for a node of its own shape: a node with more processes costs more."""
        price = super().node_price(shape, market, zone)
        return None if price is None else price * shape.gpus_per_node / self.gpus_per_node

    def _offer_update(self, offer) -> dict:
        return {"local": self.local.model_copy(update={"zone": offer.zone})}

    def with_run_options(self, **options: Any) -> LocalSpec:
        """``kit train --time-scale/--preempt-every/--no-preemptions`` over the spec's local section."""
        time_scale, preempt_every = options.pop("time_scale", None), options.pop("preempt_every", None)
        no_preemptions = options.pop("no_preemptions", False)
        super().with_run_options(**options)  # refuses any other option
        update: dict = {}
        for flag, name, value, most in (("--time-scale", "time_scale", time_scale, MAX_TIME_SCALE),
                                        ("--preempt-every", "preempt_every_seconds", preempt_every, MAX_SECONDS)):
            if value is not None:
                if not (math.isfinite(value) and 0 < value <= most):
                    raise InputError(f"{flag} {value} must be a finite number > 0 and at most {most:g}", where=flag,
                                     fix=f"e.g. {flag} 20")
                update[name] = float(value)
        if no_preemptions:
            update["preemptions"] = False
        return self.model_copy(update={"local": self.local.model_copy(update=update)}) if update else self

    @model_validator(mode="after")
    def _trace_and_prices(self, info: ValidationInfo) -> LocalSpec:
        """``local.trace`` as an absolute path (a file from the current directory or the spec's, or
        a trace bundled with kit), refused here when missing or invalid, or when it never has room for
        any spot shape; prices from its metadata."""
        from kit.traces import PATH_FIX, check_gang, load_trace, resolve
        from kit.yamlfile import DIRECTORY, REGULAR_FILE, file_kind

        trace = None
        if self.zones and self.local.zone is not None and self.local.zone not in self.zones:
            raise SpecProblem("local.zone", f"zone {shown(self.local.zone)} is not one of zones {shown(self.zones)}",
                              "leave local.zone out (the job starts in the first of zones)")
        if self.local.trace and self.zones:
            trace = self._trace_set(spec_path(info))
        elif self.local.trace:
            path = spec_path(info)
            found = resolve(self.local.trace, relative_to=Path(path).parent, where=f"{path}: local.trace")
            kind = file_kind(found, where=f"{path}: local.trace", fix=PATH_FIX)
            if kind == DIRECTORY:
                raise SpecProblem("local.trace", f"{shown(self.local.trace)} is a directory; local mode replays one zone's "
                                  "file", f"name one file of the set, e.g. {self.local.trace.rstrip('/')}/<zone>.json")
            if kind not in (REGULAR_FILE, None):  # a FIFO would block the read, a device never end it
                raise SpecProblem("local.trace", f"{shown(self.local.trace)} is {kind}, not a trace file", PATH_FIX)
            trace = load_trace(found)  # a bad file is refused with its own where/fix
            self.local = self.local.model_copy(update={"trace": str(found)})
        if trace is not None:  # a trace with no room for any spot shape would replay nothing but on-demand
            gangs = [shape.nodes for shape in self.shape_list() if "spot" in shape.markets]
            if gangs:
                check_gang([trace], min(gangs), where=f"{spec_path(info)}: local.trace")
        meta = trace.metadata if trace is not None else {}
        self.prices = self.prices.model_copy(update={
            "spot_per_hour": self.prices.spot_per_hour or float(meta.get(TRACE_PRICES["spot_per_hour"]) or DEFAULT_PRICES[0]),
            "on_demand_per_hour": self.prices.on_demand_per_hour
            or float(meta.get(TRACE_PRICES["on_demand_per_hour"]) or DEFAULT_PRICES[1]),
            "zones": self._zone_prices(given=self.prices) if self.local.trace and self.zones else self.prices.zones})
        return self

    def _zone_prices(self, given: PricesSection) -> dict[str, ZonePrices]:
        """Each zone of a trace set at its own file's prices (the set's zones are priced apart, as the clouds
        price regions and zones), except where the spec says a price: its zone's or region's entry, or the
        top-level price for every zone."""
        from kit.traces import load_trace

        out = dict(given.zones)
        for zone in self.zones or []:
            meta, said = load_trace(Path(self.local.trace or "") / f"{zone}.json").metadata, given.of(zone)
            fill = {key: float(meta[found]) for key, found in TRACE_PRICES.items()
                    if meta.get(found) and getattr(said, key) is None}
            if fill:
                out[zone] = (out.get(zone) or ZonePrices()).model_copy(update=fill)
        return out

    def _trace_set(self, path: str) -> Trace:
        """``local.trace`` as a set's directory holding every listed zone's file; the first one (its prices)."""
        from kit.traces import PATH_FIX, load_trace, resolve
        from kit.yamlfile import file_kind

        found = resolve(self.local.trace or "", relative_to=Path(path).parent, where=f"{path}: local.trace")
        if not found.is_dir():
            raise SpecProblem("local.trace", f"{shown(self.local.trace)} is one file, but zones replay a set (one file "
                              "per zone)", "name the set's directory, e.g. gcp-a3-h100-2025-10")
        missing = [z for z in self.zones or []
                   if file_kind(found / f"{z}.json", where=f"{path}: zones", fix=PATH_FIX) is None]
        if missing:
            have = sorted(p.stem for p in found.glob("*.json"))
            raise SpecProblem("zones", f"no trace for zone(s) {missing} in {found}", f"use zones of the set: {', '.join(have)}")
        self.local = self.local.model_copy(update={"trace": str(found)})
        return load_trace(found / f"{(self.zones or [''])[0]}.json")


class Local(Cloud[LocalSpec]):
    name = "local"
    bucket_schemes = ("file", "s3")  # a directory here, or S3 (moto in the tests)
    spec_model = LocalSpec
    renders_terraform = False
    nodes_outlive_kit = False  # its nodes are kit's child processes: they stop, or die, with it

    def disk_price(self, spec: LocalSpec) -> float | None:
        return 0.0  # a directory on this machine

    def agent_url(self, advertise_url, server_url, listening_on_all) -> str | None:
        return None  # the local agents relay notices to their trainers only (docs/local.md)

    def listen_default(self, advertise_url) -> str:
        return "127.0.0.1:0"

    def event_source(self, spec: LocalSpec, deploy_dir: Path):
        from kit.watch.sources.local import LocalSource

        return LocalSource(cluster=spec.name, state_dir=LocalSource.state_dir_for(deploy_dir))

    def backend(self, spec: LocalSpec, deploy_dir: Path, *, watcher_url=None, watcher_token=None):
        from kit.backends.local import LocalBackend

        return LocalBackend(spec, deploy_dir, watcher_url=watcher_url, watcher_token=watcher_token)


CLOUD = Local()

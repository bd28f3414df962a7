"""Spot capacity traces (kit/data/spot-traces/README.md): load, validate, per-tick prices, and the
sample sets bundled with kit.

Format: ``{"metadata": {"gap_seconds": 600, ...}, "data": [16, 13, 0, ...], "prices": [...]?}``.
``data[i]`` is how many spot instances could be had in tick ``i``; a gang of N nodes has spot in
tick i iff ``data[i] >= N``. ``metadata`` may hold only ``gap_seconds``; prices then come from the
caller's defaults (``kit simulate --spot-price/--on-demand-price``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import InputError
from kit.paths import SPOT_TRACES_DIR
from kit.yamlfile import file_kind, read_regular_file, value_error_text

FIX = "see kit/data/spot-traces/README.md for the trace format"
PATH_FIX = "pass a trace .json file or a directory of them"
# A trace is read whole: the bundled files are at most ~180 KB, and a year of 1-minute ticks with prices
# is ~7 MB, so a bigger file is the wrong file (read only this far: it may be endless)
MAX_TRACE_BYTES = 16 << 20


@dataclass(frozen=True)
class Trace:
    path: Path
    gap_seconds: float
    data: tuple[int, ...]
    metadata: dict = field(default_factory=dict)
    prices: tuple[float, ...] | None = None  # spot $/h per tick, when the trace has them

    @property
    def name(self) -> str:
        return str(self.metadata.get("zone") or self.path.stem)

    @property
    def tick_h(self) -> float:
        return self.gap_seconds / 3600.0

    def __len__(self) -> int:
        return len(self.data)

    @property
    def measured_nodes(self) -> int | None:
        """How many instances each tick asked for (``metadata.nodes_requested``): no count exceeds it."""
        value = self.metadata.get("nodes_requested")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def spot_available(self, nodes: int) -> list[bool]:
        return [x >= nodes for x in self.data]

    def spot_prices(self, default: float) -> list[float]:
        """Spot $/h per tick: the trace's ``prices``, else metadata's flat price, else ``default``."""
        if self.prices is not None:
            return list(self.prices)
        flat = self.metadata.get("spot_price_per_hour")
        return [float(flat if flat is not None else default)] * len(self.data)

    def on_demand_price(self, default: float) -> float:
        value = self.metadata.get("on_demand_price_per_hour")
        return float(value if value is not None else default)


def check_gang(traces: list[Trace], nodes: int, where: str = "--nodes") -> None:
    """Refuse a gang larger than a trace measured: its counts never exceed ``nodes_requested``, so such a
    gang would never find spot there and every policy would silently run on-demand (e.g. the single-instance
    AWS set with ``kit simulate``'s default of 16 nodes)."""
    short = [t for t in traces if t.measured_nodes is not None and t.measured_nodes < nodes]
    if short:
        most = max(t.measured_nodes or 0 for t in short)
        names = ", ".join(t.name for t in short[:3]) + (f" and {len(short) - 3} more" if len(short) > 3 else "")
        raise InputError(f"a gang of {nodes} nodes, but {names} measured spot capacity for at most {most} "
                         f"instance(s) (metadata.nodes_requested), so it would never find spot there",
                         where=where, fix=f"give a gang of at most {most} node(s), or traces measured for {nodes} or more instances")


def _number(value, where: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"expected a number, got {value!r}", where=where, fix=FIX)
    if positive and value <= 0:
        raise InputError(f"must be > 0, got {value!r}", where=where, fix=FIX)
    if value < 0:
        raise InputError(f"must be >= 0, got {value!r}", where=where, fix=FIX)
    return float(value)


def load_trace(path: str | Path) -> Trace:
    """A trace file, checked: every problem is an InputError naming the file and the field."""
    path = Path(path)
    raw = _read_object(path)
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict):
        raise InputError("missing 'metadata' object", where=str(path), fix=FIX)
    if "gap_seconds" not in metadata:
        raise InputError("missing metadata.gap_seconds", where=f"{path}: metadata.gap_seconds", fix=FIX)
    gap = _number(metadata["gap_seconds"], f"{path}: metadata.gap_seconds", positive=True)
    for key in ("spot_price_per_hour", "on_demand_price_per_hour"):
        if metadata.get(key) is not None:
            _number(metadata[key], f"{path}: metadata.{key}", positive=True)
    _check_optional(metadata, path)
    counts = _counts(raw.get("data"), path)
    return Trace(path=path, gap_seconds=gap, data=counts, metadata=dict(metadata),
                 prices=_prices(raw.get("prices"), path, len(counts)))


# The optional metadata kit reads besides gap_seconds and the prices: names, and whole counts >= 1.
NAME_FIELDS = ("zone", "instance_type")
COUNT_FIELDS = ("nodes_requested", "gpus_per_instance")


def _check_optional(metadata: dict, path: Path) -> None:
    """The optional fields kit uses, when present: a zone and an instance type are non-empty strings (they
    name offers), ``nodes_requested`` and ``gpus_per_instance`` whole numbers >= 1 (they size gangs and
    prices). Other keys are the collector's notes (``source``, ``convention``, ...) and are kept as they are."""
    for key in NAME_FIELDS:
        value = metadata.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InputError(f"expected a non-empty string, got {value!r}", where=f"{path}: metadata.{key}", fix=FIX)
    for key in COUNT_FIELDS:
        value = metadata.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError(f"expected a whole number >= 1, got {value!r}", where=f"{path}: metadata.{key}", fix=FIX)


def _read_object(path: Path) -> dict:
    data = read_regular_file(path, what="trace file", limit=MAX_TRACE_BYTES, fix=PATH_FIX)
    try:
        # JSON exchanged between systems is UTF-8: https://www.rfc-editor.org/rfc/rfc8259#section-8.1
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise InputError(f"trace file is not UTF-8 text (byte {error.start})", where=str(path), fix=FIX) from None
    except json.JSONDecodeError as error:
        raise InputError(f"not valid JSON ({error.msg} at line {error.lineno})", where=str(path), fix=FIX) from None
    except RecursionError:
        raise InputError("trace file is nested too deeply to read", where=str(path), fix=FIX) from None
    except ValueError as error:  # a value Python refuses, e.g. an integer over its 4300 digits:
        # https://docs.python.org/3/library/stdtypes.html#int-max-str-digits
        raise InputError(f"not a valid trace value: {value_error_text(error)}", where=str(path), fix=FIX) from None
    if not isinstance(raw, dict):
        raise InputError("a trace must be a JSON object with 'metadata' and 'data'", where=str(path), fix=FIX)
    return raw


def _counts(data: Any, path: Path) -> tuple[int, ...]:
    if not isinstance(data, list) or not data:
        raise InputError("'data' must be a non-empty list of spot instance counts", where=f"{path}: data", fix=FIX)
    for i, value in enumerate(data):
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value < 0 or value != int(value)):
            raise InputError(f"expected a count >= 0, got {value!r}", where=f"{path}: data[{i}]", fix=FIX)
    return tuple(int(value) for value in data)


def _prices(prices: Any, path: Path, n: int) -> tuple[float, ...] | None:
    if prices is None:
        return None
    if not isinstance(prices, list) or len(prices) != n:
        raise InputError(f"'prices' must be a list as long as 'data' ({n})", where=f"{path}: prices", fix=FIX)
    return tuple(_number(p, f"{path}: prices[{i}]", positive=True) for i, p in enumerate(prices))


def bundled_sets() -> list[Path]:
    """The replayable trace sets bundled with kit: directories of trace files under
    ``kit/data/spot-traces`` (source data in other formats, e.g. the raw SkyNomad launch counts, is
    kept beside them for attribution and is not a set)."""
    return sorted(d for d in SPOT_TRACES_DIR.iterdir() if d.is_dir() and _is_trace_set(d))


def _is_trace_set(directory: Path) -> bool:
    try:
        first = next(iter(sorted(directory.glob("*.json"))))
        return "data" in json.loads(first.read_text())
    except (StopIteration, OSError, ValueError):
        return False


def resolve(ref: str | Path, *, relative_to: Path | None = None, where: str = "trace") -> Path:
    """A trace file or set as the user named it: a path (absolute, from the current directory, or
    from ``relative_to``, e.g. the spec's directory), else the name of a bundled one
    (``gcp-a3-h100-2025-10`` or ``gcp-a3-h100-2025-10/us-central1-c.json``)."""
    path = Path(ref).expanduser()
    candidates = [path] if path.is_absolute() else [path, *([relative_to / path] if relative_to else []),
                                                     SPOT_TRACES_DIR / path]
    for candidate in candidates:
        if file_kind(candidate, where=where, fix=PATH_FIX) is not None:
            return candidate.absolute()
    names = ", ".join(d.name for d in bundled_sets())
    raise InputError(f"trace {str(ref)!r} not found", where=where,
                     fix=f"give a trace file or directory, or a bundled set ({names}; `kit traces` lists them), "
                         "e.g. gcp-a3-h100-2025-10/us-central1-c.json")


@dataclass(frozen=True)
class SetSummary:
    """What ``kit traces`` shows of one set: the facts a user picks a set and flags by."""

    name: str
    path: Path
    zones: tuple[str, ...]
    ticks: int
    gap_seconds: float
    start_utc: str | None
    end_utc: str | None
    instance_type: str | None
    nodes_requested: int | None
    spot_per_hour: tuple[float, float]
    on_demand_per_hour: tuple[float, float] | None

    @property
    def span_hours(self) -> float:
        return self.ticks * self.gap_seconds / 3600.0

    def as_json(self) -> dict:
        return {"name": self.name, "path": str(self.path), "zones": list(self.zones), "ticks": self.ticks,
                "gap_seconds": self.gap_seconds, "span_hours": round(self.span_hours, 3),
                "start_utc": self.start_utc, "end_utc": self.end_utc, "instance_type": self.instance_type,
                "nodes_requested": self.nodes_requested, "spot_per_hour": list(self.spot_per_hour),
                "on_demand_per_hour": list(self.on_demand_per_hour) if self.on_demand_per_hour else None}


def summarize_set(directory: Path) -> SetSummary:
    """Zones, ticks, span and price ranges of a trace set (every file loaded and validated)."""
    from datetime import datetime, timedelta

    traces = load_traces([directory])
    first = traces[0]
    ticks = max(len(tr) for tr in traces)
    start = end = None
    try:  # the span runs from the first tick's start to the last tick's end
        begin = datetime.fromisoformat(str(first.metadata["start_utc"]).replace("Z", "+00:00"))
        start = begin.strftime("%Y-%m-%dT%H:%MZ")
        end = (begin + timedelta(seconds=ticks * first.gap_seconds)).strftime("%Y-%m-%dT%H:%MZ")
    except (KeyError, ValueError):
        pass
    spot = [p for tr in traces for p in tr.spot_prices(math.nan) if math.isfinite(p)]
    on_demand = [tr.on_demand_price(math.nan) for tr in traces]
    on_demand = [p for p in on_demand if math.isfinite(p)]
    return SetSummary(name=directory.name, path=directory, zones=tuple(tr.name for tr in traces), ticks=ticks,
                      gap_seconds=first.gap_seconds, start_utc=start, end_utc=end,
                      instance_type=first.metadata.get("instance_type"),
                      nodes_requested=first.measured_nodes,
                      spot_per_hour=(min(spot), max(spot)) if spot else (math.nan, math.nan),
                      on_demand_per_hour=(min(on_demand), max(on_demand)) if on_demand else None)


def trace_files(paths) -> list[Path]:
    """Expand files and directories (``*.json`` inside, sorted) into trace files; a name that is no
    path is looked up among the bundled sets (:func:`resolve`)."""
    files: list[Path] = []
    for item in paths:
        p = resolve(item, where=str(item))
        if p.is_dir():
            found = sorted(x for x in p.glob("*.json") if x.is_file())
            if not found:
                raise InputError("no *.json trace files in directory", where=str(p), fix=FIX)
            files.extend(found)
        else:
            files.append(p)
    if not files:
        raise InputError("no trace given", fix="pass at least one trace file or directory")
    return files


def load_traces(paths) -> list[Trace]:
    return [load_trace(f) for f in trace_files(paths)]


def markov_rates(p_up: float, mean_up_ticks: float) -> tuple[float, float]:
    """The chain of :func:`markov_availability`: (P(down next tick | up), P(up next tick | down)), each at most 1.
    A ``p_up`` that asks for more than 1 comes back every next tick (its true share is then below ``p_up``)."""
    leave_up = 1 / mean_up_ticks
    return min(1.0, leave_up), min(1.0, leave_up * p_up / (1 - p_up))


def markov_availability(seed: int, n: int, p_up: float, mean_up_ticks: float, nodes: int) -> list[int]:
    """A synthetic on/off spot market for tests and benchmarks: ``n`` ticks of capacity, ``nodes``
    while up and fewer (uniform) while down; up-runs are geometric with mean ``mean_up_ticks`` and
    the long-run share of up ticks is ``p_up`` (:func:`markov_rates`)."""
    import random

    rng = random.Random(seed)
    leave_up, leave_down = markov_rates(p_up, mean_up_ticks)
    up, data = rng.random() < p_up, []
    for _ in range(n):
        data.append(nodes if up else rng.randrange(nodes))
        up = (rng.random() >= leave_up) if up else (rng.random() < leave_down)
    return data

"""Event types the watcher reacts to, and the parsing of agent reports (training/agent.py posts them).

Every source (cloud poller, local backend, node agent) turns what it saw into an ``Event``.
``dedup_key`` lets the ledger record the same fact once even when a poller sees it on every
poll (a terminated instance stays listed for about an hour on AWS) or when two sources report
it (the agent's notice and the cloud's preemption operation).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

# Event kinds. PREEMPTION and INSTANCE_LOST both mean "a node of the running cluster is gone";
# PREEMPTION is used only when the cloud (or the agent's notice) says it was a spot reclaim.
PREEMPTION = "preemption"
# A cloud API's advance warning (AWS spot request ``marked-for-termination``/``marked-for-stop``):
# the instance still runs; the loss is confirmed later by its state. Agent notices are recorded
# as PREEMPTION with source ``agent`` and, like this, never count as a loss.
NOTICE = "notice"
REBALANCE = "rebalance"  # AWS rebalance recommendation: elevated risk, no action forced
INSTANCE_LOST = "instance-lost"  # gone or stopped for another or unknown reason
CAPACITY_ERROR = "capacity-error"  # a launch found no capacity (spot or on-demand)
PROGRESS = "progress"  # trainer heartbeat relayed by the agent
NODE_UP = "node-up"  # a node of the cluster reached running
SHUTDOWN = "shutdown"  # the agent saw a normal (non-preemption) shutdown

KINDS = (PREEMPTION, NOTICE, REBALANCE, INSTANCE_LOST, CAPACITY_ERROR, PROGRESS, NODE_UP, SHUTDOWN)
# Kinds that mean the running cluster lost a node and must be recovered.
LOSS_KINDS = (PREEMPTION, INSTANCE_LOST)

# Agent wire kinds -> event kinds.
AGENT_KINDS = {
    "preemption-notice": PREEMPTION,
    "rebalance-recommendation": REBALANCE,
    "shutdown": SHUTDOWN,
    "progress": PROGRESS,
}
CLOUDS = ("aws", "gcp", "local")
MAX_DETAIL_BYTES = 16_384


@dataclass(frozen=True)
class Event:
    kind: str
    instance: str  # cloud instance id (AWS i-..., GCP instance name, local node name)
    time: float  # unix seconds when it happened (the source's clock)
    source: str  # "aws" | "gcp" | "local" | "agent" | "watcher"
    node_rank: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    total_steps: int | None = None
    step_time_s: float | None = None
    dedup_key: str | None = None  # None: never deduplicated (heartbeats)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}; expected one of {', '.join(KINDS)}")


class BadReport(ValueError):
    """An agent report that does not follow the agent's message format (answered with HTTP 400)."""


def _optional(body: dict, key: str, types: tuple[type, ...], *, minimum: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int in Python; a step of `true` is a bug in the sender, not a number.
    if isinstance(value, bool) or not isinstance(value, types):
        raise BadReport(f"field {key!r} must be {'/'.join(t.__name__ for t in types)} or null, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadReport(f"field {key!r} must be finite, got {value!r}")
    if minimum is not None and value < minimum:
        raise BadReport(f"field {key!r} must be >= {minimum}, got {value!r}")
    return value


def event_from_agent(body: Any) -> Event:
    """Validate one agent POST body and turn it into an Event. Raises BadReport."""
    if not isinstance(body, dict):
        raise BadReport("body must be a JSON object")
    kind = body.get("kind")
    if kind not in AGENT_KINDS:
        raise BadReport(f"field 'kind' must be one of {', '.join(AGENT_KINDS)}, got {kind!r}")
    instance = body.get("instance")
    if not isinstance(instance, str) or not instance.strip():
        raise BadReport("field 'instance' must be a non-empty string")
    rank = _optional(body, "node_rank", (int,), minimum=0)
    if rank is None:
        raise BadReport("field 'node_rank' is required (int >= 0)")
    when = _optional(body, "time", (int, float), minimum=0)
    if when is None:
        raise BadReport("field 'time' is required (unix seconds)")
    cloud = body.get("cloud")
    if cloud not in CLOUDS:
        raise BadReport(f"field 'cloud' must be one of {', '.join(CLOUDS)}, got {cloud!r}")
    detail = body.get("detail") or {}
    if not isinstance(detail, dict):
        raise BadReport("field 'detail' must be an object")
    if len(json.dumps(detail)) > MAX_DETAIL_BYTES:
        raise BadReport(f"field 'detail' is larger than {MAX_DETAIL_BYTES} bytes")
    step = _optional(body, "step", (int,), minimum=0)
    total = _optional(body, "total_steps", (int,), minimum=1)
    step_time = _optional(body, "step_time_s", (int, float), minimum=0)
    event_kind = AGENT_KINDS[kind]
    if event_kind == PROGRESS and (step is None) != (total is None):
        raise BadReport("a 'progress' report needs both 'step' and 'total_steps' (or neither, before training starts)")
    # A notice is one fact per instance and kind, however often the agent retries the POST.
    dedup = None if event_kind == PROGRESS else f"agent:{instance}:{event_kind}:{int(when)}"
    return Event(
        kind=event_kind, instance=instance.strip(), time=float(when), source="agent", node_rank=rank,
        detail={**detail, "cloud": cloud}, step=step, total_steps=total,
        step_time_s=None if step_time is None else float(step_time), dedup_key=dedup,
    )


def now() -> float:
    return time.time()

"""Event types the watcher reacts to, and the parsing of agent reports (training/agent.py posts them).

Every source (cloud poller, local backend, node agent) turns what it saw into an ``Event``.
``dedup_key`` lets the ledger record the same fact once even when a poller sees it on every
poll (a terminated instance stays listed for about an hour on AWS) or when two sources report
it (the agent's notice and the cloud's preemption operation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from training.contract import PREEMPTION_NOTICE

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
DISKS_RELEASED = "disks-released"  # the watcher deleted the disks of a zone and shape the job had left

KINDS = (PREEMPTION, NOTICE, REBALANCE, INSTANCE_LOST, CAPACITY_ERROR, PROGRESS, NODE_UP, SHUTDOWN, DISKS_RELEASED)
# Kinds that mean the running cluster lost a node and must be recovered.
LOSS_KINDS = (PREEMPTION, INSTANCE_LOST)
# A loss event's detail key: kit stopped the node itself (local nodes cannot outlive kit: stopped when it
# is interrupted, killed with it when it dies). Recovered like any loss, but not news about the market.
BY_KIT = "by_kit"
STOPPED_BY_KIT = "stopped-by-kit"  # how such a node's incarnation ended (the ledger's nodes.lost_kind)

# Agent wire kinds -> event kinds.
AGENT_KINDS = {
    PREEMPTION_NOTICE: PREEMPTION,
    "rebalance-recommendation": REBALANCE,
    "shutdown": SHUTDOWN,
    "progress": PROGRESS,
}


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
    written: float | None = None  # progress only: unix seconds when the trainer wrote it (its node's clock)
    dedup_key: str | None = None  # None: never deduplicated (heartbeats)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}; expected one of {', '.join(KINDS)}")


class BadReport(ValueError):
    """An agent report that does not follow the agent's message format (answered with HTTP 400)."""


def event_from_agent(body: Any) -> Event:
    """Validate one agent POST body (training.messages.AgentReport) and turn it into an Event.
    Raises BadReport naming the field."""
    from pydantic import ValidationError

    from kit.validation import describe, field_of
    from training.messages import AgentReport

    if not isinstance(body, dict):
        raise BadReport("body must be a JSON object")
    try:
        report = AgentReport.model_validate(body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        loc = tuple(first.get("loc", ()))
        what, _ = describe(first, loc, doc="training/messages.py")
        raise BadReport(f"field {field_of(loc, top='body')!r}: {what}") from None
    event_kind = AGENT_KINDS[report.kind]
    # A notice is one fact per instance and kind, however often the agent retries the POST.
    dedup = None if event_kind == PROGRESS else f"agent:{report.instance}:{event_kind}:{int(report.time)}"
    return Event(
        kind=event_kind, instance=report.instance, time=float(report.time), source="agent", node_rank=report.node_rank,
        detail={**report.detail, "cloud": report.cloud}, step=report.step, total_steps=report.total_steps,
        step_time_s=None if report.step_time_s is None else float(report.step_time_s), dedup_key=dedup,
        written=None if report.progress_time is None else float(report.progress_time),
    )


def now() -> float:
    return time.time()

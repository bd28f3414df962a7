"""The one interface every event source implements.

A source lists the cluster's instances as the cloud sees them (``InstanceStatus``, normalised
across clouds) and reports events it can only see on the cloud side (AWS spot request status
codes, GCP ``compute.instances.preempted`` operations). The watcher, not the source, decides
which instances matter: only nodes of the *current* deployment count as lost; instances the
watcher replaced itself are ignored (see ``loss_events``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kit.watch.events import BY_KIT, INSTANCE_LOST, PREEMPTION, Event

# Normalised instance states.
RUNNING = "running"
PENDING = "pending"  # being created or started
STOPPING = "stopping"
STOPPED = "stopped"
TERMINATED = "terminated"  # gone or going for good
GONE_STATES = (STOPPING, STOPPED, TERMINATED)
LOST_STATES = (STOPPED, TERMINATED)  # gone for good: a node still STOPPING is lost once it has stopped (loss_events)


@dataclass(frozen=True)
class InstanceStatus:
    instance: str  # the id the ledger's ``nodes`` table uses (AWS instance id, GCP name, local name)
    state: str  # one of the normalised states above
    market: str | None = None  # "spot" | "on-demand" | None when the cloud does not say
    preempted: bool = False  # the cloud says a spot reclaim caused the state
    reason: str | None = None  # the cloud's reason code/message, verbatim
    time: float | None = None  # when the state changed, if the cloud says
    by_kit: bool = False  # kit stopped it itself (the local nodes, which cannot outlive kit), not the cloud


@dataclass
class Poll:
    instances: list[InstanceStatus] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


class EventSource(ABC):
    """Polls one cloud for one cluster. ``poll`` must not raise on a transient API error:
    it raises ``SourceError`` and the watcher logs it and polls again next tick."""

    name: str = "?"

    @abstractmethod
    def poll(self) -> Poll: ...


class SourceError(Exception):
    """A transient failure to reach the cloud API (the watcher retries next tick)."""


def places(value: str | Sequence[str]) -> tuple[str, ...]:
    """The zones or regions a source reads: one, or several in order without repeats."""
    return (value,) if isinstance(value, str) else tuple(dict.fromkeys(value))


def loss_events(poll: Poll, current: Mapping[str, int | None], source: str, now: float,
                since: dict[str, float] | None = None) -> list[Event]:
    """Events for nodes of the current deployment (``instance -> rank``) that are gone.

    A node still stopping is not lost yet (below). A node missing from the listing counts as lost too:
    GCP deletes preempted instances whose termination action is DELETE, and AWS stops listing
    terminated instances after about an hour.
    ``since`` (``instance -> when this incarnation came up``) keys the event to the incarnation:
    an instance id can come back (a GCP spot VM stopped by a preemption and restarted by the next
    apply), and its next loss is a new fact.
    """
    seen = {status.instance: status for status in poll.instances}
    events = []
    for instance, rank in current.items():
        status = seen.get(instance)
        if status is not None and status.state not in LOST_STATES:
            # running, or still stopping (a preempted GCE VM for about 30 s, an EC2 stop): its loss is reported once
            # it has stopped, so that the apply it leads to does not ask the cloud to start a VM that is still
            # stopping (EC2's StartInstances refuses one, IncorrectInstanceState; the node's agent has reported
            # the notice already, and its trainer saved on it)
            continue
        reason: str | None
        if status is None:
            kind, state, reason, when = INSTANCE_LOST, "missing", "not listed by the cloud", now
        else:
            kind = PREEMPTION if status.preempted else INSTANCE_LOST
            state, reason, when = status.state, status.reason, status.time or now
            if since and instance in since and when < since[instance]:
                when = now  # a time from before this incarnation (an earlier stop's): not its loss's; seen now
        events.append(Event(
            kind=kind, instance=instance, time=when, source=source, node_rank=rank,
            detail={"state": state, "reason": reason, **({BY_KIT: True} if status and status.by_kit else {})},
            dedup_key=loss_key(instance, since.get(instance) if since else None),
        ))
    return events


def loss_key(instance: str, since: float | None) -> str:
    """The dedup key of a loss: one per incarnation (``since``: when it came up), however often the poller
    sees it gone, and whoever reports it first (the poll, or the actor for the nodes its failed apply ended)."""
    return f"loss:{instance}" + (f"@{since!r}" if since is not None else "")

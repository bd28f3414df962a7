"""The disks of zones and shapes a job left: kept for a while, because the job may come back, then deleted.

A job that moves (docs/zones.md) starts on the new zone's disks and restores from the bucket; the
disks it left keep the checkpoints it had there. They are kept ``disk.keep_left_hours`` (24 by default;
null: until the job ends) after the last node on them ended, and then deleted, one set (a disks root on
the clouds, a zone's directory locally) at a time, when both hold:

* no node uses the set, and it is not the set of the zone and shape the job runs on;
* it holds nothing newer than what exists elsewhere: some node reported a complete checkpoint
  (``checkpoint_step`` in its progress) after the set was left that is at least as new as the highest
  step any trainer had written by then. Until such a report arrives the set is kept, however long.
  Elsewhere means a node that did not run on the set, because "after the set was left" is not enough: a
  cloud dates a preemption when it begins (GCP's preempted operation; the node's ``until``), and the
  node then saves and reports within its notice (30 s on GCP,
  cloud.google.com/compute/docs/instances/spot#preemption-process), so the set's own last checkpoint is
  reported *after* the set was left. An agent's report names its node; one the watcher pulled itself
  names none, and counts only if a node of another set was up when it was written (the ledger counts
  nodes up from the end of the apply that made them, which replaced the running ones first; after a
  preemption that apply comes after the notice: it takes minutes, the notice 30 s). The copy must also be
  at least as new as the set's own newest report (that stop save).

Each release is recorded (``disks-released``, naming the disks and why); ``kit status`` and the cost report
stop charging those disks from then on, and the plot stops showing them idle (:func:`lifetime`, one account
for all three). A failed release is logged and tried again on a later tick. When the
job ends and ``kit train`` deletes every disk with its instances, that is recorded the same way
(:meth:`DiskKeeper.record_deleted_with_the_job`).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from kit.errors import KitError
from kit.watch.events import DISKS_RELEASED, Event

if TYPE_CHECKING:
    from kit.backends.base import Backend
    from kit.spec import SpecBase
    from kit.watch.ledger import Ledger, NodeRow

log = logging.getLogger("kit.watch")

# why a disk set was deleted (the ``why`` of its ``disks-released`` event; ``kit status`` shows it)
LEFT = "zone left"
JOB_ENDED = "job ended"

Span = tuple[float, float]  # (start, end) on the ledger's clock


def zone_key(zone: str | None) -> str:
    """A node's or a release's zone, "?" for none (a deployment adopted from ``kit apply`` may name none)."""
    return zone or "?"


@dataclass(frozen=True)
class DiskSet:
    name: str                 # Backend.disk_set's name for it
    zone: str
    shapes: tuple[str, ...]
    disk_ids: tuple[str, ...]
    in_use: bool              # a node on it is up, or the job runs on its zone and shape
    left_at: float            # when the last node on it ended (the ledger's clock)
    instances: tuple[str, ...] = ()  # the instance ids of the nodes that ran on it


class DiskKeeper:
    def __init__(self, backend: Backend, ledger: Ledger, spec: SpecBase, *, clock: Callable[[], float]):
        self.backend, self.ledger, self.spec, self.clock = backend, ledger, spec, clock

    def sets(self) -> list[DiskSet]:
        """Every disk set the job's nodes used and that was not released since its last use."""
        running = self.backend.disk_set(self.backend.spec.start_zone, self.backend.spec.own_shape.name)
        released = self.released()
        groups: dict[str, list] = {}
        for node in self.ledger.all_nodes():
            name = self.backend.disk_set(node.zone, node.shape)
            if name is not None:
                groups.setdefault(name, []).append(node)
        out = []
        for name, nodes in groups.items():
            in_use = name == running or any(n.state == "up" for n in nodes)
            left_at = max(n.until if n.until is not None else n.since for n in nodes)
            if released.get(name, float("-inf")) >= left_at:
                continue
            out.append(DiskSet(name, nodes[0].zone or "", tuple(sorted({n.shape or "" for n in nodes})),
                               tuple(sorted({n.disk_id for n in nodes if n.disk_id})), in_use, left_at,
                               tuple(sorted({n.instance_id for n in nodes}))))
        return out

    def released(self) -> dict[str, float]:
        """When each disk set was last released (the ledger's ``disks-released`` events)."""
        return {e["instance"]: e["time"] for e in self.ledger.events(kinds=(DISKS_RELEASED,))}

    def newer_elsewhere(self, left: DiskSet) -> bool:
        """A checkpoint complete elsewhere (module docstring), reported after the set was left, at least as
        new as any step reached by then (the set cannot hold a newer one)."""
        wall = self.backend.wall_time
        # and at least as new as the set's own newest report: its stop save may come after it was left
        reached = max(self.ledger.step_written_by(wall(left.left_at)), self.ledger.newest_checkpoint_of(left.instances))
        if reached < 0:
            return False
        nodes = self.ledger.all_nodes()
        known = {n.instance_id for n in nodes}
        others = [(wall(n.since), math.inf if n.until is None else wall(n.until))
                  for n in nodes if n.instance_id not in left.instances]

        def elsewhere(instance: str, written: float) -> bool:
            if instance in known:  # an agent's report names its node
                return instance not in left.instances
            return any(since <= written <= until for since, until in others)

        return any(step >= reached and elsewhere(instance, written)
                   for instance, written, step in self.ledger.checkpoint_reports_after(wall(left.left_at)))

    def due(self, now: float) -> list[DiskSet]:
        keep_h = self.spec.disk.keep_left_hours
        if keep_h is None:
            return []
        return [s for s in self.sets() if not s.in_use and now - s.left_at >= keep_h * 3600.0]

    def tick(self) -> list[DiskSet]:
        """Release every set that is due and safe to delete; returns those released."""
        now, done = self.clock(), []
        for disk_set in self.due(now):
            if not self.newer_elsewhere(disk_set):
                log.info("keeping %s: no newer checkpoint reported elsewhere yet", disk_set.name)
                continue
            try:
                self.backend.release_disks(disk_set.name)
            except KitError as error:
                log.warning("could not delete the disks of %s (%s); trying again later", disk_set.name, error)
                continue
            self.ledger.record(Event(kind=DISKS_RELEASED, instance=disk_set.name, time=now, source="watcher",
                                     detail={"zone": disk_set.zone, "shapes": list(disk_set.shapes),
                                             "disks": list(disk_set.disk_ids), "why": LEFT},
                                     dedup_key=f"{DISKS_RELEASED}:{disk_set.name}:{disk_set.left_at}"))
            log.warning("deleted the disks of %s (left %.1f h ago): %s", disk_set.name,
                        (now - disk_set.left_at) / 3600.0, ", ".join(disk_set.disk_ids) or "no ids recorded")
            done.append(disk_set)
        return done

    def record_deleted_with_the_job(self, now: float) -> None:
        """The job ended and ``Backend.destroy`` deleted every data disk with the instances: record them, zone by
        zone, as released ``now``, so ``kit status`` stops charging them there and says they are gone."""
        zones: dict[str | None, list[str]] = {}
        for row in self.ledger.disks():
            zones.setdefault(row["zone"], []).append(row["disk_id"])  # zone None: a node that named none
        for zone, disk_ids in zones.items():
            name = self.backend.disk_set(zone, None) or zone or self.spec.name
            self.ledger.record(Event(kind=DISKS_RELEASED, instance=name, time=now, source="watcher",
                                     detail={"zone": zone, "disks": sorted(disk_ids), "why": JOB_ENDED},
                                     dedup_key=f"{DISKS_RELEASED}:{JOB_ENDED}:{zone}:{now}"))


class Release(NamedTuple):
    """One ``disks-released`` event: when, the zone (:func:`zone_key`), the disks deleted there, and why."""

    time: float
    zone: str
    disks: frozenset[str]
    why: str


def releases(ledger: Ledger) -> list[Release]:
    """Every deletion of disks the ledger recorded, in the order recorded."""
    return [Release(e["time"], zone_key(e["detail"].get("zone")), frozenset(e["detail"].get("disks", [])),
                    e["detail"].get("why", LEFT)) for e in ledger.events(kinds=(DISKS_RELEASED,))]


@dataclass(frozen=True)
class Lifetime:
    """When disks existed (from the use that made them to their deletion, or now) and when, of that, they
    sat idle (no node on them); ``deleted``: the deletion after their last use, None while they exist."""

    existed: tuple[Span, ...]
    idle: tuple[Span, ...]
    deleted: Release | None

    @property
    def hours(self) -> float:
        return sum(end - start for start, end in self.existed) / 3600.0

    @property
    def idle_hours(self) -> float:
        return sum(end - start for start, end in self.idle) / 3600.0


def lifetime_of(nodes: list[NodeRow], deletions: list[Release], zone: str | None, disks: set[str],
                now: float) -> Lifetime:
    """The :func:`lifetime` of ``disks`` in ``zone``: busy while any of ``nodes`` (the ledger's) runs on one
    of them, deleted by a release naming one of them there."""
    key = zone_key(zone)
    used = [(n.since, now if n.until is None else n.until) for n in nodes
            if zone_key(n.zone) == key and n.disk_id in disks]
    return lifetime(used, [r for r in deletions if r.zone == key and r.disks & disks], now)


def lifetime(used: list[Span], deleted: list[Release], now: float) -> Lifetime:
    """From the nodes' ``used`` (since, until) and the ``deleted`` events, until ``now``: the time outside the
    uses is idle up to the first deletion in it; from there the disks did not exist until the next use made
    them again (the same ids, where the cloud names disks), and that time was neither idle nor billed."""
    if not used:
        return Lifetime((), (), None)
    existed: list[Span] = []
    idle: list[Span] = []
    uses = sorted(used)
    start, busy = uses[0]  # when the disks were (last) made; the end of the uses so far
    gone: Release | None = None
    for since, until in uses[1:] + [(now, now)]:  # ``now`` ends the last gap
        gone = None
        if since > busy:
            gone = min((r for r in deleted if busy <= r.time <= since), key=lambda r: r.time, default=None)
            end = since if gone is None else gone.time
            if end > busy:
                idle.append((busy, end))
            if gone is not None:
                existed.append((start, end))
                start = since
        busy = max(busy, until)
    if gone is None:  # they exist now
        existed.append((start, busy))
    return Lifetime(tuple(existed), tuple(idle), gone)

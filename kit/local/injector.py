"""Spot preemptions for the local backend, the way the clouds deliver them.

Two modes: replay a capacity trace (``kit/data/spot-traces``; with zones, one file of a set per zone,
all on the same clock, and the running zone's decides) time-compressed by
``time_scale`` trace seconds per wall second — while ``data[i] < nodes`` spot capacity is low:
running spot nodes beyond the capacity are preempted (highest rank first, so a trace with 0 hits
node 0 too) and spot launches raise ``CapacityError`` — or preempt one spot node every
``preempt_every`` wall seconds (ranks in turn, node 0 first).

A preemption first writes the metadata-like notice ``<node_dir>/metadata/preempted`` = ``TRUE``
(the node agent sees it and writes the trainer's stop file; without an agent the injector writes
the stop file itself), then after ``grace_seconds`` kills the node's processes and marks its
state file ``preempted``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from kit.errors import InputError
from training.contract import SPOT

log = logging.getLogger("kit.local")


class LocalNodes(Protocol):
    """What the injector needs of the local backend (kit.backends.local.LocalBackend): the nodes'
    state and the files a cloud would use to tell them (notice, stop file, progress)."""

    use_agent: bool  # False: no node agent relays notices; the injector writes the stop file itself

    def read_state(self, rank: int) -> dict | None: ...

    def notice_file(self, rank: int) -> Path: ...

    def stop_file(self, rank: int) -> Path: ...

    def relayed(self, rank: int, instance: str) -> bool: ...

    def progress_file(self, rank: int) -> Path: ...

    def mark(self, rank: int, state: str, reason: str | None = None, *, instance_id: str | None = None,
             market: str | None = None) -> bool: ...


class Injector:
    def __init__(self, backend: LocalNodes, *, nodes: int, clock: Callable[[], float], origin: float,
                 trace: str | None = None, preempt_every: float | None = None, grace_seconds: float = 5.0,
                 enabled: bool = True, wall: Callable[[], float] = time.time, period: float = 0.1,
                 zones: dict[str, str | None] | None = None, zone: str = "local"):
        self.backend = backend
        self.nodes = nodes  # the running shape's nodes and zone (the backend updates both on every apply)
        self.zone = zone
        self.clock = clock
        self.origin = origin
        self.preempt_every = preempt_every
        self.grace = float(grace_seconds)
        self.enabled = enabled
        self.wall = wall
        self.period = period
        # one capacity trace per zone (each zone of a set replays its own file at the same clock)
        self.traces: dict = {}
        if enabled and preempt_every is None:
            from kit.traces import load_trace, resolve

            for name, path in (zones or {zone: trace}).items():
                if path:
                    self.traces[name] = load_trace(resolve(path, where="local.trace"))
        if preempt_every is not None and preempt_every <= 0:
            raise InputError(f"--preempt-every {preempt_every} must be > 0", where="--preempt-every",
                             fix="e.g. --preempt-every 20")
        # rank -> (wall time of the kill, the instance the notice was for)
        self.pending: dict[int, tuple[float, str]] = {}
        # rank -> (when to write the stop file if the agent has not, the instance)
        self.relay_by: dict[int, tuple[float, str]] = {}
        self.relay_timeout = 1.5
        self.next_rank = 0
        self.last_every: float | None = None
        self.preemptions: list[dict] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ capacity
    def capacity(self, now: float | None = None, zone: str | None = None) -> int | None:
        trace = self.traces.get(self.zone if zone is None else zone)
        if trace is None:
            return None
        now = self.clock() if now is None else now
        index = int(max(0.0, now - self.origin) // trace.gap_seconds) % len(trace.data)
        return trace.data[index]

    def spot_available(self, zone: str | None = None, nodes: int | None = None) -> bool:
        """Spot capacity for ``nodes`` (default: the running shape's) in ``zone`` (default: the running one)."""
        capacity = self.capacity(zone=zone)
        return capacity is None or capacity >= (self.nodes if nodes is None else nodes)

    # ------------------------------------------------------------------ preempting
    def running_spot(self) -> list[int]:
        out = []
        for rank in range(self.nodes):
            state = self.backend.read_state(rank)
            if state and state["state"] == "running" and state["market"] == SPOT and rank not in self.pending:
                out.append(rank)
        return out

    def _current(self, rank: int, instance: str) -> bool:
        """Is ``instance`` still the spot instance running at ``rank``?"""
        state = self.backend.read_state(rank) or {}
        return (state.get("instance_id") == instance and state.get("market") == SPOT
                and state.get("state") == "running")

    def notice(self, rank: int) -> None:
        """Deliver the notice to the spot instance now at ``rank``; the kill follows after the
        grace period, for that instance only (the clouds reclaim an instance, not a slot)."""
        state = self.backend.read_state(rank) or {}
        instance = state.get("instance_id")
        if instance is None or state.get("market") != SPOT:
            return
        path = self.backend.notice_file(rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("TRUE")
        if not self.backend.use_agent:  # no agent to relay it: ask the trainer directly
            self.backend.stop_file(rank).write_text("preempted\n")
        else:  # the agent relays it; if it has not within the relay timeout, the injector does
            self.relay_by[rank] = (self.wall() + min(self.relay_timeout, self.grace / 2), instance)
        self.pending[rank] = (self.wall() + self.grace, instance)
        self.preemptions.append({"rank": rank, "instance": instance, "time": self.clock()})
        log.warning("injector: preemption notice to node-%d (%s), kill in %.1f s", rank, instance, self.grace)

    def step(self) -> None:
        """One pass: relay overdue notices, kill instances whose grace is over, preempt more."""
        wall = self.wall()
        self._relay_overdue(wall)
        self._kill_due(wall)
        if not self.enabled:
            return
        capacity = self.capacity()
        if capacity is not None:
            self._preempt_over_capacity(capacity)
        elif self.preempt_every is not None:
            self._preempt_periodically(wall, self.preempt_every)

    def _relay_overdue(self, wall: float) -> None:
        for rank, (relay_by, instance) in list(self.relay_by.items()):
            if rank not in self.pending or self.pending[rank][1] != instance or not self._current(rank, instance):
                del self.relay_by[rank]  # replaced meanwhile: the new instance got no notice
            elif wall >= relay_by:
                del self.relay_by[rank]
                stop = self.backend.stop_file(rank)
                # no stop file, and no record of the notice: the agent did not relay it (a relayed one may be
                # gone already: the trainer saves, stops and removes it within the timeout)
                if not stop.exists() and not self.backend.relayed(rank, instance):
                    log.warning("injector: node-%d's agent did not relay the notice; writing the stop file", rank)
                    stop.write_text("preempted\n")

    def _kill_due(self, wall: float) -> None:
        for rank, (kill_at, instance) in list(self.pending.items()):
            if wall >= kill_at:
                del self.pending[rank]
                if not self.backend.mark(rank, "preempted", "injected preemption", instance_id=instance,
                                         market=SPOT):
                    log.info("injector: node-%d's %s was replaced before its kill; the replacement keeps running",
                             rank, instance)

    def _preempt_over_capacity(self, capacity: int) -> None:
        """The trace: spot instances beyond the zone's capacity now get a notice, highest rank first."""
        running = self.running_spot()  # without the ranks already noticed: their kill is on its way
        excess = len(running) - capacity  # counting those again noticed one more node at every pass
        for rank in sorted(running, reverse=True)[:max(0, excess)]:
            self.notice(rank)

    def _preempt_periodically(self, wall: float, every: float) -> None:
        """--preempt-every: one node, round robin, every ``every`` wall seconds of a full, training gang."""
        if len(self.running_spot()) < self.nodes or not self.training_started():
            self.last_every = None
            return
        if self.last_every is None:
            self.last_every = wall
        elif wall - self.last_every >= every:
            self.notice(self.next_rank % self.nodes)
            self.next_rank += 1
            self.last_every = None

    def training_started(self) -> bool:
        for rank in range(self.nodes):
            if self.backend.progress_file(rank).exists():
                return True
        return False

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except Exception as error:  # noqa: BLE001 - the injector must not die silently mid-run
                log.error("injector: %s", error)
            self.stop.wait(self.period)

    def start(self) -> Injector:
        self.thread = threading.Thread(target=self.run, name="kit-injector", daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

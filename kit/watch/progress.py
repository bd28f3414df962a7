"""Progress read from the nodes themselves (``Backend.progress()``), recorded like a heartbeat.

The agents POST heartbeats only when the nodes can reach the watcher's endpoint; from a laptop
behind NAT they cannot. ``kit watch`` and ``kit train`` therefore also pull the trainer's progress
file (local files, SSH on the clouds) and record it in the ledger, so the deadline-aware policies
and the "done" detection work either way. Duplicates of a heartbeat are harmless (the ledger
keeps the most advanced step).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kit.watch.events import PROGRESS, Event
from training.contract import PROGRESS_DETAIL


class ProgressPuller:
    def __init__(self, backend, ledger, *, source: str, clock: Callable[[], float] = time.time,
                 every_s: float = 15.0, time_scale: float = 1.0):
        self.backend, self.ledger, self.source, self.clock = backend, ledger, source, clock
        self.every_s = every_s
        self.time_scale = time_scale  # the local cloud's compressed clock: step times in trace seconds
        self._last_pull = float("-inf")
        self._last_key: tuple[Any, Any, Any] | None = None

    def pull(self, force: bool = False) -> dict | None:
        """Read and record the newest progress; at most every ``every_s`` wall seconds unless forced.
        Returns the record when a new one was stored."""
        if not force and time.monotonic() - self._last_pull < self.every_s:
            return None
        self._last_pull = time.monotonic()
        data = self.backend.progress()
        if not data or data.get("step") is None or data.get("total_steps") is None:
            return None
        key = (data.get("step"), data.get("state"), data.get("time"))
        if key == self._last_key:
            return None
        self._last_key = key
        step_time, written = data.get("step_time_s"), data.get("time")
        detail = {k: data[k] for k in PROGRESS_DETAIL if data.get(k) is not None}
        self.ledger.record(Event(kind=PROGRESS, instance="trainer", time=self.clock(), source=self.source,
                                 node_rank=0, detail=detail, step=int(data["step"]),
                                 total_steps=int(data["total_steps"]),
                                 step_time_s=None if step_time is None else float(step_time) * self.time_scale,
                                 written=float(written) if isinstance(written, (int, float)) else None))
        return data

"""The clock a job's times are on: the wall clock for the clouds, a compressed one for the local cloud.

The local cloud replays a day of spot capacity in minutes: its nodes, the ledger, the policy and the
cost report run on :class:`VirtualClock`, ``local.time_scale`` trace seconds per wall second. The ledger
keeps it (origin, scale, offset), so a continued run continues it and ``kit status`` reads the job's
times on it while the job runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kit.errors import InputError


class VirtualClock:
    """Trace time: ``origin + (wall - origin) * scale + offset``; costs and the policy run on this clock.

    ``origin`` is the wall moment the job's clock started, trace time zero of the replayed traces.
    ``offset`` keeps the clock continuous where a continued run changed the scale (:meth:`rescaled`)."""

    def __init__(self, origin: float, scale: float, wall: Callable[[], float] | None = None, offset: float = 0.0):
        if not scale > 0:
            raise InputError(f"time scale {scale} must be > 0", where="--time-scale / local.time_scale",
                             fix="e.g. --time-scale 3600 (one trace hour per wall second)")
        self.origin, self.scale, self.wall, self.offset = origin, float(scale), wall or time.time, float(offset)

    def __call__(self) -> float:
        return self.at(self.wall())

    def at(self, wall: float) -> float:
        """The trace time of the wall-clock moment ``wall`` (e.g. a file's mtime)."""
        return self.origin + (wall - self.origin) * self.scale + self.offset

    def wall_at(self, t: float) -> float:
        """The wall-clock moment of trace time ``t`` (:meth:`at` inverted)."""
        return self.origin + (t - self.origin - self.offset) / self.scale

    def rescaled(self, scale: float, wall: float) -> VirtualClock:
        """The clock that runs at ``scale`` from the wall moment ``wall`` on and reads as this one there: a
        continued run with another ``--time-scale`` goes on from where the job's clock stood. Rescaling
        about the origin instead jumped it (a smaller scale set it back before the ledger's newest times)."""
        offset = self.offset + (wall - self.origin) * (self.scale - float(scale))
        return VirtualClock(self.origin, scale, self.wall, offset)

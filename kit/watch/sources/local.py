"""Local backend: node state files written by the local backend .

Contract (the local backend writes, this source reads): one JSON file per node at
``<deploy_dir>/local/nodes/<node name>.json``, rewritten atomically (write + rename)::

    {"name": "node-0", "instance_id": "node-0-3", "rank": 0, "market": "spot",
     "state": "running" | "pending" | "preempted" | "stopped" | "exited" | "terminated",
     "reason": "injected preemption" | null, "time": 1730000000.0}

``instance_id`` must change every time the backend (re)starts the node (like a cloud instance
id), so a second loss of node-0 is a new fact. ``preempted`` is a spot reclaim by the injector;
``stopped`` is kit's own doing (nodes stopped when kit was interrupted, or found orphaned by a kit
that was killed), so it is reported as such (``InstanceStatus.by_kit``).
"""

from __future__ import annotations

import json
from pathlib import Path

from kit.watch.sources.base import (
    PENDING,
    RUNNING,
    STOPPED,
    TERMINATED,
    EventSource,
    InstanceStatus,
    Poll,
    SourceError,
)

STATES = {"running": RUNNING, "pending": PENDING, "preempted": TERMINATED, "stopped": STOPPED,
          "exited": TERMINATED, "terminated": TERMINATED}


class LocalSource(EventSource):
    name = "local"

    def __init__(self, cluster: str, state_dir: Path):
        self.cluster = cluster
        self.state_dir = Path(state_dir)

    @staticmethod
    def state_dir_for(deploy_dir: Path) -> Path:
        return Path(deploy_dir) / "local" / "nodes"

    def poll(self) -> Poll:
        poll = Poll()
        if not self.state_dir.is_dir():
            return poll
        for path in sorted(self.state_dir.glob("*.json")):
            try:
                state = json.loads(path.read_text())
                poll.instances.append(InstanceStatus(
                    instance=str(state["instance_id"]),
                    state=STATES.get(state["state"], TERMINATED),
                    market=state.get("market"),
                    preempted=state["state"] == "preempted",
                    by_kit=state["state"] == "stopped",
                    reason=state.get("reason"),
                    time=state.get("time"),
                ))
            except FileNotFoundError:  # removed between glob and read: the backend is rewriting
                continue
            except (ValueError, KeyError, TypeError) as error:
                # Files are replaced atomically, so a bad one is a backend bug: say which file.
                raise SourceError(f"{path}: not a local node state file ({error})") from error
        return poll

"""Progress file, rewritten atomically by each node's writer rank (training/contract.py's PROGRESS_FILE on a node).

``{"step": int, "total_steps": int, "step_time_s": float|null, "state": "running"|"done"|"preempted",
"time": unix, "params_sha256": str|null, "checkpoint_step": int|null, "checkpoint_bytes": int|null}``

``checkpoint_step`` is the newest complete checkpoint on this node's disk: the watcher releases the disks
of a zone the job left only once a checkpoint at least as new is complete elsewhere. ``checkpoint_bytes``
is its size (its marker's files): what a move to another zone copies, which the watcher's capacity search
charges a move for (kit.watch.acting).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from training.contract import read_json, write_atomic


class ProgressWriter:
    def __init__(self, path: str | None, total_steps: int, enabled: bool = True, min_interval_s: float = 1.0):
        self.path = Path(path) if (path and enabled) else None
        self.total_steps = total_steps
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self.checkpoint_step: int | None = None  # the trainer sets it when a save completes on this node
        self.checkpoint_bytes: int | None = None  # and that checkpoint's size

    def checkpoint(self, step: int, nbytes: int | None) -> None:
        """This node's disk holds a complete checkpoint of ``step`` (``nbytes`` in all; None: not known)."""
        self.checkpoint_step, self.checkpoint_bytes = step, nbytes

    def write(self, step: int, state: str = "running", step_time_s: float | None = None,
              params_sha256: str | None = None, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.time()
        if not force and state == "running" and now - self._last_write < self.min_interval_s:
            return
        self._last_write = now
        doc = {"step": int(step), "total_steps": int(self.total_steps),
               "step_time_s": None if step_time_s is None else float(step_time_s),
               "state": state, "time": now, "params_sha256": params_sha256, "checkpoint_step": self.checkpoint_step,
               "checkpoint_bytes": self.checkpoint_bytes}
        # a final state (done, preempted) must survive the node going down right after
        write_atomic(self.path, json.dumps(doc) + "\n", durable=state != "running")


read_progress = read_json  # the progress file is one of the node's small JSON state files

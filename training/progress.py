"""Progress file, rewritten atomically by rank 0.

``{"step": int, "total_steps": int, "step_time_s": float|null, "state": "running"|"done"|"preempted",
"time": unix, "params_sha256": str|null}``
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


class ProgressWriter:
    def __init__(self, path: str | None, total_steps: int, enabled: bool = True, min_interval_s: float = 1.0):
        self.path = Path(path) if (path and enabled) else None
        self.total_steps = total_steps
        self.min_interval_s = min_interval_s
        self._last_write = 0.0

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
               "state": state, "time": now, "params_sha256": params_sha256}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f)
            f.write("\n")
            if state != "running":
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.path)


def read_progress(path: str | os.PathLike) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None

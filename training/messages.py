"""The node agent's report to the watcher's endpoint: one model, built by ``training/agent.py`` and
validated by kit (``kit/watch/events.py``) before anything is recorded.

``POST /v1/clusters/<name>/events`` with ``Authorization: Bearer <token>`` and this JSON body. The
progress fields repeat the trainer's progress file (training/progress.py) at the time of the report.
"""
from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from training.contract import PREEMPTION_NOTICE

WIRE_KINDS = (PREEMPTION_NOTICE, "rebalance-recommendation", "shutdown", "progress")  # AgentReport.kind's
CLOUDS = ("aws", "gcp", "local")
MAX_DETAIL_BYTES = 16_384
MAX_STEPS = 10**12        # far beyond any job, and well inside SQLite's 64-bit integers
MAX_RANK = 100_000
MAX_TIME = 10**11         # unix seconds (year 5138)


class AgentReport(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["preemption-notice", "rebalance-recommendation", "shutdown", "progress"]
    instance: str = Field(min_length=1, max_length=256)
    node_rank: StrictInt = Field(ge=0, le=MAX_RANK)
    time: float = Field(ge=0, le=MAX_TIME, allow_inf_nan=False)  # unix seconds
    cloud: Literal["aws", "gcp", "local"]
    detail: dict[str, Any] = Field(default_factory=dict)
    step: StrictInt | None = Field(None, ge=0, le=MAX_STEPS)
    total_steps: StrictInt | None = Field(None, ge=1, le=MAX_STEPS)
    step_time_s: float | None = Field(None, ge=0, le=MAX_TIME, allow_inf_nan=False)
    # when the trainer wrote the progress file (its "time"): nodes write theirs at their own moments and
    # the reports arrive in any order, so only this orders the steps of different reporters
    progress_time: float | None = Field(None, ge=0, le=MAX_TIME, allow_inf_nan=False)

    @field_validator("instance")
    @classmethod
    def _named(cls, instance: str) -> str:
        if not instance.strip():
            raise ValueError("instance must be a non-empty string")
        return instance.strip()

    @field_validator("time", "step_time_s", "progress_time", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or (value is not None and not isinstance(value, (int, float))):
            raise ValueError("must be a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be finite")
        if isinstance(value, int) and abs(value) > MAX_TIME:  # a 400-digit integer has no float
            raise ValueError(f"must be at most {MAX_TIME}")
        return value

    @field_validator("detail", mode="before")
    @classmethod
    def _small_object(cls, detail: Any) -> Any:
        if detail is None:
            return {}
        if not isinstance(detail, dict):
            raise ValueError("detail must be an object")  # noqa: TRY004 - pydantic turns ValueError into a validation error
        if len(json.dumps(detail)) > MAX_DETAIL_BYTES:
            raise ValueError(f"detail is larger than {MAX_DETAIL_BYTES} bytes")
        return detail

    @model_validator(mode="after")
    def _progress_pairs(self) -> AgentReport:
        if self.kind == "progress" and (self.step is None) != (self.total_steps is None):
            raise ValueError("a 'progress' report needs both 'step' and 'total_steps' (or neither, before training "
                             "starts)")
        if self.step is not None and self.total_steps is not None and self.step > self.total_steps:
            raise ValueError(f"step {self.step} is past total_steps {self.total_steps}")
        return self

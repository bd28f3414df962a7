"""Stand-ins for what the watcher drives (a backend, the cloud's view of it, a policy), typed
against the real interfaces (kit.backends.base.Backend, kit.watch.sources.base.EventSource,
kit.policy.Policy); the specs and observations the tests use are the real models."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kit.backends.base import Backend, CapacityError, Node, rendezvous_endpoint
from kit.clouds.local import LocalSpec
from kit.policy import Observation, Policy
from kit.spec import CloudSpec, SpecBase, parse_spec
from kit.watch.ledger import Ledger
from kit.watch.session import LEDGER_FILE
from kit.watch.sources.base import RUNNING, STOPPED, TERMINATED, EventSource, InstanceStatus, Poll

PRICES = {"spot_per_hour": 1.0, "on_demand_per_hour": 4.0}


@contextlib.contextmanager
def ledger_of(deploy_dir: Path) -> Iterator[Ledger]:
    """The ledger of a deployment directory (what `kit train` left there), closed after use."""
    ledger = Ledger(deploy_dir / LEDGER_FILE)
    try:
        yield ledger
    finally:
        ledger.close()


def local_spec(*, name: str = "demo", nodes: int = 2, market: str = "spot", policy: dict[str, Any] | None = None,
               prices: dict[str, Any] | None = None, zones: list[str] | None = None) -> LocalSpec:
    """A real local-cloud spec (validated like a cluster.yaml), with the prices the tests' costs use;
    ``zones``: a job that may move between them."""
    spec = parse_spec({"name": name, "cloud": "local", "nodes": nodes, "market": market, "policy": policy or {},
                       "prices": PRICES if prices is None else prices, **({"zones": zones} if zones else {})})
    assert isinstance(spec, LocalSpec)
    return spec


CLOUD_FIELDS = {  # the least a real cloud spec needs, per cloud (the backend: state on this machine)
    "aws": {"region": "us-east-1", "zone": "us-east-1a", "instance_type": "g5.4xlarge"},
    "gcp": {"project": "demo-project", "region": "us-central1", "zone": "us-central1-a",
            "instance_type": "a3-highgpu-8g"},
}


def cloud_spec(cloud: str, *, name: str = "demo", nodes: int = 2, market: str = "spot", **fields: Any) -> CloudSpec:
    """A real AWS or GCP spec, validated like a cluster.yaml (the SSH key is only read when rendering);
    ``fields`` override the cloud's defaults."""
    spec = parse_spec({"name": name, "cloud": cloud, "nodes": nodes, "market": market, "backend": {"type": "local"},
                       "ssh": {"allowed_cidrs": ["203.0.113.0/24"]}, **CLOUD_FIELDS[cloud], **fields})
    assert isinstance(spec, CloudSpec)
    return spec


def with_policy(spec: SpecBase, **policy: Any) -> SpecBase:
    """The spec with its policy section changed (validated again)."""
    return parse_spec({**spec.model_dump(exclude_none=True), "policy": {**spec.policy.model_dump(), **policy}})


class ScriptedPolicy(Policy):
    """Answers from a list (repeating the last), remembering every observation it saw; no safety net."""

    name = "scripted"

    def __init__(self, answers: list[str]) -> None:
        super().__init__()
        self.answers = list(answers)
        self.seen: list[Observation] = []

    def decide(self, obs: Observation) -> str:
        self.seen.append(obs)
        return self.answers[min(len(self.seen) - 1, len(self.answers) - 1)]

    def _decide(self, obs: Observation) -> str:
        return self.decide(obs)


class RecordingBackend(Backend):
    """An in-memory cloud: records every apply/bootstrap/destroy and can lose nodes on demand."""

    cloud = "local"

    def __init__(self, nodes: int = 2):
        self.size = nodes
        self.deployed: list[Node] = []
        self.gone: dict[str, Node] = {}  # preempted instances, still visible to the source
        self.stopped: dict[str, Node] = {}  # instances kit stopped itself (a local run interrupted)
        self.calls: list[tuple] = []
        self.capacity_failures = 0  # how many next applies fail for lack of capacity
        self._serial = 0

    def _new(self, rank: int, market: str) -> Node:
        self._serial += 1
        return Node(name=f"node-{rank}", instance_id=f"i-{self._serial:04d}", rank=rank, market=market,
                    private_ip=f"10.0.0.{self._serial}", disk_id=f"disk-{rank}")

    def apply(self, spec: SpecBase, market: str) -> list[Node]:
        self.calls.append(("apply", market, spec.market))
        if self.capacity_failures:
            self.capacity_failures -= 1
            raise CapacityError(f"InsufficientInstanceCapacity: no {market} capacity")
        by_rank = {n.rank: n for n in self.deployed}
        self.deployed = [by_rank[r] if r in by_rank and by_rank[r].market == market else self._new(r, market)
                         for r in range(self.size)]
        return list(self.deployed)

    def nodes(self) -> list[Node]:
        return list(self.deployed)

    def bootstrap(self, nodes: list[Node]) -> None:
        self.calls.append(("bootstrap", tuple(n.instance_id for n in nodes), rendezvous_endpoint(nodes)))

    def destroy(self, keep_disks: bool = True) -> None:
        self.calls.append(("destroy", keep_disks))
        self.deployed = []

    def preempt(self, rank: int) -> Node:
        node = next(n for n in self.deployed if n.rank == rank)
        self.deployed = [n for n in self.deployed if n.rank != rank]
        self.gone[node.instance_id] = node
        return node

    def stop_by_kit(self, rank: int) -> Node:
        node = next(n for n in self.deployed if n.rank == rank)
        self.deployed = [n for n in self.deployed if n.rank != rank]
        self.stopped[node.instance_id] = node
        return node

    def of(self, kind: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == kind]


class BackendSource(EventSource):
    """The cloud's view of a RecordingBackend: deployed nodes run, preempted ones are terminated."""

    name = "local"

    def __init__(self, backend: RecordingBackend):
        self.backend = backend

    def poll(self) -> Poll:
        poll = Poll([InstanceStatus(n.instance_id, RUNNING, n.market) for n in self.backend.deployed])
        poll.instances += [InstanceStatus(i, TERMINATED, n.market, preempted=True, reason="spot reclaim")
                           for i, n in self.backend.gone.items()]
        poll.instances += [InstanceStatus(i, STOPPED, n.market, reason="kit exited", by_kit=True)
                           for i, n in self.backend.stopped.items()]
        return poll


class FileBackend(RecordingBackend):
    """RecordingBackend whose cloud state lives in a JSON file, so it survives a killed process."""

    def __init__(self, state: Path, nodes: int = 2):
        super().__init__(nodes)
        self.state = Path(state)
        if self.state.exists():
            data = json.loads(self.state.read_text())
            self.deployed = [Node(**n) for n in data["deployed"]]
            self._serial = data["serial"]
            self.calls = [tuple(c) for c in data["calls"]]

    def save(self) -> None:
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"deployed": [n.to_dict() for n in self.deployed], "serial": self._serial,
                                   "calls": [list(c) for c in self.calls]}))
        tmp.replace(self.state)


def heartbeat(step: int, total: int, step_time_s: float = 1.0, state: str = "running", rank: int = 0,
              written: float | None = None, checkpoint_step: int | None = None, checkpoint_bytes=None):
    """A progress report (``written``: when the trainer wrote it; ``checkpoint_step``: the newest complete
    checkpoint on that node's disk, ``checkpoint_bytes`` its size)."""
    from kit.watch.events import PROGRESS, Event

    detail: dict = {"state": state}
    for key, value in (("checkpoint_step", checkpoint_step), ("checkpoint_bytes", checkpoint_bytes)):
        if value is not None:
            detail[key] = value
    return Event(kind=PROGRESS, instance=f"node-{rank}", time=0.0, source="agent", node_rank=rank,
                 detail=detail, step=step, total_steps=total, step_time_s=step_time_s, written=written)

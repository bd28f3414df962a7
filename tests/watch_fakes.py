"""Stand-ins for the parts the watcher consumes but does not own (spec, policy, backend).

They follow kit's spec, Backend and Policy interfaces closely enough for the watcher's tests, without
importing kit.spec / kit.policy (written by other parts in parallel).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from kit.backends.base import Backend, CapacityError, Node, rendezvous_endpoint
from kit.watch.sources.base import RUNNING, TERMINATED, EventSource, InstanceStatus, Poll


@dataclass(frozen=True)
class FakePolicySection:
    name: str = "fake"
    deadline_hours: float | None = None
    changeover_hours: float = 0.2


@dataclass(frozen=True)
class FakePrices:
    spot_per_hour: float | None = 1.0
    on_demand_per_hour: float | None = 4.0


@dataclass(frozen=True)
class FakeSpec:
    name: str = "demo"
    cloud: str = "local"
    nodes: int = 2
    market: str = "spot"
    policy: FakePolicySection = FakePolicySection()
    prices: FakePrices = FakePrices()

    def with_market(self, market: str) -> FakeSpec:
        return dataclasses.replace(self, market=market)

    @property
    def cloud_facts(self):
        from kit import clouds

        return clouds.get(self.cloud)


@dataclass(frozen=True)
class Obs:
    """Field-for-field kit.policy.Observation."""

    now_h: float
    progress_h: float
    job_h: float
    deadline_h: float | None
    changeover_h: float
    market: str | None
    spot_available: bool
    preempted: bool
    tick_h: float
    spot_price: float | None = None
    on_demand_price: float | None = None


class ScriptedPolicy:
    """Answers from a list (repeating the last), remembering every observation it saw."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = list(answers)
        self.seen: list[Obs] = []

    def decide(self, obs: Obs) -> str:
        self.seen.append(obs)
        return self.answers[min(len(self.seen) - 1, len(self.answers) - 1)]


class RecordingBackend(Backend):
    """An in-memory cloud: records every apply/bootstrap/destroy and can lose nodes on demand."""

    cloud = "local"

    def __init__(self, nodes: int = 2):
        self.size = nodes
        self.deployed: list[Node] = []
        self.gone: dict[str, Node] = {}  # preempted instances, still visible to the source
        self.calls: list[tuple] = []
        self.capacity_failures = 0  # how many next applies fail for lack of capacity
        self._serial = 0

    def _new(self, rank: int, market: str) -> Node:
        self._serial += 1
        return Node(name=f"node-{rank}", instance_id=f"i-{self._serial:04d}", rank=rank, market=market,
                    private_ip=f"10.0.0.{self._serial}", disk_id=f"disk-{rank}")

    def apply(self, spec, market: str) -> list[Node]:
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


def heartbeat(step: int, total: int, step_time_s: float = 1.0, state: str = "running", rank: int = 0):
    from kit.watch.events import PROGRESS, Event

    return Event(kind=PROGRESS, instance=f"node-{rank}", time=0.0, source="agent", node_rank=rank,
                 detail={"state": state}, step=step, total_steps=total, step_time_s=step_time_s)

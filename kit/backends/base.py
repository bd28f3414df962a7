"""The backend interface the watcher acts through, shared by aws, gcp and local.

A backend is stateless from the watcher's point of view: ``apply`` makes the deployment match
``spec`` on ``market`` (idempotent, like ``terraform apply``: nodes that still exist are kept,
lost ones recreated, disks always reused), ``nodes`` says what is deployed now, ``bootstrap``
(re)starts training on *every* node with node 0 as the rendezvous master, and ``destroy``
removes instances while keeping the data disks unless told otherwise.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kit.errors import KitError
from training.contract import RENDEZVOUS_PORT

if TYPE_CHECKING:
    from kit.spec import SpecBase


@dataclass(frozen=True)
class Node:
    """One node as Terraform output ``nodes`` describes it , plus its rank."""

    name: str
    instance_id: str
    rank: int
    market: str | None = None
    zone: str | None = None
    private_ip: str | None = None
    public_ip: str | None = None
    disk_id: str | None = None
    shape: str | None = None    # the shape it belongs to (kit.policy.offers.Shape.name); the actor sets it
    price: float | None = None  # $/h of this node on its market; the actor sets it

    @classmethod
    def from_output(cls, item: dict, rank: int) -> Node:
        return cls(name=item["name"], instance_id=str(item["instance_id"]), rank=rank, market=item.get("market"),
                   zone=item.get("zone"), private_ip=item.get("private_ip"), public_ip=item.get("public_ip"),
                   disk_id=item.get("disk_id"))

    @property
    def address(self) -> str | None:
        """Where kit reaches the node over SSH: its public IP, else its private one (as the inventory's
        ``ansible_host``, kit.bootstrap)."""
        return self.public_ip or self.private_ip

    def to_dict(self) -> dict:
        return asdict(self)


class CapacityError(KitError):
    """The cloud had no capacity for the requested instances (spot or on-demand). Retried with
    backoff by the watcher; until the retry the policy sees spot unavailable."""


class Backend(ABC):
    """What the watcher acts through. Besides apply/nodes/bootstrap/destroy, the hooks below let
    ``kit train`` and ``kit watch`` run one loop for every cloud: a backend whose nodes are not real
    instances (the local one) keeps its own clock, starts its preemption injector, restarts crashed
    trainers and lets them save on an interrupt, through these hooks alone."""

    cloud: str = "?"
    spec: SpecBase  # what is deployed (or about to be): zone, shape and market included
    tick_interval_s: float = 15.0   # seconds between watcher ticks unless told otherwise
    progress_every_s: float = 15.0  # seconds between reads of the nodes' progress files

    # ------------------------------------------------------------------ the run's life cycle
    def attach(self, ledger) -> Callable[[], float]:
        """The clock the ledger, the policy and the cost report use for this deployment."""
        return time.time

    @property
    def time_scale(self) -> float:
        """Clock seconds per wall second (1 for real clouds)."""
        return 1.0

    def start(self) -> None:
        """The loop is about to run."""

    def on_tick(self) -> None:
        """Once per watcher tick, after the progress was read."""

    def settle(self) -> None:
        """The trainers reported done: wait until they have written their last files."""

    def interrupted(self, announce: Callable[[str], None]) -> bool:
        """The loop stopped early (Ctrl-C, a failure). Cloud nodes keep running (kit train or kit
        watch again picks them up); ``announce`` tells the user about anything that takes time.
        True when it stopped nodes (the ledger is then told at once)."""
        return False

    def close(self) -> None:
        """The run is over (done or not)."""

    def use(self, spec: SpecBase) -> None:
        """What is deployed now runs ``spec`` (a restarted watcher's last applied zone, shape and market)."""
        self.spec = spec

    @abstractmethod
    def apply(self, spec: SpecBase, market: str) -> list[Node]:
        """Render ``spec`` on ``market`` and converge the deployment; nodes in rank order.
        Raises CapacityError when the cloud has no capacity, KitError on other failures."""

    @abstractmethod
    def nodes(self) -> list[Node]:
        """What is deployed now, in rank order (empty when nothing is)."""

    @abstractmethod
    def bootstrap(self, nodes: list[Node]) -> None:
        """(Re)start training on every node; node 0 is the rendezvous master."""

    @abstractmethod
    def destroy(self, keep_disks: bool = True) -> None:
        """Delete the instances; the data disks survive unless ``keep_disks`` is False."""

    # ------------------------------------------------------------------ disks of zones the job left
    def disk_set(self, zone: str | None, shape: str | None) -> str | None:
        """The name of the data disks that nodes in ``zone`` on ``shape`` (kit.policy.offers.Shape.name)
        use, as :meth:`release_disks` takes it; None when they cannot be deleted apart from the rest (a
        job that never moves has one set, deleted when it ends)."""
        return None

    def release_disks(self, name: str) -> None:
        """Delete the data disks :meth:`disk_set` named (no node uses them any more)."""
        raise KitError(f"the {self.cloud} backend cannot delete disk set {name} on its own", where=name,
                       fix="they are deleted when the job ends")

    def wall_time(self, t: float) -> float:
        """The wall-clock moment of ``t`` on the clock :meth:`attach` returned (the same for real clouds)."""
        return t

    def progress(self) -> dict | None:
        """The trainer's newest progress record (training/progress.py: step, total_steps, state,
        step_time_s, params_sha256 when done, time) read from the nodes, or None when unknown.
        Lets ``kit train`` follow a job whose nodes cannot reach the watcher's endpoint."""
        return None

    @staticmethod
    def newest_progress(records) -> dict | None:
        best = None
        for data in records:
            if isinstance(data, dict) and data.get("step") is not None and (
                    best is None or (data.get("time") or 0) > (best.get("time") or 0)):
                best = data
        return best

    def checkpoint_dir(self, node: Node, scratch: Path) -> Path:
        """A directory on this machine holding ``node``'s newest complete checkpoint, for the final
        export (training.export): the local backend's disk itself, a copy fetched over SSH for the
        clouds. Read-only on the node."""
        raise KitError(f"the {self.cloud} backend cannot fetch checkpoints", where=node.name,
                       fix="copy the checkpoint directory from the node's data disk yourself")


def rendezvous_endpoint(nodes: list[Node], port: int = RENDEZVOUS_PORT) -> str:
    """``host:port`` of node 0, where every node's torchrun meets (changes when node 0 is replaced)."""
    if not nodes:
        raise KitError("no nodes to take a rendezvous endpoint from")
    master = min(nodes, key=lambda n: n.rank)
    host = master.private_ip or master.public_ip or master.name
    return f"{host}:{port}"

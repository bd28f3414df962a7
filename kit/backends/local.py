"""The local backend: N node processes on this machine, same interface as aws/gcp.

A "node" is a process group: ``torchrun --nnodes N --node-rank r`` (c10d rendezvous at node 0's
``127.0.0.1:<free port>``, gloo on CPU or NCCL on CUDA as the trainer picks) plus, when the
kit has it, the node agent (``training.agent --cloud local``). Each node has

* a data-disk directory ``deploy/NAME/local/disks/node-<r>/`` (checkpoints in ``ckpt/``,
  agent events), reused across restarts like the clouds' disks;
* an instance directory ``deploy/NAME/local/run/node-<r>/`` with the metadata-like notice file
  ``metadata/preempted`` (``TRUE`` = preemption notice), the trainer's stop file, progress file
  and logs (recreated with every new instance);
* a state file ``deploy/NAME/local/nodes/node-<r>.json`` (contract in kit/watch/sources/local.py)
  with a new ``instance_id`` on every (re)start.

Processes never outlive kit: each group gets the parent-death signal and is killed at exit.
So a ``kit`` that was killed (SIGKILL, OOM, a reboot) leaves state files that still say
``running`` with nothing running: the restarted kit reconciles them first (:meth:`LocalBackend.
reconcile`, crash-only start): leftover node processes save and stop, and each such node is
recorded as stopped at the last moment it was seen alive, so the watcher relaunches it as after
any loss and its cost stops where its processes did.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from kit.backends.base import Backend, CapacityError, Node
from kit.errors import KitError
from training.contract import (
    PREEMPTION_NOTICE,
    SPOT,
    read_json,
    recorded_reports,
    write_atomic,
    write_json_atomic,
)

if TYPE_CHECKING:
    from kit.clouds.local import LocalSpec
    from kit.local.injector import Injector
    from kit.spec import SpecBase

log = logging.getLogger(__name__)
# What a restarted kit logs for each node whose processes outlived the kit that was killed (it waits up to
# ``save_grace_s`` for them to save and exit), and for those still there at the end of the grace: one format
# each, which the crash-only tests look for. They name the processes, so a wait on one that could not save
# (a trainer whose peer died with the kit waits in a collective) can be told from a save that took long.
LEFTOVERS_LOG = "node-%d: %d processes of a killed kit are still running (%s); they save and stop"
LEFTOVERS_KILLED_LOG = "node-%d: %s did not stop within %.1f s of the stop request: killed"

_LIVE: set[LocalBackend] = set()


def _kill_all_at_exit() -> None:
    for backend in list(_LIVE):
        with contextlib.suppress(Exception):
            backend.kill_all()


atexit.register(_kill_all_at_exit)


_PRCTL: Callable[..., int] | None
try:  # resolved in the parent: the child only calls it (no imports between fork and exec)
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except Exception:  # noqa: BLE001 - not Linux: no parent-death signal, atexit still cleans up
    _PRCTL = None


def _pdeathsig() -> None:  # runs in the child between fork and exec: die with kit (Linux)
    if _PRCTL is not None:
        # SIGTERM: torchrun then stops its workers (they run in sessions of their own)
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stat(proc_dir: Path) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...); None when the
    process exited while we read it. The name is cut at the last ``)``: it may hold spaces."""
    try:
        fields = (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) >= 2 else None


def describe(pids: list[int]) -> str:
    """``pid command`` of each process (the first words of its command line, paths cut to their names), for
    a log line; a process gone meanwhile shows as its pid."""
    out = []
    for pid in pids:
        try:
            args = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            args = []
        words = [Path(a.decode(errors="replace")).name for a in args[:3] if a]
        out.append(" ".join([str(pid), *words]))
    return ", ".join(out)


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        stat = _stat(entry) if entry.name.isdigit() else None
        if stat is not None:
            parents.setdefault(int(stat[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalBackend(Backend):
    cloud = "local"
    tick_interval_s = 0.5   # local minutes pass in wall seconds
    progress_every_s = 0.0  # the progress files are on this machine: read them every tick
    max_restarts = 5        # trainers that keep exiting without finishing: a person has to look

    # how long live trainers get to save at a step boundary when asked through their stop files
    # (a node replaced by a market switch, Ctrl-C, a failed loop) before they are killed; a
    # tiny model saves in about a second
    save_grace_s = 30.0
    # what a node that never reported progress gets after its stop file: it has nothing to save yet
    # (still bootstrapping, importing torch or waiting in the rendezvous, where the stop file is not read)
    startup_grace_s = 2.0

    def __init__(self, spec: LocalSpec, deploy_dir: Path, *, watcher_url: str | None = None, watcher_token: str | None = None,
                 clock: Callable[[], float] = time.time, node_command: Callable[[LocalBackend, int, str],
                                                                                 list[str]] | None = None,
                 spot_available: Callable[[], bool] | None = None, use_agent: bool = True):
        self.spec: SpecBase = spec  # the market changes with every apply; the rest never does
        self.local = spec.local  # time scale, trace, injected preemptions
        # absolute: every path below is handed to node processes, whose working directory is their own
        self.deploy_dir = Path(deploy_dir).absolute()
        self.root = self.deploy_dir / "local"
        self.watcher_url = watcher_url
        self.watcher_token = watcher_token
        self.clock = clock
        self.node_command = node_command or LocalBackend.trainer_command
        self.spot_available = spot_available  # tests: a stand-in for the injector's capacity
        self.injector: Injector | None = None  # replays preemptions from the trace (attach)
        self._crashed_since: float | None = None
        self._restarts = 0
        self.use_agent = use_agent
        self.procs: dict[int, list[subprocess.Popen]] = {}
        self.endpoint: str | None = None
        self.lock = threading.RLock()
        _LIVE.add(self)

    def _spot_capacity(self, spec: SpecBase) -> bool:
        if self.spot_available is not None:
            return self.spot_available()
        return self.injector is None or self.injector.spot_available(zone=spec.start_zone, nodes=spec.nodes)

    # ------------------------------------------------------------------ the run's life cycle
    @property
    def time_scale(self) -> float:
        return float(self.local.time_scale)

    def attach(self, ledger) -> Callable[[], float]:
        """The compressed clock (kept in the ledger, so a continued run continues the clock, at this run's
        scale from now on) and the injector that replays preemptions on it."""
        from kit.clock import VirtualClock
        from kit.local.injector import Injector

        now, kept = time.time(), ledger.clock()
        # a ledger from before the scale was kept: its origin, at this run's scale (as it was read then)
        before = VirtualClock(now, self.time_scale) if kept is None else VirtualClock(
            kept[0], kept[1] or self.time_scale, offset=kept[2])
        # the clock first: reconcile caps each stop time at "now" on it (the wall clock's now is hours
        # before the trace times a compressed clock gives, and would end every leftover before it began)
        self.clock = clock = before.rescaled(self.time_scale, now)
        self.reconcile(before.at)  # the leftovers' last writes, on the clock they were made under
        ledger.keep_clock(clock.origin, clock.scale, clock.offset)
        local = self.local
        spec = cast("LocalSpec", self.spec)
        zones = {zone: spec.trace_of(zone) for zone in spec.zone_list}
        self.injector = Injector(self, nodes=spec.nodes, clock=self.clock, origin=clock.origin,
                                 preempt_every=local.preempt_every_seconds, grace_seconds=local.grace_seconds,
                                 enabled=local.preemptions, zones=zones, zone=spec.start_zone)
        return self.clock

    def reconcile(self, at: Callable[[float], float] = lambda wall: wall) -> list[int]:
        """Make the state files tell the truth before the watcher reads them (crash-only start).

        A state file that says ``running`` while this kit started nothing was left by a kit that
        was killed: its node's processes died with it (parent-death signal) or are dying, saving.
        Leftovers get the stop-file request and ``save_grace_s`` to finish their save, then are
        killed, so no two trainers ever write one checkpoint directory. The node is then recorded
        as stopped at the last moment it showed life (``at`` maps a wall time to the clock's).
        Returns the ranks it stopped."""
        stopped = []
        with self.lock:
            for rank in range(1 << 16):
                state = self.read_state(rank)
                if state is None:
                    break
                leftovers = self.node_processes(rank)
                if leftovers:
                    log.warning(LEFTOVERS_LOG, rank, len(leftovers), describe(leftovers))
                    self._stop_leftovers(rank)
                if state["state"] != "running" or rank in self.procs:
                    continue
                seen = max([float(state["time"])] + [at(t) for t in self._signs_of_life(rank)])
                data = {**state, "state": "stopped", "reason": "kit was killed; the node's processes died with it",
                        "time": min(seen, self.clock())}
                write_json_atomic(self.state_file(rank), data)
                stopped.append(rank)
        if stopped:
            log.warning("nodes %s were left running by a kit that was killed: recorded stopped, relaunching",
                        stopped)
        return stopped

    def node_processes(self, rank: int) -> list[int]:
        """Live processes of node ``rank``, wherever they were reparented: every node process
        (torchrun, its workers, the agent) carries the node's stop-file path as an argument."""
        marker = b"\0" + str(self.stop_file(rank)).encode() + b"\0"
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = b"\0" + (entry / "cmdline").read_bytes()
            except OSError:  # it exited while we looked
                continue
            stat = _stat(entry) if marker in cmdline else None
            if stat is not None and stat[0] != "Z":  # a zombie is dead already
                found.append(int(entry.name))
        return found

    def _stop_leftovers(self, rank: int) -> None:
        """The stop file, ``save_grace_s`` to save and exit (``startup_grace_s`` for a node that never
        reported progress: nothing to save), then SIGKILL for what is left."""
        write_atomic(self.stop_file(rank), "kit restarted after a crash\n")
        grace = self.save_grace_s if self.progress_file(rank).exists() else min(self.save_grace_s, self.startup_grace_s)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.node_processes(rank):
            time.sleep(0.2)
        stuck = self.node_processes(rank)
        if stuck:
            log.warning(LEFTOVERS_KILLED_LOG, rank, describe(stuck), grace)
        for pid in stuck:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _signs_of_life(self, rank: int) -> list[float]:
        """Wall times at which node ``rank``'s processes last wrote something."""
        times = []
        for name in (self.progress_file(rank).name, "train.log", "agent.log"):
            with contextlib.suppress(OSError):
                times.append((self.node_dir(rank) / name).stat().st_mtime)
        return times

    def start(self) -> None:
        if self.injector is not None:
            self.injector.start()

    def on_tick(self) -> None:
        """Every trainer exited without done and without a preemption in flight (e.g. a rendezvous
        timeout): restart training on the same nodes after 5 s, as a node's systemd unit would."""
        if not self._all_crashed():
            self._crashed_since = None
            return
        if self._crashed_since is None:
            self._crashed_since = time.time()
            return
        if time.time() - self._crashed_since <= 5:
            return
        self._crashed_since = None
        self._restarts += 1
        if self._restarts > self.max_restarts:
            raise KitError("the trainers keep exiting without finishing", where=str(self.root / "run"),
                           fix="see train.log of each node")
        log.warning("trainers exited without finishing; restarting them (%d)", self._restarts)
        self.bootstrap(self.nodes())

    def _all_crashed(self) -> bool:
        if not self.procs or (self.injector and self.injector.pending):
            return False
        if any(self.trainer_exit(r) is None for r in self.procs) or (self.progress() or {}).get("state") == "done":
            return False
        return all((self.read_state(r) or {}).get("state") == "running" for r in range(self.spec.nodes))

    def settle(self, timeout_s: float = 60.0) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline and any(self.trainer_exit(r) is None for r in list(self.procs)):
            time.sleep(0.2)

    def interrupted(self, announce) -> bool:
        """The trainers save first (their stop files, as a preemption notice asks), then the nodes stop."""
        if self.injector is not None:
            self.injector.close()
        announce(f"the trainers save and stop (up to {self.save_grace_s:g} s; Ctrl-C again kills them)")
        self.stop_all(grace_s=self.save_grace_s)
        return True

    def close(self) -> None:
        if self.injector is not None:
            self.injector.close()

    # ------------------------------------------------------------------ paths
    def state_dir(self) -> Path:
        return self.root / "nodes"

    def state_file(self, rank: int) -> Path:
        return self.state_dir() / f"node-{rank}.json"

    def disk_dir(self, rank: int, zone: str | None = None) -> Path:
        """Node ``rank``'s data disk in ``zone`` (default: the zone the job runs in). A job with zones
        has disks per zone, as the clouds' zonal disks: a move starts on the new zone's (from the bucket)."""
        if not self.spec.zones:
            return self.root / "disks" / f"node-{rank}"
        return self.root / "disks" / (zone or self.spec.start_zone) / f"node-{rank}"

    def node_dir(self, rank: int) -> Path:
        return self.root / "run" / f"node-{rank}"

    def progress_file(self, rank: int) -> Path:
        return self.node_dir(rank) / "progress.json"

    def stop_file(self, rank: int) -> Path:
        return self.node_dir(rank) / "stop"

    def relayed(self, rank: int, instance: str) -> bool:
        """Whether node ``rank``'s agent relayed a preemption notice to ``instance``: it records the report on the
        node's disk when it writes the stop file, which the trainer removes after its stop save."""
        return any(r.get("kind") == PREEMPTION_NOTICE and r.get("instance") == instance
                   for r in recorded_reports(self.disk_dir(rank)))

    def notice_file(self, rank: int) -> Path:
        return self.node_dir(rank) / "metadata" / "preempted"

    # ------------------------------------------------------------------ state files
    def read_state(self, rank: int) -> dict | None:
        return read_json(self.state_file(rank))

    def write_state(self, rank: int, instance_id: str, market: str, state: str, reason: str | None = None, *,
                    zone: str | None = None, procs: int | None = None) -> dict:
        current = self.read_state(rank) or {}
        data = {"name": f"node-{rank}", "instance_id": instance_id, "rank": rank, "market": market,
                "state": state, "reason": reason, "time": self.clock(),
                "zone": zone or current.get("zone") or self.spec.start_zone,
                "procs": procs or current.get("procs") or int(self.spec.gpus_per_node or 1)}
        write_json_atomic(self.state_file(rank), data)
        return data

    def _kept(self, rank: int, spec: SpecBase, market: str) -> bool:
        """Node ``rank`` is up on ``market`` in the spec's zone with its processes: kept by an apply,
        like terraform keeps a live instance that matches."""
        state = self.read_state(rank)
        return bool(rank < spec.nodes and state and state["state"] == "running" and state["market"] == market
                    and state.get("zone", spec.start_zone) == spec.start_zone
                    and state.get("procs", 1) == int(spec.gpus_per_node or 1))

    def _new_instance_id(self, rank: int) -> str:
        counter = self.root / "instance-counter"
        n = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.parent.mkdir(parents=True, exist_ok=True)
        counter.write_text(str(n))
        return f"node-{rank}-{n}"

    # ------------------------------------------------------------------ Backend
    def apply(self, spec: SpecBase, market: str) -> list[Node]:
        with self.lock:
            if market == SPOT and not self._spot_capacity(spec):
                raise CapacityError(f"no spot capacity for {spec.nodes} local nodes in {spec.start_zone} (the "
                                    "injector's trace is low)", where=str(self.root),
                                    fix="kit tries the next offer, retries with backoff or moves to on-demand")
            self._save_before_replacing(spec, market)
            self.spec = spec
            # preemptions follow the job to its zone and shape, before a new node's state file says it runs
            # there: the injector's thread reads those files without this lock, and a pass in between judged
            # the new nodes against the old zone's capacity (a spot apply found room in the new one above)
            if self.injector is not None:
                self.injector.zone, self.injector.nodes = spec.start_zone, spec.nodes
            for rank in range(spec.nodes, 1 << 16):  # a smaller spec: drop the extra nodes
                if not self.state_file(rank).exists():
                    break
                self.kill_node(rank)
                self.state_file(rank).unlink()
            zone, procs = spec.start_zone, int(spec.gpus_per_node or 1)
            for rank in range(spec.nodes):
                if self._kept(rank, spec, market):
                    continue
                self.kill_node(rank)
                shutil.rmtree(self.node_dir(rank), ignore_errors=True)
                self.disk_dir(rank).mkdir(parents=True, exist_ok=True)
                self.write_state(rank, self._new_instance_id(rank), market, "running", zone=zone, procs=procs)
            return self.nodes()

    def nodes(self) -> list[Node]:
        out = []
        for rank in range(self.spec.nodes):
            state = self.read_state(rank)
            if state is None or state["state"] != "running":
                continue
            zone = state.get("zone") or self.spec.start_zone
            out.append(Node(name=state["name"], instance_id=state["instance_id"], rank=rank, market=state["market"],
                            zone=zone, private_ip="127.0.0.1", disk_id=str(self.disk_dir(rank, zone))))
        return out

    def bootstrap(self, nodes: list[Node]) -> None:
        with self.lock:
            for rank in list(self.procs):
                self.kill_node(rank)
            up = {n.rank for n in self.nodes()}
            if up != set(range(self.spec.nodes)):
                raise KitError(f"cannot bootstrap: nodes {sorted(set(range(self.spec.nodes)) - up)} are not running",
                               where=str(self.state_dir()), fix="kit re-applies and retries")
            self.endpoint = f"127.0.0.1:{free_port()}"  # node 0's endpoint; new with every (re)start
            for rank in range(self.spec.nodes):
                self.start_node(rank)

    def progress(self) -> dict | None:
        """Rank 0 of the job writes it on its node; node 0 may have moved, so take the newest."""
        records = [read_json(self.progress_file(rank)) for rank in range(self.spec.nodes)]
        return self.newest_progress(records)

    def checkpoint_dir(self, node: Node, scratch: Path) -> Path:
        return self.disk_dir(node.rank, node.zone) / "ckpt"  # the "disk" is on this machine already

    def disk_set(self, zone: str | None, shape: str | None) -> str | None:
        """A job with zones has a disks directory per zone (all shapes there share it)."""
        return zone if self.spec.zones and zone else None

    def release_disks(self, name: str) -> None:
        if name == self.spec.start_zone or not self.spec.zones:
            raise KitError(f"the disks of zone {name} are in use", where=str(self.root / "disks"),
                           fix="only disks of zones the job left are released")
        with self.lock:
            shutil.rmtree(self.root / "disks" / name, ignore_errors=True)

    def wall_time(self, t: float) -> float:
        from kit.clock import VirtualClock

        clock = self.clock  # the compressed clock once attached
        return clock.wall_at(t) if isinstance(clock, VirtualClock) else t

    def destroy(self, keep_disks: bool = True) -> None:
        with self.lock:
            self.kill_all()
            shutil.rmtree(self.state_dir(), ignore_errors=True)
            shutil.rmtree(self.root / "run", ignore_errors=True)
            if not keep_disks:
                shutil.rmtree(self.root / "disks", ignore_errors=True)

    # ------------------------------------------------------------------ processes
    def trainer_command(self, rank: int, endpoint: str) -> list[str]:
        from kit.spec import training_args

        args = training_args(self.spec)
        i = args.index("--ckpt-dir")
        args[i + 1] = str(self.disk_dir(rank) / "ckpt")
        if self.spec.bucket_url is None and self.spec.can_move:  # a job that can leave its disks behind
            args += ["--ckpt-bucket", self.spec.job_prefix(f"file://{self.root / 'bucket'}")]
        nproc = 1 if not self.spec.gpus_per_node else int(self.spec.gpus_per_node)
        return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={self.spec.nodes}",
                f"--nproc-per-node={nproc}", f"--node-rank={rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}", f"--rdzv-id={self.spec.name}", "--max-restarts=0",
                "-m", "training.train", *args, "--stop-file", str(self.stop_file(rank)),
                "--progress-file", str(self.progress_file(rank))]

    def agent_command(self, rank: int, instance_id: str) -> list[str]:
        from kit.watch.server import node_token

        cmd = [sys.executable, "-m", "training.agent", "--cloud", "local", "--instance", instance_id,
               "--node-rank", str(rank), "--stop-file", str(self.stop_file(rank)),
               "--progress-file", str(self.progress_file(rank)), "--event-dir", str(self.disk_dir(rank)),
               "--metadata-url", str(self.notice_file(rank)), "--interval", "0.5"]
        if self.watcher_url and self.watcher_token:
            token_file = self.node_dir(rank) / "watcher-token"
            # the node's own token (for the instance it reports as), never the cluster's; a secret: 0600
            write_atomic(token_file, node_token(self.watcher_token, instance_id), mode=0o600)
            cmd += ["--watcher-url", self.watcher_url, "--watcher-token-file", str(token_file),
                    "--cluster", self.spec.name]
        return cmd

    def start_node(self, rank: int) -> None:
        endpoint = self.endpoint
        if endpoint is None:
            raise RuntimeError("start_node before bootstrap chose the rendezvous endpoint")
        state = self.read_state(rank)
        node_dir = self.node_dir(rank)
        (node_dir / "metadata").mkdir(parents=True, exist_ok=True)
        for stale in (self.stop_file(rank), self.notice_file(rank)):
            stale.unlink(missing_ok=True)
        # The node runs the installed `training` package (this Python's), in its own directory: like a
        # cloud node, it depends on nothing in kit's working directory or checkout.
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "KIT_NODE_RANK": str(rank)}
        procs = []
        with open(node_dir / "train.log", "ab") as log:
            procs.append(subprocess.Popen(self.node_command(self, rank, endpoint), cwd=node_dir, env=env,
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, preexec_fn=_pdeathsig))  # noqa: PLW1509
        if self.use_agent and state is not None:
            with open(node_dir / "agent.log", "ab") as log:
                procs.append(subprocess.Popen(self.agent_command(rank, state["instance_id"]), cwd=node_dir,
                                              env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_pdeathsig))  # noqa: PLW1509
        self.procs[rank] = procs

    def trainer_exit(self, rank: int) -> int | None:
        """The node's torchrun exit code (None while it runs or when nothing was started)."""
        procs = self.procs.get(rank)
        return procs[0].poll() if procs else None

    def kill_node(self, rank: int, sig: int = signal.SIGKILL) -> None:
        for proc in self.procs.pop(rank, []):
            tree = [proc.pid, *descendants(proc.pid)]  # torchrun's workers live in their own sessions
            for pid in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)

    def kill_all(self) -> None:
        for rank in list(self.procs):
            self.kill_node(rank)

    def mark(self, rank: int, state: str, reason: str | None = None, *, instance_id: str | None = None,
             market: str | None = None) -> bool:
        """Kill node ``rank`` and record it as ``state`` (``preempted`` by the injector, ``stopped`` at exit).

        With ``instance_id`` (and ``market``) only that instance: a preemption notice is for the
        instance it was sent to, and when the watcher has replaced it meanwhile (a switch to
        on-demand within the grace period) the replacement is left alone. False when nothing
        was done for that reason."""
        with self.lock:
            current = self.read_state(rank)
            if instance_id is not None and (current is None or current["instance_id"] != instance_id
                                            or (market is not None and current["market"] != market)):
                return False
            self.kill_node(rank)
            if current and current["state"] == "running":
                self.write_state(rank, current["instance_id"], current["market"], state, reason)
            return True

    def stop_all(self, reason: str = "kit exited", grace_s: float = 0.0) -> None:
        """Stop every node and mark the running ones stopped (their cost stops accruing).

        With ``grace_s`` the trainers are first asked to stop through their stop files, the way
        a preemption notice asks them: they agree on a step, save synchronously and exit, so
        nothing since the last periodic checkpoint (or a periodic write still in flight) is
        lost. Whatever has not exited after ``grace_s`` (or on a second Ctrl-C) is killed."""
        if grace_s > 0:
            self.request_stop(reason, grace_s)
        for rank in range(self.spec.nodes):
            self.mark(rank, "stopped", reason)
        _LIVE.discard(self)

    def _save_before_replacing(self, spec: SpecBase, market: str) -> None:
        """A cloud instance that terraform replaces (a market switch) shuts down first, and its
        trainer saves on the way (systemd stops the unit, the launcher asks for a stop). Here the
        same: live trainers on nodes about to be replaced are asked to save before they are killed."""
        doomed = [rank for rank in list(self.procs) if not self._kept(rank, spec, market) and self.trainer_exit(rank) is None]
        if doomed:
            self.request_stop(f"instance replaced (market {market})", self.save_grace_s, ranks=doomed)

    def request_stop(self, reason: str, grace_s: float, ranks: list[int] | None = None) -> bool:
        """Write the stop file of every running trainer (or of ``ranks``: their peers follow at the
        same step) and wait up to ``grace_s`` for all running trainers to exit. True when they did."""
        running = [rank for rank in list(self.procs) if self.trainer_exit(rank) is None]
        for rank in running if ranks is None else [r for r in ranks if r in running]:
            write_atomic(self.stop_file(rank), reason + "\n")
        deadline = time.monotonic() + grace_s
        try:
            while time.monotonic() < deadline:
                if all(self.trainer_exit(rank) is not None for rank in running):
                    return True
                time.sleep(0.1)
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting, kill
            log.warning("not waiting for the trainers' save: killing them")
        return False

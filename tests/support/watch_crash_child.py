"""Child process for the crash-recovery test: one watcher run that SIGKILLs itself at a chosen point.

argv: WORKDIR CRASH_AT, CRASH_AT one of
  none            run to completion
  after-decision  right after the decision is committed, before anything is applied
  apply-begun     inside the backend apply, before the cloud changed (the apply never converged)
  apply-done      inside the backend apply, after the cloud converged, before the watcher heard
  bootstrap       inside bootstrap, after the apply was recorded, before the decision is done
The cloud's state lives in WORKDIR/cloud.json (FileBackend), so it survives the kill like a real one.
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.support

from kit.watch.acting import Actor, Backoff
from kit.watch.ledger import Ledger, WatcherLock
from kit.watch.watcher import Watcher
from tests.support.watch import BackendSource, FileBackend, ScriptedPolicy, heartbeat, local_spec

workdir, crash_at = Path(sys.argv[1]), sys.argv[2]


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingLedger(Ledger):
    def begin_decision(self, **kwargs):
        decision = super().begin_decision(**kwargs)
        if crash_at == "after-decision":
            die()
        return decision


class CrashingBackend(FileBackend):
    def apply(self, spec, market):
        self.calls.append(("apply-begun", market))
        self.save()
        if crash_at == "apply-begun":
            die()
        self.calls.pop()
        nodes = super().apply(spec, market)
        self.save()
        if crash_at == "apply-done":
            die()
        return nodes

    def bootstrap(self, nodes):
        super().bootstrap(nodes)
        self.save()
        if crash_at == "bootstrap":
            die()


with WatcherLock(workdir / "watcher.lock"):
    ledger = CrashingLedger(workdir / "ledger.sqlite")
    backend = CrashingBackend(workdir / "cloud.json")
    if not backend.deployed:  # the cluster `kit apply` made before the watcher started
        FileBackend.apply(backend, local_spec(), "spot")
        backend.calls.clear()
        backend.save()
    ledger.record(heartbeat(10, 1000))
    spec = local_spec()
    actor = Actor(backend, ledger, spec, backoff=Backoff(initial_s=0.0, jitter=0.0))
    watcher = Watcher(spec, ledger, actor, ScriptedPolicy(["on-demand"]), source=BackendSource(backend))
    watcher.start()
    watcher.tick()
    watcher.tick()  # a retry after an interrupted apply happens on a later tick
    print("finished", flush=True)

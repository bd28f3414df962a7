"""`kit train` is crash-only: SIGKILLed at any moment, the same command continues the job.

Each case kills `kit train --cloud local` (real torchrun trainers on CPU) at one moment, waits,
runs the same command again and checks that the job finishes with the parameters of an
undisturbed run, that training is going again within one watcher interval plus a start-up (the
undisturbed run's own, measured here), that the killed run's nodes stopped costing when their
processes died (not when kit came back), and that no node process is left behind.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kit.backends.local import LEFTOVERS_LOG, LocalBackend
from tests.integration.test_train_local import KIT, leftovers, small_spec, user_env

pytestmark = pytest.mark.slow

STEPS = 100
PAUSE_S = 9.0  # kit stays dead this long: at 150x, 1350 trace seconds the nodes must not be billed for
# the trainers save on the parent-death signal, then exit: the nodes' last signs of life come this long
# after the kill at most (3.3 s seen with the whole suite running on 2 cores)
DYING_S = 5.0
# node 0's trainer writes its progress file at every step: a run killed mid-training showed life this
# close before the kill
LIFE_GAP_S = 2.0


@dataclass
class Run:
    output: str
    returncode: int
    started: float  # wall time the command started
    first_progress: float | None  # seconds until a trainer of this run first reported progress


def _progress_files(deploy: Path) -> list[Path]:
    return list(deploy.glob("local/run/node-*/progress.json"))


def _newest_step(deploy: Path) -> int:
    steps = [0]
    for path in _progress_files(deploy):
        try:
            steps.append(int(json.loads(path.read_text())["step"]))
        except (OSError, ValueError, KeyError):
            continue
    return max(steps)


def _node_states(deploy: Path) -> list[dict]:
    states = []
    for path in sorted(deploy.glob("local/nodes/node-*.json")):
        try:
            states.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return states


def _run(workdir: Path, args: list[str], deploy: Path, *, kill_when: Callable[[], bool] | None = None,
         timeout: float = 240) -> Run:
    """``kit train ARGS`` from ``workdir``; SIGKILLed as soon as ``kill_when()`` holds."""
    started = time.time()
    proc = subprocess.Popen([*KIT, "train", *args], cwd=workdir, env=user_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first = None
    while proc.poll() is None and time.time() - started < timeout:
        if first is None and any(p.stat().st_mtime > started for p in _progress_files(deploy)
                                 if p.exists()):
            first = time.time() - started
        if kill_when is not None and kill_when():
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.1)
    else:
        if proc.poll() is None:
            proc.kill()
    out, _ = proc.communicate(timeout=60)
    return Run(out, proc.returncode, started, first)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """The same job without a crash (or a preemption): its digest and its start-up time."""
    tmp = tmp_path_factory.mktemp("undisturbed")
    spec = small_spec(tmp, "crash", STEPS, trace=None)
    run = _run(tmp, [str(spec), "--no-preemptions", "--json-report", str(tmp / "r.json")], tmp / "deploy" / "crash")
    assert run.returncode == 0, run.output
    report = json.loads((tmp / "r.json").read_text())
    assert report["steps"] == STEPS and run.first_progress is not None
    return report, run.first_progress


def _crash_and_continue(tmp: Path, undisturbed, flags: list[str], kill_when: Callable[[Path], bool], *,
                        threshold: dict | None = None, **local):
    report0, startup = undisturbed
    spec = small_spec(tmp, "crash", STEPS, trace=None, **local)
    if threshold is not None:  # the threshold policy's trip, e.g. {"k": 1}: on-demand at the first preemption
        data = yaml.safe_load(spec.read_text())
        data["policy"]["threshold"].update(threshold)
        spec.write_text(yaml.safe_dump(data))
    deploy = tmp / "deploy" / "crash"
    killed = _run(tmp, [str(spec), *flags], deploy, kill_when=lambda: kill_when(deploy))
    assert killed.returncode == -signal.SIGKILL, f"the job ended before the kill moment:\n{killed.output}"
    killed_at = time.time()
    trained = _newest_step(deploy) > 0  # the trainers were stepping when kit died
    time.sleep(PAUSE_S)
    running = [s["instance_id"] for s in _node_states(deploy) if s["state"] == "running"]
    again = _run(tmp, [str(spec), *flags, "--json-report", str(tmp / "r.json")], deploy)
    assert again.returncode == 0, again.output
    report = json.loads((tmp / "r.json").read_text())
    assert report["steps"] == STEPS
    assert report["params_sha256"] == report0["params_sha256"], "the continued job is not the undisturbed one"
    # going again within one watcher interval plus a start-up (the undisturbed run's, with slack
    # for a shared CI machine); before, the restarted kit sat idle with no trainer alive. Where a killed
    # kit's node processes were still alive, kit first gives them up to save_grace_s to save and exit
    # (LocalBackend.reconcile): a trainer whose peer node died with kit can sit in a collective until
    # then (seen once in a fresh clone: node-1 recorded stopped 30 s after node-0, first progress at 36 s)
    assert again.first_progress is not None, again.output
    waited = re.search(re.escape(LEFTOVERS_LOG).replace("%d", r"\d+").replace("%s", ".*"), again.output) is not None
    bound = LocalBackend.tick_interval_s + 2 * startup + 10 + (LocalBackend.save_grace_s if waited else 0.0)
    assert again.first_progress < bound, (again.first_progress, startup, waited)
    if running:
        assert "left running by a kit that was killed" in again.output, again.output
    assert not leftovers(str(tmp / "deploy")), "node processes left behind"
    _assert_not_billed_while_dead(deploy, running, killed_at, again.started, trained=trained, waited=waited)
    return report, again


def _assert_not_billed_while_dead(deploy: Path, instances: list[str], killed_at: float, restarted_at: float, *,
                                  trained: bool, waited: bool) -> None:
    """The nodes a killed kit left "running" stopped costing when their processes died: their
    ledger rows end within a few seconds of the kill, not when kit came back; and not before they came
    up either (a stop dated on the wall clock instead of the job's compressed one billed them nothing).
    Killed mid-training, they are billed up to about the kill (their last sign of life). Processes that
    outlived kit (``waited``: torchrun in its rendezvous at start-up can) ran, and cost, until the
    restarted kit stopped them."""
    from kit.clock import VirtualClock
    from kit.spec import load_spec
    from kit.watch.ledger import Ledger

    spec = load_spec(deploy.parent.parent / "crash.yaml")
    ledger = Ledger(deploy / "ledger.sqlite")
    try:
        origin, scale, offset = ledger.clock()  # the compressed clock the backend attached
        assert scale == spec.local.time_scale
        clock = VirtualClock(origin, scale, offset=offset)
        rows = {row.instance_id: row for row in ledger.all_nodes()}
    finally:
        ledger.close()
    ends = []
    for instance in instances:
        if instance not in rows:  # applied but not yet recorded when kit died: never billed
            continue
        since, until = rows[instance].since, rows[instance].until
        # a trainer stepping dies within DYING_S of the kill; torchrun still in its start-up or rendezvous
        # may take the whole pause to shut down (seen: its last write as the restarted kit started), and a
        # process found alive at the restart ran until the restarted kit stopped it
        died_by = (restarted_at + LocalBackend.save_grace_s + DYING_S if waited
                   else killed_at + DYING_S if trained else restarted_at + DYING_S)
        assert until is not None and since <= until <= clock.at(died_by), (
            instance, since, until, clock.at(killed_at), clock.at(restarted_at), trained, waited)
        ends.append(until)
    if trained and ends:
        assert max(ends) >= clock.at(killed_at - LIFE_GAP_S), (ends, clock.at(killed_at))


def test_killed_mid_training_without_preemptions(tmp_path, undisturbed):
    _crash_and_continue(tmp_path, undisturbed, ["--no-preemptions"], lambda deploy: _newest_step(deploy) >= 30)


def test_killed_during_start_up(tmp_path, undisturbed):
    """Nodes applied, trainers not yet reporting: the first bootstrap never finished."""
    _crash_and_continue(tmp_path, undisturbed, ["--no-preemptions"],
                        lambda deploy: len(_node_states(deploy)) == 2 and not _progress_files(deploy))


def test_killed_right_after_a_market_switch(tmp_path, undisturbed):
    """Spot preempted every few seconds and a threshold of one preemption: the policy moves to on-demand
    at the first one, and kit is killed as soon as the on-demand nodes exist (before or during their
    bootstrap). With the example's threshold of two, the first preemption could move the job to the
    other zone instead, and on a busy machine the 100 steps were done before a second one came."""
    report, _ = _crash_and_continue(
        tmp_path, undisturbed, [],
        lambda deploy: any(s["market"] == "on-demand" for s in _node_states(deploy)),
        threshold={"k": 1}, preempt_every_seconds=3, grace_seconds=1)
    assert report["market_switches"] >= 1, report

"""End-to-end `kit train --cloud local` runs (real torchrun trainers on CPU)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kit.paths import EXAMPLES_DIR

KIT = [str(Path(sys.executable).parent / "kit")]
pytestmark = pytest.mark.slow


def user_env() -> dict:
    """As a user runs kit: no KIT_DEPLOY_ROOT, so deploy/ goes under the working directory."""
    return {**{k: v for k, v in os.environ.items() if k != "KIT_DEPLOY_ROOT"}, "COLUMNS": "120"}


def kit_train(workdir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``kit train`` run from ``workdir`` (not the checkout): its deployments land in workdir/deploy."""
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(KIT + ["train", *args], check=False, cwd=workdir, env=user_env(), capture_output=True,
                          text=True, timeout=timeout)


def leftovers(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (proc / "stat").read_text().split()
        except OSError:
            continue
        if marker in cmd and stat[2] != "Z":
            found.append(cmd)
    return found


def small_spec(tmp_path: Path, name: str, steps: int, **local) -> Path:
    data = yaml.safe_load((EXAMPLES_DIR / "local.yaml").read_text())
    data["name"] = name
    data["training"].update(steps=steps, ckpt_every=20)
    data["local"].update(local)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def report_of(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / name).read_text())


def on_demand_baseline(report: dict) -> float:
    from kit.spec import load_spec

    spec = load_spec(EXAMPLES_DIR / "local.yaml")
    return spec.nodes * spec.prices.on_demand_per_hour * (
        report["startup_hours"] + report["compute_hours"] + report["finish_hours"])


def held_hours(deploy: Path) -> float:
    """Hours (the ledger's clock) in which the job held any node: the union of its nodes' intervals. Not
    node-hours / 2: the 1 x 2 shape holds one node where 2 x 1 holds two, so the more of the run the
    reshaped job spends there (a slow machine shifts the preemptions), the more that undercounts."""
    from tests.support.watch import ledger_of

    with ledger_of(deploy) as ledger:
        nodes = ledger.all_nodes()
    assert nodes and all(n.until is not None for n in nodes), nodes  # every node released at the end
    held, end = 0.0, -float("inf")
    for since, until in sorted((n.since, n.until or n.since) for n in nodes):
        held += max(0.0, until - max(since, end))
        end = max(end, until)
    return held / 3600.0


def assert_moved_and_reshaped_on_spot(report: dict) -> None:
    # the market took both nodes of us-central1-c's gang at least once: one interruption of the job
    assert report["preemptions"] >= 2 and 1 <= report["interruptions"] <= report["preemptions"], report
    # threshold (k = 2 within 3 trace hours) counts interruptions, not the capacity search's failed tries nor
    # each node of a gang: one gang loss leaves the job on spot (a failed try counted as a second one switched it)
    if report["interruptions"] == 1:
        assert report["market_switches"] == 0 and report["on_demand_hours"] == 0, report
    # us-central1-c preempts; europe-west3-c (tried first, the preempting zone last) fits only 1 node:
    # the job moves and reshapes at once, restoring from the bucket (a directory), with the same digest
    assert report["moves"] >= 1 and report["shape_switches"] >= 1, report
    assert report["offers"][:2] == ["us-central1-c/2xlocal/spot", "europe-west3-c/1xlocal/spot"], report
    # each offer the capacity search tried is a probe: europe's 2 x 1 found no room (free), its 1 x 2 ran
    assert report["probes_without_capacity"] == report["capacity_errors"] >= 1, report
    assert report["probes"] == len(report["offers"]) + report["probes_without_capacity"], report


def region_crossings(offers: list[str]) -> int:
    """How often consecutive offers ("zone/shape/market") are in different regions (GCP zone names: REGION-X)."""
    regions = [offer.split("/")[0].rsplit("-", 1)[0] for offer in offers]
    return sum(a != b for a, b in itertools.pairwise(regions))


def test_default_run_matches_undisturbed_run(tmp_path):
    started = time.time()
    run = kit_train(tmp_path / "a", "--json-report", str(tmp_path / "a.json"), "--plot", str(tmp_path / "a.png"))
    wall = time.time() - started
    assert run.returncode == 0, run.stdout + run.stderr
    report = report_of(tmp_path, "a.json")
    for key in ("preemptions", "market_switches", "spot_hours", "on_demand_hours", "cost", "cost_on_demand",
                "steps", "steps_lost", "wall_seconds", "params_sha256"):
        assert key in report
    assert_moved_and_reshaped_on_spot(report)
    # the move crossed from North America to Europe: $0.05 per GB of the checkpoint (list prices), each way. A
    # run slowed by a loaded machine lasts longer on the trace's clock (time_scale) and can meet europe's next
    # preemption too, and move back: each crossing is billed
    state = tmp_path / "a" / "deploy" / "local-example" / "export" / "step-00000400" / "checkpoint" / "state.pt"
    crossings = region_crossings(report["offers"])
    assert crossings >= 1 and report["moves"] >= crossings, report
    assert report["egress_cost"] == pytest.approx(0.05 * crossings * state.stat().st_size / 1e9, abs=1e-4), report
    assert report["disks_used"] == 3 and report["idle_disk_hours"] > 0, report  # 2 in us-central1-c, 1 in europe
    # cost_on_demand is the same *job* all on-demand (not the node-hours held at the on-demand
    # price, which spot's preemptions inflate): nodes x Q x (first start-up + compute + export)
    assert report["cost_on_demand"] == pytest.approx(on_demand_baseline(report), rel=1e-3), report
    held = held_hours(tmp_path / "a" / "deploy" / "local-example")
    assert held > report["compute_hours"] + report["startup_hours"], "the nodes were held for more than the job"
    assert report["cost"] < report["cost_on_demand"], report
    assert report["steps"] == report["total_steps"] == 400
    assert len(report["params_sha256"]) == 64
    assert (tmp_path / "a.png").stat().st_size > 10_000
    assert wall < 180, f"default run took {wall:.0f} s"
    assert not leftovers(str(tmp_path / "a")), "node processes left behind"
    assert not (tmp_path / "a" / "deploy" / "local-example" / "local" / "disks").exists(), "disks deleted after done"
    # ... but only after the final checkpoint was exported and checked against the trainer's digest
    exported = tmp_path / "a" / "deploy" / "local-example" / "export" / "step-00000400"
    assert report["export"] == str(exported) and report["disks"] == "deleted"
    assert json.loads((exported / "export.json").read_text())["params_sha256"] == report["params_sha256"]
    assert (exported / "model.pt").is_file() and (exported / "checkpoint" / "COMPLETE").is_file()
    quiet = kit_train(tmp_path / "b", "--no-preemptions", "--json-report", str(tmp_path / "b.json"), "--keep-disks")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    undisturbed = report_of(tmp_path, "b.json")
    assert undisturbed["preemptions"] == 0 and undisturbed["market_switches"] == 0
    assert undisturbed["params_sha256"] == report["params_sha256"], "exact resume across the whole loop"
    assert undisturbed["cost"] < undisturbed["cost_on_demand"] == pytest.approx(on_demand_baseline(undisturbed),
                                                                                rel=1e-3)
    # the same job: the same useful compute, whatever happened to the nodes (step times measured
    # on 2 shared cores vary)
    assert 0.6 < undisturbed["compute_hours"] / report["compute_hours"] < 1.6, (undisturbed, report)
    assert (tmp_path / "b" / "deploy" / "local-example" / "local" / "disks" / "us-central1-c" / "node-0" / "ckpt").is_dir()
    assert undisturbed["moves"] == undisturbed["shape_switches"] == 0
    assert undisturbed["disks"] == "kept" and undisturbed["export"], "--keep-disks still exports"
    # the same command again: the job is done, so kit says so and shows its report (no training)
    again = kit_train(tmp_path / "a", timeout=60)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stdout + again.stderr
    assert report["params_sha256"][:16] in again.stdout and "damaged" not in again.stdout + again.stderr
    # --fresh would resume from the kept disks' final checkpoint instead of starting over: refused
    fresh = kit_train(tmp_path / "b", "--fresh", timeout=60)
    assert fresh.returncode == 2 and "kept its data disks" in fresh.stdout + fresh.stderr, fresh.stdout + fresh.stderr


def test_node0_preempted(tmp_path):
    spec = small_spec(tmp_path, "node0", 80, trace=None, grace_seconds=2)
    run = kit_train(tmp_path, str(spec), "--preempt-every", "2", "--json-report", str(tmp_path / "r.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    report = report_of(tmp_path, "r.json")
    assert report["preemptions"] >= 1 and report["steps"] == 80
    assert "preemption notice to node-0" in run.stdout + run.stderr
    logs = (tmp_path / "deploy" / "node0" / "local").glob("**/train.log")
    assert not list(logs), "run dirs are removed at the end"
    assert not leftovers(str(tmp_path / "deploy"))


def interruptible() -> None:
    """Popen ``preexec_fn``: SIGINT at its default, as in a terminal where a user presses Ctrl-C. A test run
    started in the background (``nohup``, ``&`` in a script) ignores SIGINT, every child inherits that, and
    Python then installs no KeyboardInterrupt handler: kit would never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_then_continue(tmp_path, sent, code):
    """Ctrl-C, and SIGTERM as a service manager, ``timeout`` or a cancelled CI job sends it, stop kit the
    same orderly way: the trainers save at a step boundary, kit says how to continue and exits 130 / 143;
    `kit train` again continues (after Ctrl-C; SIGTERM's stop is the same path, its continuation not rerun)."""
    spec = small_spec(tmp_path, "ctrlc", 100, trace=None)
    proc = subprocess.Popen(KIT + ["train", str(spec), "--no-preemptions"], cwd=tmp_path, env=user_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=interruptible)  # noqa: PLW1509 (one thread here)
    progress = tmp_path / "deploy" / "ctrlc" / "local" / "run" / "node-0" / "progress.json"
    deadline = time.time() + 120
    step = 0
    while time.time() < deadline and step < 30:
        time.sleep(0.3)
        try:
            step = json.loads(progress.read_text())["step"]
        except (FileNotFoundError, ValueError, KeyError):
            pass
    assert step >= 30, "training never got going"
    proc.send_signal(sent)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, out
    assert "kit train` again continues" in out
    time.sleep(0.5)
    assert not leftovers(str(tmp_path / "deploy")), "nodes must not outlive kit"
    states = [json.loads(p.read_text())["state"] for p in (tmp_path / "deploy" / "ctrlc" / "local" / "nodes").glob("*.json")]
    assert states and set(states) == {"stopped"}
    # ... and the ledger says so: `kit status` shows no node up, and its cost does not grow while nothing runs
    costs = []
    for _ in range(2):
        shown = subprocess.run(KIT + ["status", str(spec), "--json"], check=False, cwd=tmp_path, env=user_env(),
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        status = json.loads(shown.stdout)
        assert not [n for n in status["nodes"] if n["state"] == "up"], status["nodes"]
        costs.append(status["cost"])
        time.sleep(1.0)  # 150 trace seconds
    assert costs[0] == costs[1], costs
    if sent != signal.SIGINT:
        return  # the continuation is the same for both (the stop took the same path): Ctrl-C's checks it
    started = time.time()
    again = kit_train(tmp_path, str(spec), "--no-preemptions", "--json-report", str(tmp_path / "r.json"), "--keep-disks")
    second = time.time() - started
    assert again.returncode == 0, again.stdout + again.stderr
    report = report_of(tmp_path, "r.json")
    assert report["steps"] == 100
    log = (tmp_path / "deploy" / "ctrlc" / "local").glob("disks/*/node-*/ckpt")
    assert list(log)
    # Ctrl-C asks the trainers to save at a step boundary (their stop files) before they are
    # stopped: nothing is redone (a kill lost up to ckpt_every steps, more with a write in flight)
    assert report["steps_lost"] == 0, report
    assert report["wall_seconds"] > second, "the ledger carried the first run's time over"
    # the nodes kit stopped on the interrupt were not lost to the market (nor a preemption for the policy)
    assert report["nodes_lost"] == report["preemptions"] == report["interruptions"] == 0, report


def test_bad_cloud_and_spec(tmp_path):
    run = kit_train(tmp_path, "--cloud", "azure")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    run = kit_train(tmp_path, "--cloud", "aws")  # the built-in example is a local spec
    assert run.returncode == 2 and "cloud local" in run.stdout + run.stderr
    run = kit_train(tmp_path, "--time-scale", "0")
    assert run.returncode == 2

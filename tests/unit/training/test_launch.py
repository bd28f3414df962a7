"""training.launch as kit-trainer.service runs it: signals, the preemption marker, a finished run, bad flags.

A fake ``KIT_PYTHON`` plays torchrun (``python -m torch.distributed.run ... -m training.train FLAGS``): it
behaves like a training node (stops at the stop file after a "save", writes ``state: preempted`` to the
progress file and exits 1, as torchrun does when a worker exits 75) and logs the signals it gets. Its
workers are a child process, as torchrun's are, except in "rendezvous" mode (no worker started yet).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO
from training import launch

FAKE_TORCHRUN = r'''#!{python}
import atexit, json, os, signal, subprocess, sys, time
log = open({log!r}, "a", buffering=1)
log.write("started %s\n" % " ".join(sys.argv[1:]))
args = sys.argv[1:]
mode = {mode!r}
stop = args[args.index("--stop-file") + 1]
progress = args[args.index("--progress-file") + 1]

def on_term(signum, frame):
    log.write("signal %d\n" % signum)
    if mode in ("rendezvous", "slow-save"):  # torchrun ends at the signal (a slow save's workers are killed)
        sys.exit(1)

signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)
if mode != "rendezvous":  # the workers
    worker = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(worker.kill)
open({ready!r}, "w").close()
deadline = time.time() + 30
while time.time() < deadline:
    if mode == "train" and os.path.exists(stop):
        time.sleep(0.5)  # the emergency save
        os.unlink(stop)  # StopMonitor.consume_stop_file
        with open(progress, "w") as f:
            json.dump({{"step": 7, "total_steps": 20, "state": "preempted", "time": time.time()}}, f)
        log.write("saved\n")
        sys.exit(1)  # torchrun reports a worker's 75 as 1
    if mode == "finish":
        with open(progress, "w") as f:
            json.dump({{"step": 20, "total_steps": 20, "state": "done", "time": time.time()}}, f)
        sys.exit(0)
    time.sleep(0.05)
sys.exit(3)
'''


@pytest.fixture
def node(tmp_path):
    def make(mode="train", flags="--steps 20 --model vit_tiny_patch16_224"):
        fake = tmp_path / "fake-python"
        fake.write_text(FAKE_TORCHRUN.format(python=sys.executable, log=str(tmp_path / "fake.log"), mode=mode,
                                             ready=str(tmp_path / "ready")))
        fake.chmod(0o755)
        envf = tmp_path / "train.env"
        envf.write_text(f'NNODES=2\nNODE_RANK=1\nRDZV_ENDPOINT=10.0.0.5:29500\nRDZV_ID=c1\n'
                        f'CKPT_DIR={tmp_path}/ckpt\nTRAIN_FLAGS="{flags}"\nSTOP_FILE={tmp_path}/run/stop\n'
                        f'PREEMPTED_MARKER={tmp_path}/run/preempted\nPROGRESS_FILE={tmp_path}/progress.json\n'
                        f'KIT_PYTHON={fake}\n')
        return envf
    return make


def start_launch(envf, *extra):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "training.launch", "--env-file", str(envf), *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(path: Path, timeout=10.0):
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def fake_log(tmp_path) -> list[str]:
    p = tmp_path / "fake.log"
    return p.read_text().splitlines() if p.exists() else []


def sigterm_when_ready(tmp_path, proc) -> str:
    """SIGTERM the launcher once the fake torchrun is up; its output after it exits."""
    try:
        wait_for(tmp_path / "ready")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out


def test_sigterm_saves_through_the_stop_file_and_exits_75(tmp_path, node):
    """systemctl stop (KillMode=mixed: SIGTERM to training.launch only) must end in a save, not a SIGKILL."""
    proc = start_launch(node("train"), "--signal-grace", "30")
    out = sigterm_when_ready(tmp_path, proc)
    assert proc.returncode == 75, out
    log = fake_log(tmp_path)
    assert "saved" in log, log
    assert not any(line.startswith("signal") for line in log), "the save must not race torchrun's 30 s SIGKILL"


def test_sigterm_is_forwarded_after_the_grace_time(tmp_path, node):
    """Workers that do not save within the grace (still starting up, say): the signal reaches torchrun."""
    proc = start_launch(node("slow-save"), "--signal-grace", "0.5")
    out = sigterm_when_ready(tmp_path, proc)
    assert f"signal {int(signal.SIGTERM)}" in fake_log(tmp_path), out
    assert proc.returncode == 1, out  # a crash code, not 0 and not 75: nothing was saved


def test_sigterm_reaches_a_torchrun_without_workers_at_once(tmp_path, node):
    """torchrun still in its rendezvous (a node waiting for a replaced head, say): no worker can see the
    stop file and nothing is to be saved, so the stop does not wait out the grace (it did: 60 s)."""
    proc = start_launch(node("rendezvous"), "--signal-grace", "600")
    t0 = time.monotonic()
    out = sigterm_when_ready(tmp_path, proc)
    assert f"signal {int(signal.SIGTERM)}" in fake_log(tmp_path), out
    assert proc.returncode == 1 and time.monotonic() - t0 < 15, out


def test_second_signal_is_forwarded_at_once(tmp_path, node):
    proc = start_launch(node("slow-save"), "--signal-grace", "600")
    try:
        wait_for(tmp_path / "ready")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "the first signal only asks for a save"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"signal {int(signal.SIGTERM)}" in fake_log(tmp_path)


def test_marker_keeps_a_preempted_node_out_of_the_rendezvous(tmp_path, node):
    envf = node("train")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stop").write_text("preemption-notice\n")
    (tmp_path / "run" / "preempted").write_text("{}\n")
    assert launch.main(["--env-file", str(envf)]) == 75
    assert fake_log(tmp_path) == [], "torchrun must not start on a node that is being preempted"
    assert not (tmp_path / "run" / "stop").exists()
    (tmp_path / "run" / "preempted").unlink()  # after a reboot (/run is a tmpfs) it trains again
    envf = node("finish")
    assert launch.main(["--env-file", str(envf)]) == 0
    assert len(fake_log(tmp_path)) == 1


def test_finished_run_is_not_started_again(tmp_path, node, capsys):
    envf = node("finish")
    assert launch.main(["--env-file", str(envf)]) == 0
    assert len(fake_log(tmp_path)) == 1
    assert launch.main(["--env-file", str(envf), "--status"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "finished"
    assert launch.main(["--env-file", str(envf)]) == 0  # the bootstrap re-run / a reboot
    assert len(fake_log(tmp_path)) == 1, "a finished run must not start torchrun again"
    # more steps asked for: it trains again
    envf = node("finish", flags="--steps 40")
    assert launch.main(["--env-file", str(envf), "--status"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "pending"


@pytest.mark.parametrize("flags", ["--steps 0", "--stepz 10", "--keep 1"])
def test_bad_flags_exit_2_without_starting(tmp_path, node, flags, capsys):
    """Exit 2 is in RestartPreventExitStatus: a typo must not restart the unit every 10 s forever."""
    envf = node("train", flags=flags)
    assert launch.main(["--env-file", str(envf)]) == 2
    assert "bad TRAIN_FLAGS" in capsys.readouterr().err
    assert launch.main(["--env-file", str(envf), "--status"]) == 2
    assert fake_log(tmp_path) == []


def test_missing_data_directory_is_left_to_the_trainer(tmp_path, node):
    """A data directory that is not there (yet: a mount the unit is not ordered after) is not a typo:
    the launcher's exit 2 is final, so it starts torchrun and the trainer's error is retried."""
    envf = node("finish", flags="--data /nonexistent/dir")
    assert launch.main(["--env-file", str(envf), "--status"]) == 0
    launch.main(["--env-file", str(envf)])
    assert fake_log(tmp_path), "torchrun must have been started"


def test_status_reports_the_marker(tmp_path, node, capsys):
    envf = node("train")
    assert launch.main(["--env-file", str(envf), "--status"]) == 0
    assert capsys.readouterr().out.strip() == "pending"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "preempted").write_text("{}\n")
    assert launch.main(["--env-file", str(envf), "--status"]) == 0
    assert capsys.readouterr().out.strip() == "preempted"


def test_exit_status_of_a_signalled_child():
    assert launch.exit_status(-9, None, 0) == 137
    assert launch.exit_status(-15, None, 0) == 143


def test_unit_stop_timeout_covers_the_grace_and_torchruns_own_timeout():
    from tests.support.files import render_template

    text = render_template("trainer", "kit-trainer.service.j2", {
        "trainer_venv": "/opt/kit/venv", "trainer_mount_point": "/mnt/kit-disk",
        "trainer_ckpt_dir": "/mnt/kit-disk/ckpt", "trainer_signal_grace": 60})
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    assert values["KillMode"] == "mixed"
    assert "--signal-grace 60" in values["ExecStart"]
    # launch forwards after the grace, torchrun then gives its workers 30 s before SIGKILL
    assert int(values["TimeoutStopSec"]) >= 60 + 30 + 10
    assert values["RestartForceExitStatus"] == "75" and "2" in values["RestartPreventExitStatus"].split()

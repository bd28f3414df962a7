"""The roles' restart handlers under kit's ansible.cfg: a task that fails after a notify does not lose it,
and a bootstrap killed before its handlers leaves the restarts it owes to the next one (the roles run on this
host, their writes kept in overlays of a private mount namespace)."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kit.paths import ANSIBLE_DIR, TRAINING_PACKAGE_DIR
from tests.support import overlay_mounts, overlay_skip_reason

BIN = Path(sys.executable).parent
# systemctl as the systemd_service module uses it: `show UNIT` answers the unit's state from STATE_DIR/UNIT;
# `restart` fails while KIT_FAKE_SYSTEMCTL_FAIL_RESTART is set
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$KIT_FAKE_SYSTEMCTL_LOG"
if [ "$1" = restart ] && [ -n "$KIT_FAKE_SYSTEMCTL_FAIL_RESTART" ]; then
  echo "Job for $2 failed" >&2
  exit 1
fi
if [ "$1" = show ]; then
  echo "ActiveState=$(cat "$KIT_FAKE_SYSTEMCTL_STATES/$2" 2>/dev/null || echo inactive)"
  echo "LoadState=loaded"
fi
exit 0
"""
UNITS = ("kit-trainer", "kit-agent")
# the roles' marker directory (roles/*/vars/main.yml), inside the overlay of /var/lib
PENDING = Path("/var/lib/kit/restart-pending")
OVERLAID = ("/etc", "/opt", "/var/lib")


def test_kits_ansible_config_forces_handlers():
    config = configparser.ConfigParser()
    config.read(ANSIBLE_DIR / "ansible.cfg")
    assert config.getboolean("defaults", "force_handlers")


def _env(tmp_path: Path) -> dict:
    """kit's ansible.cfg and the fake systemctl of tmp_path first on PATH."""
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}:{BIN}:{os.environ['PATH']}",
            "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"),
            "KIT_FAKE_SYSTEMCTL_LOG": str(tmp_path / "systemctl.log"),
            "KIT_FAKE_SYSTEMCTL_STATES": str(tmp_path / "states")}


def _fake_systemctl(tmp_path: Path, running: list[str]) -> dict:
    """systemctl that logs its calls, with the units in `running` active; the environment for it."""
    states = tmp_path / "states"
    states.mkdir()
    for unit in running:
        (states / unit).write_text("active")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "systemctl").write_text(FAKE_SYSTEMCTL)
    (tmp_path / "bin" / "systemctl").chmod(0o755)
    return _env(tmp_path)


def _restarts(tmp_path: Path) -> list[str]:
    """The restarts systemctl was asked for since the last call."""
    log = tmp_path / "systemctl.log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return sorted(call for call in calls if call.startswith("restart"))


def _play(tmp_path: Path, running: list[str], play_vars: dict, *, fail_restart: bool = False,
          ) -> tuple[list[str], list[str]]:
    """Notify both roles' handlers, as a changed training package does, with both units marked for a
    restart (as the package's tasks mark them), then fail; the systemctl commands the handlers ran, and
    the markers left."""
    env = {**_fake_systemctl(tmp_path, running), **({"KIT_FAKE_SYSTEMCTL_FAIL_RESTART": "1"} if fail_restart else {})}
    pending = tmp_path / "restart-pending"
    pending.mkdir()
    for unit in UNITS:
        (pending / unit).write_text("")
    play = [{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, "trainer_service_start": True,
                 "preemption_agent_service_start": True, "trainer_restart_pending_dir": str(pending),
                 "preemption_agent_restart_pending_dir": str(pending), **play_vars},
        "handlers": [{"ansible.builtin.import_tasks": str(ANSIBLE_DIR / "roles" / role / "handlers" / "main.yml")}
                     for role in ("trainer", "preemption_agent")],
        "tasks": [{"name": "The training package changed", "ansible.builtin.debug": {"msg": "new files"},
                   "changed_when": True, "notify": "kit training package changed"},
                  {"name": "A later task fails", "ansible.builtin.fail": {"msg": "a later task failed"}}],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "play.yml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 2 and "a later task failed" in proc.stdout, proc.stdout + proc.stderr
    log = tmp_path / "systemctl.log"
    return log.read_text().splitlines() if log.exists() else [], sorted(p.name for p in pending.iterdir())


@pytest.mark.parametrize("flags_rejected", [False, True])
def test_a_failure_after_a_change_still_restarts_the_units_that_ran(tmp_path, flags_rejected):
    """Before, the failure dropped the notify: trainer and agent kept running the old package, and the
    next bootstrap found the files in place and restarted nothing. A trainer is not restarted into flags
    training.launch rejected (the failure was that): its restart stays pending, the agent's is done."""
    play_vars = {"trainer_status": {"rc": 2}} if flags_rejected else {}
    calls, pending = _play(tmp_path, ["kit-trainer", "kit-agent"], play_vars)
    assert ("restart kit-trainer" in calls) is not flags_rejected, calls
    assert "restart kit-agent" in calls, calls
    assert pending == (["kit-trainer"] if flags_rejected else []), pending


def test_a_failure_on_a_new_node_starts_nothing(tmp_path):
    """Units that did not run before the play (a new node that failed before its start tasks) are not
    started by a restart handler, and owe no restart: whatever starts them starts the new files."""
    calls, pending = _play(tmp_path, [], {})
    assert not [call for call in calls if call.startswith(("restart", "start"))], calls
    assert pending == [], pending


def test_a_failed_restart_stays_pending(tmp_path):
    """The markers go only after the restart succeeded: a failed one (which ends the host's handlers) leaves
    both for the next bootstrap."""
    calls, pending = _play(tmp_path, ["kit-trainer", "kit-agent"], {}, fail_restart=True)
    assert "restart kit-trainer" in calls, calls
    assert pending == ["kit-agent", "kit-trainer"], (calls, pending)


def _skip_reason() -> str | None:
    return overlay_skip_reason("/etc, /opt and /var/lib")


def _node(tmp_path: Path) -> dict:
    """This host as a node whose trainer and agent run (fake systemctl): a venv for the trainer and a copy
    of the training package to change; the inventory's host variables."""
    _fake_systemctl(tmp_path, list(UNITS))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    shutil.copytree(TRAINING_PACKAGE_DIR, tmp_path / "training", ignore=shutil.ignore_patterns("__pycache__"))
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "node_rank": 0,
            "instance_id": "i-0", "trainer_service_start": True, "preemption_agent_service_start": True,
            "trainer_venv": str(tmp_path / "venv"), "trainer_source": str(tmp_path / "training"),
            "trainer_mount_point": str(tmp_path / "disk"), "trainer_flags": ["--steps", "10"]}


def _bootstrap(tmp_path: Path, host: dict, *, killed: bool = False, check: bool = False) -> str:
    """Both roles as kit's playbook runs them (kit's ansible.cfg); its output. killed: after the roles'
    tasks the play waits, and ansible-playbook is SIGKILLed there, as a controller killed after the tasks
    changed the node and before the handlers ran (they run after a play's roles and tasks). It is the init
    of a PID namespace, so its workers (each in its own session) die with it."""
    play = {"hosts": "all", "gather_facts": False, "roles": ["trainer", "preemption_agent"]}
    if killed:
        play["tasks"] = [{"name": "Wait to be killed",
                          "ansible.builtin.command": f"sh -c 'touch {tmp_path}/killme && sleep 120'"}]
    (tmp_path / "killme").unlink(missing_ok=True)
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"node-0": host}}}))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    mounts = overlay_mounts(tmp_path, OVERLAID)
    playbook = shlex.join([str(BIN / "ansible-playbook"), "-i", "inventory.yml", "play.yml", *(["--check"] * check)])
    with (tmp_path / "out.log").open("w") as out:
        # sh execs ansible-playbook, which gets SIGKILL when unshare does
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
                                 "--kill-child=SIGKILL", "sh", "-ec", " && ".join([*mounts, f"exec {playbook}"])],
                                cwd=tmp_path, env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while killed and not (tmp_path / "killme").exists() and proc.poll() is None:
                assert time.monotonic() < deadline, "the play never reached its end"
                time.sleep(0.1)
            if killed and proc.poll() is None:
                proc.kill()
            rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    output = (tmp_path / "out.log").read_text()
    assert rc == (-signal.SIGKILL if killed else 0), output
    return output


def _pending(tmp_path: Path) -> list[str]:
    """The restart markers on the node (in the overlay's upper directory)."""
    marker_dir = tmp_path / "upper-var-lib" / PENDING.relative_to("/var/lib")
    # regular files only: a marker removed that the host's own /var/lib held is a whiteout (a 0/0 character
    # device) in the overlay's upper directory (https://docs.kernel.org/filesystems/overlayfs.html)
    return sorted(p.name for p in marker_dir.iterdir() if p.is_file()) if marker_dir.exists() else []


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_a_bootstrap_killed_before_its_handlers_restarts_the_units_on_the_next_run_and_only_then(tmp_path):
    """The trainer and the agent run older files; a bootstrap installs the package, train.env and the units,
    and its controller is killed before the handlers. Before, that left the new files with the old trainer
    and agent running, the next bootstrap found nothing to change, and nothing ever restarted them."""
    host = _node(tmp_path)
    _bootstrap(tmp_path, host, killed=True)
    assert _restarts(tmp_path) == [], "killed before its handlers"
    out = _bootstrap(tmp_path, host)  # the files are already the new ones
    assert _restarts(tmp_path) == ["restart kit-agent", "restart kit-trainer"], out
    assert _pending(tmp_path) == [], out
    # once the owed restarts ran, a bootstrap restarts nothing, and a dry run marks nothing
    out = _bootstrap(tmp_path, host)
    assert _restarts(tmp_path) == [] and "changed=0" in out, out
    out = _bootstrap(tmp_path, {**host, "trainer_flags": ["--steps", "20"]}, check=True)
    assert "changed=0" not in out, out  # the dry run reports the change and the restart
    assert _restarts(tmp_path) == [] and _pending(tmp_path) == [], out

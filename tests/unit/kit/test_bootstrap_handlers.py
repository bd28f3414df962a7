"""The roles' restart handlers under kit's ansible.cfg: a task that fails after a notify does not lose it."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit.paths import ANSIBLE_DIR

BIN = Path(sys.executable).parent
# systemctl as the systemd_service module uses it: `show UNIT` answers the unit's state from STATE_DIR/UNIT
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$KIT_FAKE_SYSTEMCTL_LOG"
if [ "$1" = show ]; then
  echo "ActiveState=$(cat "$KIT_FAKE_SYSTEMCTL_STATES/$2" 2>/dev/null || echo inactive)"
  echo "LoadState=loaded"
fi
exit 0
"""


def test_kits_ansible_config_forces_handlers():
    config = configparser.ConfigParser()
    config.read(ANSIBLE_DIR / "ansible.cfg")
    assert config.getboolean("defaults", "force_handlers")


def _play(tmp_path: Path, running: list[str], play_vars: dict) -> list[str]:
    """Notify both roles' handlers, as a changed training package does, then fail; the systemctl
    commands the handlers ran."""
    states, log = tmp_path / "states", tmp_path / "systemctl.log"
    states.mkdir()
    for unit in running:
        (states / unit).write_text("active")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "systemctl").write_text(FAKE_SYSTEMCTL)
    (tmp_path / "bin" / "systemctl").chmod(0o755)
    play = [{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, "trainer_service_start": True,
                 "preemption_agent_service_start": True, **play_vars},
        "handlers": [{"ansible.builtin.import_tasks": str(ANSIBLE_DIR / "roles" / role / "handlers" / "main.yml")}
                     for role in ("trainer", "preemption_agent")],
        "tasks": [{"name": "The training package changed", "ansible.builtin.debug": {"msg": "new files"},
                   "changed_when": True, "notify": "kit training package changed"},
                  {"name": "A later task fails", "ansible.builtin.fail": {"msg": "a later task failed"}}],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{BIN}:{os.environ['PATH']}",
           "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "KIT_FAKE_SYSTEMCTL_LOG": str(log),
           "KIT_FAKE_SYSTEMCTL_STATES": str(states)}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "play.yml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 2 and "a later task failed" in proc.stdout, proc.stdout + proc.stderr
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("flags_rejected", [False, True])
def test_a_failure_after_a_change_still_restarts_the_units_that_ran(tmp_path, flags_rejected):
    """Before, the failure dropped the notify: trainer and agent kept running the old package, and the
    next bootstrap found the files in place and restarted nothing. A trainer is not restarted into flags
    training.launch rejected (the failure was that)."""
    play_vars = {"trainer_status": {"rc": 2}} if flags_rejected else {}
    calls = _play(tmp_path, ["kit-trainer", "kit-agent"], play_vars)
    assert ("restart kit-trainer" in calls) is not flags_rejected, calls
    assert "restart kit-agent" in calls, calls


def test_a_failure_on_a_new_node_starts_nothing(tmp_path):
    """Units that did not run before the play (a new node that failed before its start tasks) are not
    started by a restart handler."""
    calls = _play(tmp_path, [], {})
    assert not [call for call in calls if call.startswith(("restart", "start"))], calls

"""The preemption_agent role run on this machine, its writes to /etc, /opt and /var/lib kept in overlays of a private
mount namespace: a bootstrap that names no watcher (`kit bootstrap` by hand) keeps the agent's watcher."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit.paths import ANSIBLE_DIR
from tests.support import overlay_mounts, overlay_skip_reason

BIN = Path(sys.executable).parent
OVERLAID = ("/etc", "/opt", "/var/lib")  # the role keeps its restart markers in /var/lib/kit
WATCHER = {"preemption_agent_watcher_url": "http://10.0.0.9:8787", "preemption_agent_watcher_token": "tok-" + "x" * 43}


def _skip_reason() -> str | None:
    return overlay_skip_reason("/etc, /opt and /var/lib")


def _bootstrap(tmp_path: Path, role_vars: dict) -> str:
    """The role as kit's playbook runs it (kit's ansible.cfg), on this host; its output."""
    inventory = {"all": {"hosts": {"node-0": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "node_rank": 0,
        "instance_id": "i-0", "preemption_agent_service_start": False, **role_vars}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    play = [{"hosts": "all", "gather_facts": False, "roles": ["preemption_agent"]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    mounts = overlay_mounts(tmp_path, OVERLAID)
    playbook = shlex.join([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           str(tmp_path / "play.yml")])
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles")}
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                           " && ".join([*mounts, playbook])], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _installed(tmp_path: Path, path: str) -> str:
    return (tmp_path / "upper-etc" / Path(path).relative_to("/etc")).read_text()


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_a_bootstrap_without_a_watcher_keeps_the_agents_watcher(tmp_path):
    """Before, `kit bootstrap` by hand rendered kit-agent.service without --watcher-url, and its restart cut
    a running agent off from a running watcher."""
    _bootstrap(tmp_path, WATCHER)  # the watcher's bootstrap (kit train / kit watch)
    unit = _installed(tmp_path, "/etc/systemd/system/kit-agent.service")
    assert "--watcher-url http://10.0.0.9:8787 --watcher-token-file /etc/kit/watcher-token" in unit
    out = _bootstrap(tmp_path, {})  # kit bootstrap SPEC by hand
    assert _installed(tmp_path, "/etc/systemd/system/kit-agent.service") == unit
    assert _installed(tmp_path, "/etc/kit/watcher-token") == WATCHER["preemption_agent_watcher_token"] + "\n"
    assert "changed=0" in out and WATCHER["preemption_agent_watcher_token"] not in out, out
    # a watcher that names itself anew (another --advertise-url) still replaces the old one
    _bootstrap(tmp_path, {**WATCHER, "preemption_agent_watcher_url": "http://10.0.0.7:8787"})
    assert "--watcher-url http://10.0.0.7:8787 " in _installed(tmp_path, "/etc/systemd/system/kit-agent.service")


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_a_new_node_without_a_watcher_reports_nowhere(tmp_path):
    _bootstrap(tmp_path, {})
    assert "--watcher-url" not in _installed(tmp_path, "/etc/systemd/system/kit-agent.service")
    assert not (tmp_path / "upper-etc" / "kit" / "watcher-token").exists()

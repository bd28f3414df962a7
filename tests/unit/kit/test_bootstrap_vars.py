"""Role variables kit derives per host or from the node contract: no spec and no `-e` sets them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit.backends.local import free_port
from kit.bootstrap import KIT_VARS, NODE_VARS, ROLES, inventory_from_spec, parse_extra_vars
from kit.errors import InputError
from kit.paths import ANSIBLE_DIR, EXAMPLES_DIR
from kit.spec import load_spec

# what the roles' defaults derive from the inventory's host vars (kit.bootstrap.inventory_from_spec)
HOST_FACTS = {"node_rank", "instance_id"}
DERIVED = ["trainer_node_rank", "preemption_agent_node_rank", "preemption_agent_instance",
           "preemption_agent_marker_file", "preemption_agent_stop_file", "preemption_agent_progress_file",
           "preemption_agent_event_dir"]


def _write_spec(tmp_path: Path, role_vars: dict) -> Path:
    data = yaml.safe_load((EXAMPLES_DIR / "aws-g5-spot.yaml").read_text())
    data.setdefault("bootstrap", {})["vars"] = role_vars
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", DERIVED)
def test_a_spec_may_not_set_what_kit_derives_per_host_or_from_the_contract(tmp_path, name):
    """Before, these went into the inventory's group vars, over the roles' per-host defaults: every node
    at rank 0, or an agent watching a stop file kit never writes."""
    with pytest.raises(InputError) as info:
        load_spec(_write_spec(tmp_path, {name: "x"}))
    assert f"bootstrap.vars.{name}" in str(info.value) and "kit sets" in str(info.value)


@pytest.mark.parametrize("item", ["trainer_node_rank=0", "preemption_agent_node_rank=1", "trainer_nnodes=3",
                                  "preemption_agent_instance=i-0", "preemption_agent_stop_file=/tmp/stop",
                                  "trainer_data_device=/dev/sdb", "preemption_agent_watcher_url=http://x:1"])
def test_extra_vars_may_not_set_what_differs_per_host_or_the_contract(item):
    with pytest.raises(InputError) as info:
        parse_extra_vars([item])
    assert info.value.where == "-e" and "kit sets" in str(info.value)


def test_extra_vars_still_override_kits_other_choices():
    assert parse_extra_vars(["trainer_flags=[--steps, '10']", "trainer_nproc_per_node=1"]) == {
        "trainer_flags": ["--steps", "10"], "trainer_nproc_per_node": 1}


def _defaults() -> dict[str, object]:
    out: dict[str, object] = {}
    for role in ROLES:
        out.update(yaml.safe_load((ANSIBLE_DIR / "roles" / role / "defaults" / "main.yml").read_text()) or {})
    return out


def test_every_default_derived_from_a_host_or_the_contract_is_kits():
    """A role default computed from a host fact or from what kit sets per host or by the contract is
    kit's too: a new one cannot slip past the spec's check."""
    for name, value in _defaults().items():
        used = set(re.findall(r"\b[a-z_]+\b", " ".join(re.findall(r"{{(.*?)}}", str(value)))))
        if used & (HOST_FACTS | NODE_VARS):
            assert name in NODE_VARS, f"{name} = {value!r} derives from {sorted(used & (HOST_FACTS | NODE_VARS))}"
    assert NODE_VARS <= KIT_VARS


def test_the_inventory_gives_each_host_its_own_rank_and_instance(tmp_path):
    spec = load_spec(_write_spec(tmp_path, {}))
    nodes = [{"name": f"n{i}", "public_ip": f"10.0.0.{i + 1}", "private_ip": f"10.0.0.{i + 1}",
              "instance_id": f"i-{i}", "disk_id": f"vol-{i}"} for i in range(2)]
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory_from_spec(spec, {"nodes": nodes}, known_hosts=None)))
    # the debug action runs on the controller: no host is contacted
    bindir = Path(sys.executable).parent
    proc = subprocess.run([str(bindir / "ansible"), "all", "-i", str(path), "-m", "ansible.builtin.debug", "-a",
                           "msg={{ [trainer_node_rank, preemption_agent_node_rank, preemption_agent_instance] }}"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": f"{bindir}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = re.finditer(r"^(\S+) \| SUCCESS => ({.*?^})", proc.stdout, re.MULTILINE | re.DOTALL)
    got = {match[1]: json.loads(match[2])["msg"] for match in results}
    assert got == {"n0": [0, 0, "i-0"], "n1": [1, 1, "i-1"]}, proc.stdout


@pytest.mark.parametrize("pinned", [True, False])
def test_ansibles_ssh_checks_the_pinned_host_keys_and_nothing_else(tmp_path, pinned):
    """The ssh command line Ansible builds from kit's ansible.cfg and inventory (-vvv prints it; the host is
    this machine's loopback at a closed port, so the connection is refused at once): pinned, it uses kit's
    known_hosts file and StrictHostKeyChecking=yes, and no earlier option turns the check off (ssh keeps an
    option's first value); opted out, it says no check plainly."""
    spec = load_spec(_write_spec(tmp_path, {}))
    known = tmp_path / "known_hosts"
    inventory = inventory_from_spec(spec, {"nodes": [{"name": "n0", "private_ip": "127.0.0.1", "instance_id": "i-0"}]},
                                    known_hosts=known if pinned else None)
    inventory["all"]["hosts"]["n0"]["ansible_port"] = free_port()  # nothing listens there
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory))
    bindir = Path(sys.executable).parent
    proc = subprocess.run([str(bindir / "ansible"), "all", "-vvv", "-i", str(path), "-m", "ansible.builtin.ping"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": f"{bindir}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
                               "HOME": str(tmp_path)})
    command = next(line for line in (proc.stdout + proc.stderr).splitlines() if "SSH: EXEC ssh" in line)
    checks = re.findall(r"StrictHostKeyChecking=(\w+)", command)
    files = re.findall(r"UserKnownHostsFile=(\S+?)'?(?:\s|$)", command)
    if pinned:
        assert checks and checks[0] == "yes" and "no" not in checks, command
        assert files and files[0] == str(known), command
    else:
        assert checks[0] == "no" and files[0] == "/dev/null", command

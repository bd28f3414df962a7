"""ansible/: lint (production profile), syntax check, unit templates (systemd-analyze verify), inventory."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.files import render_template

BIN = Path(sys.executable).parent
ANSIBLE = REPO / "ansible"


def _env():
    import os

    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg")}


@pytest.mark.skipif(not (BIN / "ansible-lint").exists(), reason="ansible-lint not installed (make install)")
def test_ansible_lint_production_clean(tmp_path):
    proc = subprocess.run(check=False, args=[str(BIN / "ansible-lint"), "--profile", "production", "--offline", "ansible/"], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the same lint must fail on a bad role (a task without a name and a non-FQCN module)
    bad = tmp_path / "ansible"
    shutil.copytree(ANSIBLE, bad)
    with open(bad / "roles" / "trainer" / "tasks" / "main.yml", "a") as f:
        f.write("\n- shell: echo hi\n")
    proc = subprocess.run(check=False, args=[str(BIN / "ansible-lint"), "--profile", "production", "--offline", str(bad)],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0


def test_playbook_syntax_check(tmp_path):
    proc = subprocess.run(check=False, args=[str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,", "site.yml"],
                          cwd=ANSIBLE, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text("- hosts: all\n  tasks:\n    - name: x\n      ansible.builtin.nosuchmodule: {}\n")
    proc = subprocess.run(check=False, args=[str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,", str(bad)],
                          cwd=ANSIBLE, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0


def verify_unit(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(check=False, args=["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True,
                          timeout=60)


TRAINER_UNIT_VARS = {"trainer_mount_point": "/mnt/kit-disk", "trainer_ckpt_dir": "/mnt/kit-disk/ckpt",
                     "trainer_signal_grace": 60}


def agent_unit_vars(venv) -> dict:
    return {"preemption_agent_venv": str(venv), "preemption_agent_cloud": "gcp", "preemption_agent_instance": "vm-0",
            "preemption_agent_node_rank": 0, "preemption_agent_stop_file": "/run/kit/stop",
            "preemption_agent_marker_file": "/run/kit/preempted",
            "preemption_agent_progress_file": "/mnt/kit-disk/progress.json", "preemption_agent_event_dir": "/mnt/kit-disk",
            "preemption_agent_interval": 2, "preemption_agent_metadata_url": "",
            "preemption_agent_watcher_url": "http://10.0.0.1:8080", "preemption_agent_watcher_token": "t",
            "preemption_agent_cluster": "c1"}


def unit_values(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_verify(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    trainer = tmp_path / "kit-trainer.service"
    trainer.write_text(render_template("trainer", "kit-trainer.service.j2", {"trainer_venv": str(venv),
                                                                             **TRAINER_UNIT_VARS}))
    agent = tmp_path / "kit-agent.service"
    agent.write_text(render_template("preemption_agent", "kit-agent.service.j2", agent_unit_vars(venv)))
    for unit in (trainer, agent):
        proc = verify_unit(unit)
        assert proc.returncode == 0, proc.stderr
    text = trainer.read_text()
    assert "Restart=on-failure" in text and "RestartForceExitStatus=75" in text
    assert "--watcher-token-file /etc/kit/watcher-token --cluster c1" in agent.read_text()
    assert "--marker-file /run/kit/preempted" in agent.read_text()
    bad = tmp_path / "kit-bad.service"
    bad.write_text("[Service]\nExecStart=relative/path\nRestart=sometimes\n")
    proc = verify_unit(bad)
    assert proc.returncode != 0


def test_units_wait_for_the_data_disk_and_stop_in_order():
    """nofail in fstab orders nothing: both units need RequiresMountsFor= on the data disk's mount point.
    On GCP the trainer stops only after the shutdown-script ran (it waits for the save)."""
    trainer = unit_values(render_template("trainer", "kit-trainer.service.j2",
                                          {"trainer_venv": "/opt/kit/venv", **TRAINER_UNIT_VARS}))
    agent = unit_values(render_template("preemption_agent", "kit-agent.service.j2", agent_unit_vars("/opt/kit/venv")))
    assert "/mnt/kit-disk" in " ".join(trainer["RequiresMountsFor"]).split()
    assert "/mnt/kit-disk" in " ".join(agent["RequiresMountsFor"]).split()
    assert "google-shutdown-scripts.service" in " ".join(trainer["Before"]).split()
    assert "kit-trainer.service" in " ".join(agent["Before"]).split()
    assert trainer["KillMode"] == ["mixed"], "SIGTERM goes to training.launch, which asks for the save"
    assert trainer["RestartPreventExitStatus"][0].split() == ["2"]
    assert trainer["Restart"] == ["on-failure"] and trainer["RestartForceExitStatus"] == ["75"]


@pytest.mark.parametrize(("preempted", "system_state", "marker"), [
    ("TRUE", "running", True),      # a preemption: the VM goes away, the node must not rejoin
    ("FALSE", "stopping", True),    # a normal shutdown: the VM goes away too
    ("FALSE", "running", False),    # guest-agent upgrade on a live VM: save, but train on afterwards
    (None, "running", False),       # called without the metadata answer
])
def test_gcp_shutdown_hook_saves_and_marks_only_a_vm_that_goes_away(tmp_path, preempted, system_state, marker):
    """Run the rendered hook with a fake systemctl: the stop file is always written and it waits while
    the trainer is active; the preempted marker only when the VM is really going down."""
    hook = tmp_path / "hook.sh"
    hook.write_text(render_template("preemption_agent", "gcp-shutdown-hook.sh.j2", {
        "preemption_agent_marker_file": str(tmp_path / "run" / "preempted"),
        "preemption_agent_stop_file": str(tmp_path / "run" / "stop")}))
    hook.chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    # is-system-running answers the state; is-active: "active" twice (the save takes 2 s), then inactive
    (bindir / "systemctl").write_text(
        f'#!/bin/sh\nif [ "$1" = is-system-running ]; then echo {system_state}; exit 0; fi\n'
        f"echo x >> {calls}\n[ $(wc -l < {calls}) -le 2 ]\n")
    (bindir / "systemctl").chmod(0o755)
    import os

    argv = ["sh", str(hook)] + ([preempted] if preempted else [])
    proc = subprocess.run(argv, env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "stop").exists()
    assert (tmp_path / "run" / "preempted").exists() is marker
    assert len(calls.read_text().splitlines()) == 3


def _when_clauses(node):
    """Every `when` condition string in a task list (blocks, rescue, always included)."""
    if isinstance(node, list):
        for item in node:
            yield from _when_clauses(item)
    elif isinstance(node, dict):
        when = node.get("when")
        if isinstance(when, str):
            yield when
        elif isinstance(when, list):
            yield from (w for w in when if isinstance(w, str))
        for key in ("block", "rescue", "always"):
            if key in node:
                yield from _when_clauses(node[key])


def test_boolean_variables_are_tested_with_bool_filter():
    """`-e nvidia_driver_allow_reboot=false` or an inventory's "false" is a string: `when: var` on it fails in
    ansible-core 2.19 (and is true before). Every boolean role variable in a condition needs `| bool`."""
    import re

    import yaml

    booleans = {"nvidia_driver_working", "nvidia_driver_use_fm", "trainer_finished"}  # set_fact flags
    for defaults in ANSIBLE.glob("roles/*/defaults/main.yml"):
        for name, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if isinstance(value, bool) or (isinstance(value, str) and value.startswith("{{")
                                           and re.search(r"==|\bis\b", value)):
                booleans.add(name)
    assert {"nvidia_driver_allow_reboot", "python_env_install_torch", "trainer_service_start"} <= booleans
    bad = []
    files = list(ANSIBLE.glob("roles/*/tasks/*.yml")) + list(ANSIBLE.glob("roles/*/handlers/*.yml"))
    for path in files:
        for cond in _when_clauses(yaml.safe_load(path.read_text())):
            for name in booleans:
                for m in re.finditer(rf"\b{name}\b", cond):
                    if not re.match(r"\s*\|\s*(default\([^)]*\)\s*\|\s*)?bool\b", cond[m.end():]):
                        bad.append(f"{path.relative_to(ANSIBLE)}: {cond!r}")
    assert not bad, "conditions without | bool:\n" + "\n".join(bad)


def test_train_env_template_round_trips_through_launch():
    from training import launch

    flags = ["--model", "vit_tiny_patch16_224", "--steps", "10", "--data", "synthetic run"]
    text = render_template("trainer", "train.env.j2", {
        "trainer_cluster_name": "c1", "trainer_nnodes": 2, "trainer_node_rank": 1,
        "trainer_rdzv_endpoint": "10.0.0.4:29500", "trainer_nproc_per_node": 8, "trainer_ckpt_dir": "/mnt/kit-disk/ckpt",
        "trainer_flags": flags, "trainer_stop_file": "/run/kit/stop", "trainer_preempted_marker": "/run/kit/preempted",
        "trainer_progress_file": "/mnt/kit-disk/progress.json", "trainer_venv": "/opt/kit/venv",
        "trainer_extra_env": {"OMP_NUM_THREADS": 1, "NCCL_SOCKET_IFNAME": "ens5"}})
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".env") as f:
        f.write(text)
        f.flush()
        env = launch.read_env_file(f.name)
    cmd = launch.build_command(env)
    assert env["PREEMPTED_MARKER"] == "/run/kit/preempted"
    assert (env["OMP_NUM_THREADS"], env["NCCL_SOCKET_IFNAME"]) == ("1", "ens5")  # trainer_extra_env, one line each
    assert cmd[0] == "/opt/kit/venv/bin/python"
    assert "--nproc-per-node=8" in cmd and "--nnodes=2" in cmd and "--node-rank=1" in cmd
    i = cmd.index("training.train")
    assert cmd[i + 1:i + 1 + len(flags)] == flags


def _spec(tmp_path, nodes=2):
    from kit.spec import load_spec

    src = (REPO / "examples" / "aws-g5-spot.yaml").read_text()
    p = tmp_path / "c.yaml"
    p.write_text(src)
    spec = load_spec(p)
    return spec.model_copy(update={"nodes": nodes})


def test_inventory_from_spec(tmp_path):
    from kit.bootstrap import inventory_from_spec
    from kit.errors import KitError
    from kit.spec import training_args

    spec = _spec(tmp_path)
    outputs = {"nodes": [
        {"name": "n0", "instance_id": "i-0", "private_ip": "10.0.0.4", "public_ip": "3.3.3.3", "disk_id": "vol-0abc",
         "zone": "us-east-1a", "market": "spot"},
        {"name": "n1", "instance_id": "i-1", "private_ip": "10.0.0.5", "public_ip": None, "disk_id": "vol-0def",
         "zone": "us-east-1a", "market": "spot"}], "zone": "us-east-1a", "market": "spot", "cluster_name": spec.name}
    inv = inventory_from_spec(spec, outputs, role_vars={"preemption_agent_watcher_url": "http://w:1"},
                              known_hosts=tmp_path / "known_hosts")
    hosts = inv["all"]["hosts"]
    assert list(hosts) == ["n0", "n1"]
    assert hosts["n0"]["ansible_host"] == "3.3.3.3" and hosts["n1"]["ansible_host"] == "10.0.0.5"
    assert hosts["n1"]["node_rank"] == 1
    assert hosts["n0"]["trainer_data_device"].endswith("vol0abc")
    v = inv["all"]["vars"]
    assert v["trainer_rdzv_endpoint"] == "10.0.0.4:29500" and v["trainer_nnodes"] == 2
    assert v["trainer_flags"] == training_args(spec)
    assert v["preemption_agent_watcher_url"] == "http://w:1"
    # the training package kit runs, wherever kit is installed (a wheel has no ../training beside
    # its playbook)
    import training

    assert v["trainer_source"] == str(Path(training.__file__).resolve().parent)
    raw = {"nodes": {"value": outputs["nodes"]}}
    assert inventory_from_spec(spec, raw, known_hosts=None)["all"]["hosts"]["n0"]["private_ip"] == "10.0.0.4"
    # what kit sets is KIT_VARS (a spec's bootstrap.vars may set none of them), and the spec's values go in
    from kit.bootstrap import KIT_VARS, ROLES

    kit_set = {k for k in v if k.startswith(tuple(f"{r}_" for r in ROLES))} | {"trainer_data_device",
                                                                               "preemption_agent_watcher_token"}
    assert kit_set == set(KIT_VARS)
    assert sorted(p.name for p in (REPO / "ansible" / "roles").iterdir()) == sorted(ROLES)
    mine = spec.model_copy(update={"bootstrap": spec.bootstrap.model_copy(update={"vars": {
        "python_env_torch_version": "2.14.1", "python_env_pip_extra_args": ["--no-index"]}})})
    got = inventory_from_spec(mine, outputs, known_hosts=None)["all"]["vars"]
    assert got["python_env_torch_version"] == "2.14.1" and got["python_env_pip_extra_args"] == ["--no-index"]
    assert got["trainer_nnodes"] == 2
    with pytest.raises(KitError):
        inventory_from_spec(spec, {"nodes": []}, known_hosts=None)
    with pytest.raises(KitError):
        inventory_from_spec(spec, {"nodes": [{"name": "x"}]}, known_hosts=None)


def test_extra_vars_parsing():
    from kit.bootstrap import parse_extra_vars
    from kit.errors import InputError

    assert parse_extra_vars(["a=1", "b=x=y"]) == {"a": 1, "b": "x=y"}
    got = parse_extra_vars(["nvidia_driver_allow_reboot=false", "python_env_install_torch=No", "x=on",
                             "nvidia_driver_branch=565", "mode=0755", "v=2.10", "e=", "s=hello world",
                             "trainer_flags=[--steps, '10']", "m={a: 1}", "n=-3"])
    assert got == {"nvidia_driver_allow_reboot": False, "python_env_install_torch": False, "x": True,
                   "nvidia_driver_branch": 565, "mode": "0755", "v": "2.10", "e": "", "s": "hello world",
                   "trainer_flags": ["--steps", "10"], "m": {"a": 1}, "n": -3}
    for bad in (["novalue"], ["=x"], ["f=[unclosed"]):
        with pytest.raises(InputError):
            parse_extra_vars(bad)


def test_cli_bad_inventory_exits_2(tmp_path):
    from typer.testing import CliRunner

    from kit.cli import app

    spec = tmp_path / "c.yaml"
    spec.write_text((REPO / "examples" / "aws-g5-spot.yaml").read_text())
    inv = tmp_path / "inv.yml"
    inv.write_text("just: text\n")
    res = CliRunner().invoke(app, ["bootstrap", str(spec), "--hosts", str(inv)])
    assert res.exit_code == 2, res.output
    res = CliRunner().invoke(app, ["bootstrap", str(spec), "--hosts", str(inv), "-e", "novalue"])
    assert res.exit_code == 2


def test_bootstrap_unreachable_host_fails(tmp_path):
    """A real ansible-runner run against an unreachable loopback port: per-host failure, not ok."""
    from kit.bootstrap import bootstrap_nodes

    inv = {"all": {"hosts": {"ghost": {"ansible_host": "127.0.0.1", "ansible_port": 9, "node_rank": 0}},
                   "vars": {"ansible_user": "root", "ansible_ssh_common_args": "-o ConnectTimeout=3"}}}
    result = bootstrap_nodes(inv, private_data_dir=tmp_path / "pdd")
    assert not result.ok
    assert "ghost" in result.failures


def test_bootstrap_leaves_kits_signal_handlers_and_ctrl_c_cancels_the_playbook(tmp_path, ctrl_c_raises):
    """ansible-runner, given no cancel callback, installs its own SIGINT and SIGTERM handlers for good: after the
    first bootstrap, Ctrl-C in `kit train --cloud ...` only set a flag nobody read. The handlers must be kit's
    after a run, and a Ctrl-C during one cancels the playbook and is raised as the KeyboardInterrupt it is."""
    import os
    import signal
    import socket
    import threading
    import time

    from kit.bootstrap import bootstrap_nodes

    def handlers():
        return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    before = handlers()
    inv = {"all": {"hosts": {"ghost": {"ansible_host": "127.0.0.1", "ansible_port": 9, "node_rank": 0}},
                   "vars": {"ansible_user": "root", "ansible_ssh_common_args": "-o ConnectTimeout=3"}}}
    assert not bootstrap_nodes(inv, private_data_dir=tmp_path / "pdd").ok
    assert handlers() == before, "the bootstrap left other signal handlers behind"

    # a host that accepts the connection and never answers: the playbook hangs until Ctrl-C
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    inv["all"]["hosts"]["ghost"]["ansible_port"] = silent.getsockname()[1]
    inv["all"]["vars"]["ansible_ssh_common_args"] = "-o ConnectTimeout=60 -o ServerAliveInterval=60"

    def ctrl_c_once_connected():
        silent.settimeout(120)
        connection, _ = silent.accept()  # ansible-playbook is running and its ssh is waiting for a banner
        # never while pytest's own handler is the one in place (that would end the test run)
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
        connection.close()

    threading.Thread(target=ctrl_c_once_connected, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        bootstrap_nodes(inv, private_data_dir=tmp_path / "pdd2")
    assert time.monotonic() - started < 30, "the playbook was not cancelled"
    assert handlers() == before
    silent.close()


def test_gcp_shutdown_script_calls_the_hook_bootstrap_installs():
    """The instance metadata shutdown-script (Terraform) and the hook (Ansible) are written in two
    places; they must agree on the hook's path and on the trainer's stop file, or a GCP preemption
    would not trigger the emergency save."""
    import re

    import yaml

    script = (REPO / "terraform" / "modules" / "gcp" / "instances" / "shutdown.sh").read_text()
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    tasks = yaml.safe_load((ANSIBLE / "roles" / "preemption_agent" / "tasks" / "main.yml").read_text())
    hook = next(t for t in tasks if "shutdown-script hook" in t.get("name", ""))
    dest = next(v["dest"] for k, v in hook.items() if isinstance(v, dict) and "dest" in v)
    assert re.search(rf'^hook={re.escape(dest)}$', script, re.MULTILINE), f"shutdown.sh does not run {dest}"
    stop_file = yaml.safe_load((ANSIBLE / "roles" / "trainer" / "defaults" / "main.yml").read_text())["trainer_stop_file"]
    assert f"touch {stop_file}" in script, f"fallback must write the trainer's stop file {stop_file}"
    # the hook writes the preempted marker only when told the VM is preempted (or it is going down)
    assert '"$hook" "$preempted"' in script


def _tasks(node):
    """Every task dict in a tasks file, blocks included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always"):
            if key in node:
                yield from _tasks(node[key])


def test_apt_waits_for_the_lock_and_torch_comes_only_from_its_index():
    """A first boot holds the dpkg lock (unattended-upgrades) for minutes: every apt task waits for it,
    and the driver role waits for cloud-init first. torch/torchvision are installed with --index-url
    (no PyPI package of the same name can take their place) and pinned as a pair."""
    import yaml

    apt_tasks = []
    for path in ANSIBLE.glob("roles/*/tasks/*.yml"):
        for task in _tasks(yaml.safe_load(path.read_text())):
            if "ansible.builtin.apt" in task:
                apt_tasks.append((path.name, task["name"], task["ansible.builtin.apt"]))
    assert len(apt_tasks) >= 6
    missing = [f"{f}: {n}" for f, n, args in apt_tasks if "lock_timeout" not in args]
    assert not missing, "apt tasks without lock_timeout: " + ", ".join(missing)
    ready = (ANSIBLE / "roles/nvidia_driver/tasks/apt-ready.yml").read_text()
    assert "cloud-init status --wait" in ready
    pip = yaml.safe_load((ANSIBLE / "roles/python_env/tasks/main.yml").read_text())
    torch = next(t for t in _tasks(pip) if t.get("name", "").startswith("Install torch"))
    args = torch["ansible.builtin.pip"]
    assert "'--index-url'" in args["extra_args"] and "extra-index-url" not in args["extra_args"]
    assert any(n.startswith("torchvision==") for n in args["name"])


RESTART_TOPICS = {"Restart kit-trainer", "Restart kit-agent", "kit training package changed"}


def test_every_restart_is_marked_on_the_node_before_its_change():
    """Handlers run at the end of the play: a bootstrap killed before them changed files and restarted
    nothing, and the next run found nothing to change. Each task that changes what a unit runs and notifies
    its restart comes after a task that leaves the restart-pending marker (which the handler removes), in
    the one directory both roles read."""
    import yaml

    pending_dir = {role: yaml.safe_load((ANSIBLE / f"roles/{role}/vars/main.yml").read_text())[f"{role}_restart_pending_dir"]
                   for role in ("trainer", "preemption_agent")}
    assert len(set(pending_dir.values())) == 1, pending_dir
    unmarked, notifying = [], 0
    for path in ANSIBLE.glob("roles/*/tasks/*.yml"):
        marked = False
        for task in _tasks(yaml.safe_load(path.read_text())):
            copy = task.get("ansible.builtin.copy") or {}
            marked = marked or "_restart_pending_dir }}/" in str(copy.get("dest", ""))
            notify = task.get("notify") or []
            if RESTART_TOPICS & set([notify] if isinstance(notify, str) else notify) and "ansible.builtin.debug" not in task:
                notifying += 1
                if not marked:
                    unmarked.append(f"{path.relative_to(ANSIBLE)}: {task['name']}")
    assert notifying >= 7 and not unmarked, f"{notifying} notifying tasks; not marked before: {unmarked}"


def test_the_playbook_runs_the_roles_in_order_each_tagged_with_its_name():
    """kit.bootstrap.bootstrap_nodes(roles=...) selects roles by these tags; an unknown one is refused before Ansible runs."""
    import yaml

    from kit.bootstrap import ROLES, bootstrap_nodes
    from kit.errors import KitError

    (play,) = yaml.safe_load((REPO / "ansible" / "site.yml").read_text())
    assert [(r["role"], r["tags"]) for r in play["roles"]] == [(r, [r]) for r in ROLES]
    with pytest.raises(KitError, match="no role driver in the playbook"):
        bootstrap_nodes({"all": {"hosts": {}}}, roles=("driver",))

"""The real playbook over SSH against 2 Debian 12 hosts (own netns + mount + PID namespace each).

Driver role: no-GPU skip path. python_env: venv without torch (``python_env_install_torch=false``;
installing a multi-GB torch wheel into every test host would take minutes, and the trainer launch and the
agent are tested directly elsewhere). A loop device is the data disk.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time

import pytest

from kit.bootstrap import host_key_vars
from kit.remote import host_key_options
from tests.support import REPO

pytestmark = [pytest.mark.slow]

NEEDS = ("debootstrap", "ip", "unshare", "losetup", "ssh", "ssh-keygen", "mkfs.ext4")
DRIVER = ("nvidia_driver",)  # the driver tests run that role alone (the playbook's other roles: the test above)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, loop devices, chroot)"
    missing = [t for t in NEEDS if shutil.which(t) is None]
    if missing:
        return f"missing tools {missing}: run scripts/install-tools.sh"
    return None




class Events:
    """(host, task, event) of one ansible-runner run."""

    def __init__(self):
        self.items: list[tuple[str, str, str]] = []

    def __call__(self, ev: dict) -> None:
        data = ev.get("event_data") or {}
        if data.get("host"):
            self.items.append((data["host"], data.get("task", ""), ev.get("event", "")))

    def ran(self, task: str) -> set[str]:
        return {h for h, t, e in self.items if t == task and e == "runner_on_ok"}

    def tasks(self) -> set[str]:
        return {t for _, t, e in self.items if e in ("runner_on_ok", "runner_on_failed")}


LAUNCH = "/opt/kit/venv/bin/python -m training.launch --env-file /etc/kit/train.env"


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_playbook_on_netns_hosts(tmp_path, monkeypatch):
    from tests.support.netns_hosts import NetnsHosts

    source = _controller_checkout(tmp_path, monkeypatch)
    t0 = time.time()
    with NetnsHosts(2, tmp_path / "hosts") as cluster:
        hosts, group_vars = _inventory(cluster, source)
        inventory = {"all": {"hosts": hosts, "vars": group_vars}}
        _check_mode_on_fresh_hosts_changes_nothing(cluster, inventory, tmp_path)
        _first_run(inventory, tmp_path)
        t1 = time.time()
        for h in cluster.hosts:
            _installed_sources_and_units(cluster, h, source, tmp_path)
            _data_disk_and_preemption_marker(cluster, h)
        _second_run_and_check_mode_change_nothing(cluster, inventory, tmp_path)
        _remount_keeps_the_disk_and_a_dropped_module_goes(cluster, inventory, source, tmp_path)
        _a_finished_run_is_not_started_again(cluster, cluster.hosts[0])
        _bad_flags_and_extra_env_fail(cluster, hosts, group_vars, tmp_path)
        # kit train's final export: the cloud backend copies the newest complete checkpoint over SSH
        fetch_final_checkpoint(cluster, tmp_path, monkeypatch)
        _a_host_with_another_key_is_refused(cluster, inventory, tmp_path, monkeypatch)
        print(f"first run {t1 - t0:.1f}s (incl. host start), total {time.time() - t0:.1f}s")


def _controller_checkout(tmp_path, monkeypatch):
    """A controller checkout as a developer has it: bytecode written (no PYTHONDONTWRITEBYTECODE), a
    __pycache__ in training/, and a module that is removed from the package later."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    source = tmp_path / "training"
    shutil.copytree(REPO / "training", source, ignore=shutil.ignore_patterns("__pycache__"))
    (source / "obsolete.py").write_text("# dropped from the package before the third run\n")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(source)], check=True)
    assert any((source / "__pycache__").iterdir())
    return source


def _inventory(cluster, source):
    """(hosts, group vars) of the two netns hosts."""
    hosts = {h.name: {"ansible_host": h.ip, "node_rank": h.index, "private_ip": h.ip,
                      "instance_id": f"i-{h.index}", "trainer_data_device": h.loop}
             for h in cluster.hosts}
    group_vars = {
        "ansible_user": "root", "ansible_ssh_private_key_file": str(cluster.key),
        "trainer_cluster_name": "itest", "trainer_nnodes": 2,
        "trainer_rdzv_endpoint": f"{cluster.hosts[0].ip}:29500",
        "trainer_flags": ["--model", "vit_tiny_patch16_224", "--steps", 20],
        "trainer_source": str(source),
        # strings, as an inventory or `ansible-playbook -e` give them: the roles must test them with | bool
        "python_env_install_torch": "false", "nvidia_driver_force": "false", "nvidia_driver_allow_reboot": "no",
        "python_env_apt_update": False,  # the hosts have no Debian mirror
        "preemption_agent_cloud": "gcp",
        "preemption_agent_watcher_url": f"http://{cluster.hosts[0].gateway}:8080", "preemption_agent_watcher_token": "tok",
        **host_key_vars(cluster.known_hosts)}  # Ansible checks each host's key against the pinned ones
    return hosts, group_vars


def _check_mode_on_fresh_hosts_changes_nothing(cluster, inventory, tmp_path):
    """--check on fresh hosts: must work (no venv, no unit, no filesystem yet) and change nothing."""
    from kit.bootstrap import bootstrap_nodes

    dry0 = bootstrap_nodes(inventory, check=True, private_data_dir=tmp_path / "dry0")
    assert dry0.ok, dry0.failures
    for h in cluster.hosts:
        assert cluster.ssh(h, f"blkid -p {h.loop}", check=False).returncode == 2, "check mode formatted the disk"
        for path in ("/etc/kit/train.env", "/opt/kit/venv", "/opt/kit/src/training", "/etc/kit/watcher-token"):
            assert cluster.ssh(h, f"test -e {path}", check=False).returncode != 0, f"check mode created {path}"
        assert "/mnt/kit-disk" not in cluster.ssh(h, "cat /etc/fstab", check=False).stdout


def _first_run(inventory, tmp_path):
    from kit.bootstrap import bootstrap_nodes

    events = Events()
    first = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run1", on_event=events)
    assert first.ok, first.failures
    assert set(first.stats) == {"node0", "node1"}
    assert all(s.get("changed", 0) > 0 for s in first.stats.values())
    # the driver role took its no-GPU skip path (and nvidia_driver_force "false" did not force it)
    assert events.ran("Skip the driver (no NVIDIA device on this host)") == {"node0", "node1"}
    assert "Install the driver (common steps)" not in events.tasks()
    assert "Refresh the apt cache" not in events.tasks()


def _installed_sources_and_units(cluster, h, source, tmp_path):
    env = cluster.ssh(h, "cat /etc/kit/train.env").stdout
    assert f"NODE_RANK={h.index}" in env and "NNODES=2" in env
    assert f"RDZV_ENDPOINT={cluster.hosts[0].ip}:29500" in env
    assert 'TRAIN_FLAGS="--model vit_tiny_patch16_224 --steps 20"' in env
    assert "PREEMPTED_MARKER=/run/kit/preempted" in env
    # only sources were installed: no controller bytecode, the node's Python writes its own
    installed = cluster.ssh(h, "cd /opt/kit/src/training && find . -type f -not -path './__pycache__/*' | sort")
    assert installed.stdout.split() == sorted(f"./{p.name}" for p in source.glob("*.py")), installed.stdout
    # (bootstrap's `training.launch --status` imported a few modules; the agent was never imported)
    pycache = cluster.ssh(h, "ls /opt/kit/src/training/__pycache__").stdout.split()
    assert any(p.startswith("launch.") for p in pycache) and not any(p.startswith("agent.") for p in pycache)
    assert any(p.name.startswith("agent.") for p in (source / "__pycache__").iterdir())
    cmd = cluster.ssh(h, "/opt/kit/venv/bin/python -m training.launch --print").stdout
    assert "torch.distributed.run" in cmd and f"--node-rank={h.index}" in cmd
    assert cluster.ssh(h, "ls /opt/kit/src/training/__pycache__").stdout.strip(), "bytecode written on the node"
    unit = cluster.ssh(h, "cat /etc/systemd/system/kit-trainer.service").stdout
    assert "Restart=on-failure" in unit and "RestartForceExitStatus=75" in unit
    assert "RequiresMountsFor=/mnt/kit-disk" in unit
    agent = cluster.ssh(h, "cat /etc/systemd/system/kit-agent.service").stdout
    assert f"--node-rank {h.index}" in agent and "--cloud gcp" in agent
    assert "--marker-file /run/kit/preempted" in agent
    assert cluster.ssh(h, "stat -c %a /etc/kit/watcher-token").stdout.strip() == "600"
    assert cluster.ssh(h, "test -x /opt/kit/bin/kit-gcp-shutdown-hook", check=False).returncode == 0
    _units_verify(cluster, h, tmp_path)


def _units_verify(cluster, h, tmp_path):
    """Static check of the installed units with the controller's systemd-analyze."""
    if not shutil.which("systemd-analyze"):
        return
    unit_dir = tmp_path / f"units-{h.name}"
    unit_dir.mkdir()
    for name in ("kit-trainer.service", "kit-agent.service"):
        (unit_dir / name).write_text(cluster.ssh(h, f"cat /etc/systemd/system/{name}").stdout
                                     .replace("/opt/kit/venv/bin/python", shutil.which("python3")))
        proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_dir / name)],
                              check=False, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr


def _data_disk_and_preemption_marker(cluster, h):
    # the data disk: formatted once, mounted by UUID, a file written there must survive re-runs
    assert cluster.ssh(h, f"blkid -o value -s TYPE {h.loop}").stdout.strip() == "ext4"
    assert cluster.ssh(h, "findmnt -n -o SOURCE /mnt/kit-disk").stdout.strip() == h.loop
    uuid = cluster.ssh(h, f"blkid -p -o value -s UUID {h.loop}").stdout.strip()
    fstab = [line.split() for line in cluster.ssh(h, "cat /etc/fstab").stdout.splitlines()]
    assert [f"UUID={uuid}", "/mnt/kit-disk", "ext4", "defaults,nofail", "0", "2"] in fstab
    cluster.ssh(h, "mkdir -p /mnt/kit-disk/ckpt && echo precious > /mnt/kit-disk/ckpt/step-10.pt && sync")
    # training.launch on the node: the preemption marker keeps torchrun from starting (exit 75)
    assert cluster.ssh(h, f"{LAUNCH} --status").stdout.strip() == "pending"
    cluster.ssh(h, "mkdir -p /run/kit && echo '{}' > /run/kit/preempted && echo x > /run/kit/stop")
    proc = cluster.ssh(h, LAUNCH, check=False)
    assert proc.returncode == 75 and "being preempted" in proc.stderr, proc.stderr
    assert cluster.ssh(h, "test -e /run/kit/stop", check=False).returncode != 0
    cluster.ssh(h, "rm /run/kit/preempted")


def _second_run_and_check_mode_change_nothing(cluster, inventory, tmp_path):
    from kit.bootstrap import bootstrap_nodes

    second = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run2")
    assert second.ok, second.failures
    assert {h: s.get("changed", 0) for h, s in second.stats.items()} == {"node0": 0, "node1": 0}
    for h in cluster.hosts:
        assert cluster.ssh(h, "cat /mnt/kit-disk/ckpt/step-10.pt").stdout == "precious\n"
    dry = bootstrap_nodes(inventory, check=True, private_data_dir=tmp_path / "dry")
    assert dry.ok, dry.failures
    assert {h: s.get("changed", 0) for h, s in dry.stats.items()} == {"node0": 0, "node1": 0}


def _remount_keeps_the_disk_and_a_dropped_module_goes(cluster, inventory, source, tmp_path):
    """After a reboot-like remount the role mounts the existing filesystem and never reformats it; a module
    dropped from the package is removed from the node."""
    from kit.bootstrap import bootstrap_nodes

    (source / "obsolete.py").unlink()
    h = cluster.hosts[1]
    cluster.ssh(h, "umount /mnt/kit-disk")
    third = bootstrap_nodes(inventory, limit="node1", private_data_dir=tmp_path / "run3")
    assert third.ok, third.failures
    assert cluster.ssh(h, "cat /mnt/kit-disk/ckpt/step-10.pt").stdout == "precious\n"
    assert cluster.ssh(h, "test -e /opt/kit/src/training/obsolete.py", check=False).returncode != 0
    assert cluster.ssh(cluster.hosts[0], "test -e /opt/kit/src/training/obsolete.py").returncode == 0


def _a_finished_run_is_not_started_again(cluster, h):
    """training.launch reports a finished run and does not start torchrun again (exit 0)."""
    cluster.ssh(h, """echo '{"step": 20, "total_steps": 20, "state": "done", "time": 5}' > /mnt/kit-disk/progress.json""")
    assert cluster.ssh(h, f"{LAUNCH} --status").stdout.strip() == "finished"
    proc = cluster.ssh(h, LAUNCH, check=False)
    assert proc.returncode == 0 and "already finished" in proc.stderr, proc.stderr
    cluster.ssh(h, "rm /mnt/kit-disk/progress.json")


def _bad_flags_and_extra_env_fail(cluster, hosts, group_vars, tmp_path):
    """Bad training flags fail the bootstrap with training.train's own message (and launch exits 2, which the
    unit does not restart); on node1, in the same run, an extra environment entry that would replace one of
    train.env's own is refused before train.env is written."""
    from kit.bootstrap import bootstrap_nodes

    bad_hosts = {**hosts, "node1": {**hosts["node1"], "trainer_extra_env": {"NNODES": 8}}}
    bad = {"all": {"hosts": bad_hosts, "vars": {**group_vars, "trainer_flags": ["--steps", "0"]}}}
    fourth = bootstrap_nodes(bad, private_data_dir=tmp_path / "run4")
    assert not fourth.ok
    assert any("--steps must be >= 1" in m for m in fourth.failures.get("node0", [])), fourth.failures
    assert any("trainer_extra_env" in m for m in fourth.failures.get("node1", [])), fourth.failures
    assert "NNODES=2" in cluster.ssh(cluster.hosts[1], "cat /etc/kit/train.env").stdout


def _publish(monkeypatch, published):
    """The cloud's API (kit.clouds' host_keys) answers ``published(address)`` for a node."""
    from kit import clouds

    monkeypatch.setattr(type(clouds.get("gcp")), "host_keys",
                        lambda self, spec, node: published(node.public_ip or node.private_ip))


def _a_host_with_another_key_is_refused(cluster, inventory, tmp_path, monkeypatch):
    """What a host in the path posing as a node meets: the keys pinned for each address are the other
    host's. Ansible reaches neither (so no token and no code goes out), and kit's own ssh refuses too."""
    import copy

    from kit.backends.base import Node
    from kit.backends.cloud import TerraformBackend
    from kit.bootstrap import bootstrap_nodes
    from kit.errors import KitError
    from kit.remote import KnownHosts
    from tests.support.watch import cloud_spec

    a, b = cluster.hosts
    swapped = {a.ip: b.host_keys, b.ip: a.host_keys}
    KnownHosts(tmp_path / "swapped").pin({a.ip: "i-0", b.ip: "i-1"}, swapped.__getitem__, timeout=0, source="test")
    wrong = copy.deepcopy(inventory)
    # its own ControlPath: the earlier runs' master connections (ControlPersist) would carry it unchecked
    wrong["all"]["vars"].update(host_key_vars(tmp_path / "swapped"), ansible_control_path_dir=str(tmp_path / "cp"))
    result = bootstrap_nodes(wrong, private_data_dir=tmp_path / "swapped-run")
    assert not result.ok and sorted(result.failures) == [a.name, b.name], result.failures
    assert all("host key" in " ".join(m).lower() for m in result.failures.values()), result.failures
    _publish(monkeypatch, swapped.__getitem__)
    spec = cloud_spec("gcp", ssh={"user": "root", "public_key": f"{cluster.key}.pub", "allowed_cidrs": ["198.18.0.0/15"]})
    backend = TerraformBackend(spec, tmp_path / "deploy-swapped")
    with pytest.raises(KitError, match="copying|cannot list"):
        backend.checkpoint_dir(Node(name=b.name, instance_id="i-1", rank=1, public_ip=b.ip), tmp_path / "s3")


def fetch_final_checkpoint(cluster, tmp_path, monkeypatch):
    from kit.backends.base import Node
    from kit.backends.cloud import TerraformBackend
    from tests.support.trainer import write_final_checkpoint
    from tests.support.watch import cloud_spec
    from training.export import export

    _publish(monkeypatch, cluster.published)

    h = cluster.hosts[1]
    sha = write_final_checkpoint(tmp_path / "final", 30)
    write_final_checkpoint(tmp_path / "final", 20)  # an older one next to it: the newest is fetched
    tar = subprocess.run(["tar", "-C", str(tmp_path / "final"), "-cf", "-", "."], capture_output=True, check=True)
    cluster.ssh(h, "mkdir -p /mnt/kit-disk/ckpt/.tmp-step-00000040-1")  # a save that never finished: ignored
    subprocess.run(["ssh", "-i", str(cluster.key), *host_key_options(cluster.known_hosts),
                    f"root@{h.ip}", "tar -C /mnt/kit-disk/ckpt -xf -"], input=tar.stdout, check=True, timeout=60)
    spec = cloud_spec("gcp", ssh={"user": "root", "public_key": f"{cluster.key}.pub",
                                  "allowed_cidrs": ["198.18.0.0/15"]})
    backend = TerraformBackend(spec, tmp_path / "deploy")
    node = Node(name=h.name, instance_id="i-1", rank=1, public_ip=h.ip)
    fetched = backend.checkpoint_dir(node, tmp_path / "scratch")
    assert sorted(p.name for p in fetched.iterdir()) == ["step-00000030"]
    assert (tmp_path / "deploy" / "known_hosts").read_text().startswith(f"{h.ip} "), "pinned as it was fetched"
    assert export(fetched, tmp_path / "export", step=30, params_sha256=sha)["params_sha256"] == sha
    assert cluster.ssh(h, "ls /mnt/kit-disk/ckpt").stdout.split() == ["step-00000020", "step-00000030", "step-10.pt"]
    cluster.ssh(h, "rm -rf /mnt/kit-disk/ckpt/step-00000030/COMPLETE")  # incomplete now: the older one is fetched
    assert sorted(p.name for p in backend.checkpoint_dir(node, tmp_path / "s2").iterdir()) == ["step-00000020"]
    # kit train follows the job by reading the progress file over SSH (no inbound path to the watcher needed)
    backend.nodes = lambda: [node, Node(name="gone", instance_id="i-9", rank=0, public_ip="127.0.0.1")]
    assert backend.progress() is None, "no progress file yet"
    cluster.ssh(h, """echo '{"step": 30, "total_steps": 30, "state": "done", "time": 5}' > /mnt/kit-disk/progress.json""")
    assert backend.progress()["state"] == "done"


@pytest.mark.skipif(_skip_reason() is not None or shutil.which("dpkg-deb") is None,
                    reason=_skip_reason() or "dpkg-deb not installed")
def test_driver_role_on_a_fake_gpu_stack(tmp_path):
    """The driver install path on a host with stand-ins for the NVIDIA stack (tests/support/nvidia.py): apt
    repositories over HTTP, nvidia-smi, modprobe and systemctl. Fabricmanager pinned to the driver's
    version (a newer one is offered) and started, persistence mode really on (the packaged unit says
    --no-persistence-mode), "reboot required" when an older module is loaded and rebooting is not allowed."""
    from tests.support import nvidia as fake_nvidia
    from tests.support.netns_hosts import NetnsHosts

    www = tmp_path / "www"
    www.mkdir()
    with NetnsHosts(1, tmp_path / "hosts") as cluster:
        h = cluster.hosts[0]
        with _served(www, h.gateway) as base:
            kernel = cluster.ssh(h, "uname -r").stdout.strip()
            fake_nvidia.build_repos(www, kernel, base)
            fake_nvidia.install_tools(h.root, f"{base}/debian")
            inventory = _driver_inventory(cluster, h, base)
            state = h.root / "var/lib/fake-nvidia"
            _an_older_module_loaded_asks_for_a_reboot(cluster, h, inventory, state, tmp_path)
            _after_the_reboot_the_driver_runs(cluster, h, inventory, state, tmp_path)
            _an_image_driver_is_kept_with_fabricmanager(cluster, h, inventory, state, tmp_path)


@contextlib.contextmanager
def _served(www, address):
    """``www`` over HTTP on ``address`` (the host's gateway: reachable from its namespace); yields the base URL."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer((address, 0), functools.partial(Quiet, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _driver_inventory(cluster, h, base):
    return {"all": {"hosts": {h.name: {"ansible_host": h.ip, "node_rank": 0, "private_ip": h.ip}},
                    "vars": {"ansible_user": "root", "ansible_ssh_private_key_file": str(cluster.key),
                             **host_key_vars(cluster.known_hosts),
                             "trainer_rdzv_endpoint": f"{h.ip}:29500",
                             "nvidia_driver_force": True,  # no NVIDIA PCI device here
                             "nvidia_driver_fabricmanager": "true",  # no NVSwitch either
                             "nvidia_driver_allow_reboot": "false",
                             "nvidia_driver_cuda_repo_base": f"{base}/cuda-keyring",
                             "nvidia_driver_fabric_timeout": 10,
                             "nvidia_driver_apt_cache_valid_time": 0,  # the rootfs' lists are recent
                             "python_env_install_torch": False, "python_env_apt_update": False}}}


def _an_older_module_loaded_asks_for_a_reboot(cluster, h, inventory, state, tmp_path):
    """An older module is loaded: modprobe succeeds, nvidia-smi reports a version mismatch."""
    from kit.bootstrap import bootstrap_nodes
    from tests.support import nvidia as fake_nvidia

    (state / "loaded").write_text("560.35.03")
    first = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run1", roles=DRIVER)
    assert not first.ok
    msgs = " ".join(first.failures.get(h.name, []))
    assert "reboot required" in msgs and "version mismatch" in msgs, first.failures
    fm = cluster.ssh(h, "dpkg-query -W -f='${Version}' nvidia-fabricmanager-570").stdout
    assert fm == f"{fake_nvidia.DRIVER}-1", f"fabricmanager {fm} does not match driver {fake_nvidia.DRIVER}"
    held = cluster.ssh(h, "dpkg --get-selections cuda-drivers-570 nvidia-fabricmanager-570").stdout.split()
    assert held == ["cuda-drivers-570", "hold", "nvidia-fabricmanager-570", "hold"], held
    assert cluster.ssh(h, "cat /etc/modprobe.d/blacklist-nouveau.conf").stdout.startswith("blacklist nouveau")


def _after_the_reboot_the_driver_runs(cluster, h, inventory, state, tmp_path):
    from kit.bootstrap import bootstrap_nodes

    (state / "loaded").unlink()  # the reboot the role asked for
    second = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run2", roles=DRIVER)
    assert second.ok, second.failures
    assert (state / "fabricmanager-running").exists(), "fabricmanager installed but never started"
    pm = cluster.ssh(h, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout.strip()
    assert pm == "Enabled"
    assert "Completed" in cluster.ssh(h, "nvidia-smi -q").stdout
    third = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run3", roles=DRIVER)
    assert third.ok, third.failures
    assert third.stats[h.name].get("changed", 0) == 0


def _an_image_driver_is_kept_with_fabricmanager(cluster, h, inventory, state, tmp_path):
    """A working driver the image brought (GCP's accelerator images, the AWS DLAMI) is kept, but on an
    NVSwitch system fabricmanager is still installed for it, pinned, started and checked; a driver outside
    the pinned branch is reported."""
    from kit.bootstrap import bootstrap_nodes
    from tests.support import nvidia as fake_nvidia

    cluster.ssh(h, "systemctl stop nvidia-fabricmanager && apt-mark unhold nvidia-fabricmanager-570 >/dev/null && "
                   "DEBIAN_FRONTEND=noninteractive apt-get -y -q purge nvidia-fabricmanager-570 >/dev/null")
    assert not (state / "fabricmanager-running").exists()
    messages: list[str] = []

    def debug_messages(event: dict) -> None:
        res = (event.get("event_data") or {}).get("res") or {}
        if event.get("event") == "runner_on_ok" and isinstance(res.get("msg"), str):
            messages.append(res["msg"])

    inventory["all"]["vars"]["nvidia_driver_branch"] = "580"
    fourth = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run4", on_event=debug_messages, roles=DRIVER)
    assert fourth.ok, fourth.failures
    fm = cluster.ssh(h, "dpkg-query -W -f='${Version}' nvidia-fabricmanager-570").stdout
    assert fm == f"{fake_nvidia.DRIVER}-1", f"fabricmanager {fm} does not match the running driver"
    assert (state / "fabricmanager-running").exists(), "fabricmanager not started next to a working driver"
    assert any(f"running driver {fake_nvidia.DRIVER} is not of the pinned branch 580" in m
               for m in messages), messages
    assert "cuda-drivers-580" not in cluster.ssh(h, "dpkg -l").stdout, "a working driver is not replaced"

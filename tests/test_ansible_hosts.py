"""The real playbook over SSH against 2 Debian 12 hosts (own netns + mount + PID namespace each).

Driver role: no-GPU skip path. python_env: venv without torch (``python_env_install_torch=false``;
installing a multi-GB torch wheel into every test host would take minutes, and the trainer launch and the
agent are tested directly elsewhere). A loop device is the data disk.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

pytestmark = [pytest.mark.slow]

NEEDS = ("debootstrap", "ip", "unshare", "losetup", "ssh", "ssh-keygen", "mkfs.ext4")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, loop devices, chroot)"
    missing = [t for t in NEEDS if shutil.which(t) is None]
    if missing:
        return f"missing tools {missing}: run scripts/install-tools.sh"
    return None


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_playbook_on_netns_hosts(tmp_path):
    from netns_hosts import NetnsHosts

    from kit.bootstrap import bootstrap_nodes

    t0 = time.time()
    with NetnsHosts(2, tmp_path / "hosts") as cluster:
        hosts = {h.name: {"ansible_host": h.ip, "node_rank": h.index, "private_ip": h.ip,
                          "instance_id": f"i-{h.index}", "trainer_data_device": h.loop}
                 for h in cluster.hosts}
        inventory = {"all": {"hosts": hosts, "vars": {
            "ansible_user": "root", "ansible_ssh_private_key_file": str(cluster.key),
            "trainer_cluster_name": "itest", "trainer_nnodes": 2,
            "trainer_rdzv_endpoint": f"{cluster.hosts[0].ip}:29500",
            "trainer_flags": ["--model", "vit_tiny_patch16_224", "--steps", "20"],
            "python_env_install_torch": False, "preemption_agent_cloud": "gcp",
            "preemption_agent_watcher_url": "http://198.18.1.1:8080", "preemption_agent_watcher_token": "tok"}}}
        first = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run1")
        assert first.ok, first.failures
        assert set(first.stats) == {"node0", "node1"}
        assert all(s.get("changed", 0) > 0 for s in first.stats.values())
        t1 = time.time()

        for h in cluster.hosts:
            env = cluster.ssh(h, "cat /etc/kit/train.env").stdout
            assert f"NODE_RANK={h.index}" in env and "NNODES=2" in env
            assert f"RDZV_ENDPOINT={cluster.hosts[0].ip}:29500" in env
            assert 'TRAIN_FLAGS="--model vit_tiny_patch16_224 --steps 20"' in env
            cmd = cluster.ssh(h, "/opt/kit/venv/bin/python -m training.launch --print").stdout
            assert "torch.distributed.run" in cmd and f"--node-rank={h.index}" in cmd
            unit = cluster.ssh(h, "cat /etc/systemd/system/kit-trainer.service").stdout
            assert "Restart=on-failure" in unit and "RestartForceExitStatus=75" in unit
            agent = cluster.ssh(h, "cat /etc/systemd/system/kit-agent.service").stdout
            assert f"--node-rank {h.index}" in agent and "--cloud gcp" in agent
            assert cluster.ssh(h, "stat -c %a /etc/kit/watcher-token").stdout.strip() == "600"
            assert cluster.ssh(h, "test -x /opt/kit/bin/kit-gcp-shutdown-hook", check=False).returncode == 0
            # static check of the installed units with the controller's systemd-analyze
            if shutil.which("systemd-analyze"):
                unit_dir = tmp_path / f"units-{h.name}"
                unit_dir.mkdir()
                for name in ("kit-trainer.service", "kit-agent.service"):
                    (unit_dir / name).write_text(cluster.ssh(h, f"cat /etc/systemd/system/{name}").stdout
                                                 .replace("/opt/kit/venv/bin/python", shutil.which("python3")))
                    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_dir / name)],
                                          check=False, capture_output=True, text=True, timeout=60)
                    assert proc.returncode == 0, proc.stderr
            # the data disk: formatted once, mounted, a file written there must survive re-runs
            assert cluster.ssh(h, f"blkid -o value -s TYPE {h.loop}").stdout.strip() == "ext4"
            assert cluster.ssh(h, "findmnt -n -o SOURCE /mnt/kit-disk").stdout.strip() == h.loop
            cluster.ssh(h, "mkdir -p /mnt/kit-disk/ckpt && echo precious > /mnt/kit-disk/ckpt/step-10.pt && sync")

        second = bootstrap_nodes(inventory, private_data_dir=tmp_path / "run2")
        assert second.ok, second.failures
        assert {h: s.get("changed", 0) for h, s in second.stats.items()} == {"node0": 0, "node1": 0}
        for h in cluster.hosts:
            assert cluster.ssh(h, "cat /mnt/kit-disk/ckpt/step-10.pt").stdout == "precious\n"
        dry = bootstrap_nodes(inventory, check=True, private_data_dir=tmp_path / "dry")
        assert dry.ok, dry.failures
        assert {h: s.get("changed", 0) for h, s in dry.stats.items()} == {"node0": 0, "node1": 0}

        # after a reboot-like remount the role mounts the existing filesystem and never reformats it
        h = cluster.hosts[1]
        cluster.ssh(h, "umount /mnt/kit-disk")
        third = bootstrap_nodes(inventory, limit="node1", private_data_dir=tmp_path / "run3")
        assert third.ok, third.failures
        assert cluster.ssh(h, "cat /mnt/kit-disk/ckpt/step-10.pt").stdout == "precious\n"

        # kit train's final export: the cloud backend copies the newest complete checkpoint over SSH
        fetch_final_checkpoint(cluster, tmp_path)
        print(f"first run {t1 - t0:.1f}s (incl. host start), total {time.time() - t0:.1f}s")


def fetch_final_checkpoint(cluster, tmp_path):
    from types import SimpleNamespace

    from trainer_helpers import write_final_checkpoint

    from kit.backends.base import Node
    from kit.backends.cloud import TerraformBackend
    from training.export import export

    h = cluster.hosts[1]
    sha = write_final_checkpoint(tmp_path / "final", 30)
    write_final_checkpoint(tmp_path / "final", 20)  # an older one next to it: the newest is fetched
    tar = subprocess.run(["tar", "-C", str(tmp_path / "final"), "-cf", "-", "."], capture_output=True, check=True)
    cluster.ssh(h, "mkdir -p /mnt/kit-disk/ckpt/.tmp-step-00000040-1")  # a save that never finished: ignored
    subprocess.run(["ssh", "-i", str(cluster.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                    f"root@{h.ip}", "tar -C /mnt/kit-disk/ckpt -xf -"], input=tar.stdout, check=True, timeout=60)
    spec = SimpleNamespace(cloud="gcp", ssh=SimpleNamespace(user="root", public_key=f"{cluster.key}.pub"),
                           training=SimpleNamespace(ckpt_dir="/mnt/kit-disk/ckpt"))
    backend = TerraformBackend(spec, tmp_path / "deploy")
    node = Node(name=h.name, instance_id="i-1", rank=1, public_ip=h.ip)
    fetched = backend.checkpoint_dir(node, tmp_path / "scratch")
    assert sorted(p.name for p in fetched.iterdir()) == ["step-00000030"]
    assert export(fetched, tmp_path / "export", step=30, params_sha256=sha)["params_sha256"] == sha
    assert cluster.ssh(h, "ls /mnt/kit-disk/ckpt").stdout.split() == ["step-00000020", "step-00000030", "step-10.pt"]
    cluster.ssh(h, "rm -rf /mnt/kit-disk/ckpt/step-00000030/COMPLETE")  # incomplete now: the older one is fetched
    assert sorted(p.name for p in backend.checkpoint_dir(node, tmp_path / "s2").iterdir()) == ["step-00000020"]
    # kit train follows the job by reading the progress file over SSH (no inbound path to the watcher needed)
    backend.nodes = lambda: [node, Node(name="gone", instance_id="i-9", rank=0, public_ip="127.0.0.1")]
    assert backend.progress() is None, "no progress file yet"
    cluster.ssh(h, """echo '{"step": 30, "total_steps": 30, "state": "done", "time": 5}' > /mnt/kit-disk/progress.json""")
    assert backend.progress()["state"] == "done"

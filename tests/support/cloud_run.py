"""What the end-to-end runs of `kit train` on a cloud stand-in share (tests/integration/test_train_aws.py,
test_train_gcp.py): the training they run, the image's package pins, the undisturbed reference, and
what they read back from the hosts and the ledger."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

# the undisturbed runs' digests of this test run (its xdist processes share PYTEST_XDIST_TESTRUNUID), by what
# they depend on (_inputs_key)
REFERENCES = Path(tempfile.gettempdir()) / "kit-test-references" / os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
NEEDS = ("debootstrap", "ip", "unshare", "nsenter", "losetup", "ssh", "ssh-keygen", "mkfs.ext4")
STEPS, CKPT_EVERY = 120, 30
CLUSTER = "e2e"  # the spec's name (write_spec): kit deploys it to deploy/<name>
TRAINING = {"model": "vit_tiny_patch16_224", "image_size": 32, "num_classes": 10, "batch_size": 8, "steps": STEPS,
            "warmup_steps": 10, "ckpt_every": CKPT_EVERY, "keep": 2, "log_every": 5, "device": "cpu",
            "deterministic": True}


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, loop devices, chroot)"
    missing = [t for t in NEEDS if shutil.which(t) is None]
    return f"missing tools {missing}: run scripts/install-tools.sh" if missing else None


def image_versions() -> dict[str, str]:
    """The roles' package pins set to what the image (this machine's packages) has: found present, not installed."""
    v = importlib.metadata.version
    return {"python_env_torch_version": v("torch"), "python_env_torchvision_version": v("torchvision"),
            "python_env_timm_version": v("timm"), "python_env_pydantic_version": v("pydantic"),
            "python_env_apt_update": False,  # the hosts have no Debian mirror (their packages are installed)
            # one thread per rank, as the undisturbed reference (torchrun sets it there): CPU kernels split their
            # reductions by thread count, so a run on 2 threads has other digests
            "trainer_extra_env": {"OMP_NUM_THREADS": 1}}


def write_spec(tmp_path: Path, example: str, **fields) -> Path:
    """``examples/<example>.yaml`` on this machine's terms, as ``tmp_path/cluster.yaml``: one place (its zone and
    shape), 2 nodes, SSH as root with a key of its own (``tmp_path/key``) from the test range, local state, the
    tiny model for some hundred steps on the CPU with the image's package pins, a 48-h deadline; ``fields``: the
    cloud's own (its network, disk, ...)."""
    import yaml

    from tests.support import REPO
    from tests.support.files import one_place

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    spec = one_place(yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text()))
    spec.update(name=CLUSTER, nodes=2, backend={"type": "local"}, training=TRAINING, bootstrap={"vars": image_versions()},
                ssh={"user": "root", "public_key": str(tmp_path / "key.pub"), "allowed_cidrs": ["198.18.0.0/15"]},
                **fields)
    spec["policy"]["deadline_hours"] = 48
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def deploy_dir(tmp_path: Path) -> Path:
    """Where `kit train` of ``write_spec``'s spec keeps its deployment (KIT_DEPLOY_ROOT is tmp_path/deploy)."""
    return tmp_path / "deploy" / CLUSTER


def undisturbed_digest(tmp_path: Path) -> str:
    """The same training flags on 2 ranks here, never stopped. Both clouds' runs train alike, so the digest is
    computed once for the flags, the training code and torch, under a lock every test process shares (the
    second run waits for the first's digest instead of training again beside it)."""
    from kit.spec import load_spec, training_args
    from tests.support.netns_hosts import cache_lock
    from tests.support.trainer import Run, command, digest

    args = training_args(load_spec(tmp_path / "cluster.yaml"))
    at = args.index("--ckpt-dir")
    cached = REFERENCES / f"{_inputs_key(args[:at] + args[at + 2:])}.sha256"
    with cache_lock("undisturbed-reference"):
        if cached.is_file():
            return cached.read_text().strip()
        args[at + 1] = str(tmp_path / "reference-ckpt")
        run = Run(command(2, args))
        assert run.finish(600) == 0, run.output
        sha = digest(run.output)
        REFERENCES.mkdir(parents=True, exist_ok=True)
        cached.write_text(sha + "\n")
        return sha


def _inputs_key(args: list[str]) -> str:
    """What the digest depends on: the flags, the training package's sources and the packages' versions."""
    from tests.support import REPO

    v = importlib.metadata.version
    h = hashlib.sha256(json.dumps([args, v("torch"), v("torchvision"), v("timm"), v("numpy")]).encode())
    for path in sorted((REPO / "training").rglob("*.py")):
        h.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:32]


def progress_step(hosts, key: Path, known_hosts: Path) -> int:
    """The trainer's step, read on the first host that answers (the progress file on its data disk), with
    the host keys kit pinned (kit pins them before it bootstraps: no trainer runs before they exist)."""
    from kit.remote import host_key_options

    for host in list(hosts.hosts.values()):
        proc = subprocess.run(["ssh", "-i", str(key), *host_key_options(known_hosts),
                               "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=2", f"root@{host.address}",
                               "cat /mnt/kit-disk/progress.json"], capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode == 0:
            try:
                return int(json.loads(proc.stdout).get("step") or 0)
            except ValueError:
                continue
    return 0


def ledger_events(deploy: Path) -> tuple[list[dict], float]:
    """The ledger's events, and when the trainer first reported the last step."""
    from tests.support.watch import ledger_of

    with ledger_of(deploy) as ledger:
        return ledger.events(), min(t for t, step in ledger.progress_history() if step == STEPS)


def head_instance(deploy: Path) -> str:
    """The instance of rank 0: the rendezvous endpoint, whose loss changes every node's train.env."""
    from tests.support.watch import ledger_of

    with ledger_of(deploy) as ledger:
        return next(n.instance_id for n in ledger.all_nodes() if n.rank == 0)


def start_kit_train(tmp_path: Path, spec: Path, hosts, cloud_env: dict[str, str]) -> subprocess.Popen:
    """`kit train SPEC` as a user runs it, with the emulator's mirror and ``cloud_env`` (what points Terraform's
    provider and kit's own clients at the cloud's stand-in); the agents post to the bridge's address."""
    from kit.backends.local import free_port
    from tests.support.tf_emulator import write_cli_config

    env = {**os.environ, **cloud_env, "TF_CLI_CONFIG_FILE": str(write_cli_config(tmp_path / "emulator")),
           "KIT_DEPLOY_ROOT": str(tmp_path / "deploy")}
    with open(tmp_path / "kit-train.log", "w") as log:
        return subprocess.Popen([str(Path(sys.executable).with_name("kit")), "train", str(spec),
                                 "--listen", f"{hosts.gateway}:{free_port()}", "--json-report", str(tmp_path / "report.json"),
                                 "--interval", "5"],  # polls every 5 s, not 15: the same path, sooner
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def head_past_a_checkpoint(tmp_path: Path, kit: subprocess.Popen, hosts):
    """Once the job is past its first checkpoint: the host of the head (rank 0), the rendezvous endpoint."""
    hosts.wait_for(2, timeout=300)
    deadline = time.time() + 600
    while progress_step(hosts, tmp_path / "key", deploy_dir(tmp_path) / "known_hosts") < CKPT_EVERY + 10:
        assert kit.poll() is None and time.time() < deadline, (tmp_path / "kit-train.log").read_text()
        time.sleep(2)
    head = head_instance(deploy_dir(tmp_path))
    return next(h for h in list(hosts.hosts.values()) if h.id == head)


def train_through_a_loss(tmp_path: Path, hosts, start: Callable[[], subprocess.Popen],
                         lose: Callable[[subprocess.Popen], object]) -> tuple[dict, object]:
    """`kit train` (``start``) with the undisturbed reference computed beside it (mostly while kit waits on the
    hosts); ``lose`` takes a node away once training is under way. The run must end with every step, the
    reference's digest, the export verified and the data disks deleted. Returns its report and what ``lose``
    returned."""
    reference: dict[str, str] = {}
    ref = threading.Thread(target=lambda: reference.update(sha=undisturbed_digest(tmp_path)), daemon=True)
    ref.start()
    kit = start()
    try:
        lost = lose(kit)
        rc = kit.wait(timeout=900)
    finally:
        if kit.poll() is None:
            kit.kill()
    output = (tmp_path / "kit-train.log").read_text()
    assert rc == 0 and not hosts.errors, (output, hosts.errors)
    report = json.loads((tmp_path / "report.json").read_text())
    ref.join(600)
    assert report["params_sha256"] == reference["sha"], output
    # one node lost once: one interruption of the job (the agent's notice and the cloud's report of it are one)
    assert report["preemptions"] == report["interruptions"] == 1 and report["steps"] == STEPS, report
    assert report["export"] and report["disks"] == "deleted", report
    return report, lost

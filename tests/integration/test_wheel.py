"""kit as a user gets it: the wheel, installed into a fresh venv, run from an empty directory.

The fresh venv reuses the dependencies already in ``.venv`` (a ``.pth`` line puts its site-packages
on ``sys.path``; its own ``.pth`` files, the editable kit among them, are not processed), so only
kit itself comes from the wheel. A ``sitecustomize`` audit hook in that venv runs in every Python
process started from it (kit, torchrun and its trainers, ansible-playbook) and refuses, and logs,
any file opened, listed or used as a working directory inside this checkout other than ``.venv/``
and ``.tools/``: a kit that still read ``templates/``, ``examples/`` or the traces from the
checkout fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support import REPO

pytestmark = pytest.mark.slow

AUDIT_HOOK = '''
import os, sys

_ROOT = os.environ.get("KIT_TEST_FORBIDDEN_ROOT", "")
_ALLOWED = tuple(p for p in os.environ.get("KIT_TEST_ALLOWED", "").split(os.pathsep) if p)
_LOG = os.environ.get("KIT_TEST_READ_LOG", "")
_EVENTS = {"open": 0, "os.listdir": 0, "os.scandir": 0, "os.chdir": 0, "subprocess.Popen": 2}
_busy = False


def _hook(event, args):
    global _busy
    index = _EVENTS.get(event)
    if index is None or _busy or not _ROOT or len(args) <= index:
        return
    path = args[index]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return
    path = os.path.abspath(os.fsdecode(path))
    if not (path == _ROOT or path.startswith(_ROOT + os.sep)) or path.startswith(_ALLOWED):
        return
    _busy = True
    try:
        with open(_LOG, "a") as log:
            log.write(f"{os.getpid()} {event} {path} argv={sys.argv!r}\\n")
    finally:
        _busy = False
    raise PermissionError(f"read from the kit checkout: {path}")


if _ROOT:
    sys.addaudithook(_hook)
'''


def console_scripts(bindir: Path, python: Path, dists: tuple[str, ...]) -> None:
    """The console scripts of dependencies, pointed at the fresh venv's Python, as pip writes them
    when it installs those dependencies into a venv (``ansible-playbook`` for ``kit bootstrap``)."""
    from importlib.metadata import distribution

    for dist in dists:
        for ep in distribution(dist).entry_points:
            if ep.group != "console_scripts":
                continue
            module, _, attr = ep.value.partition(":")
            script = bindir / ep.name
            script.write_text(f"#!{python}\nimport sys\nfrom {module} import {attr.split('.')[0]}\n"
                              f"sys.exit({attr}())\n")
            script.chmod(0o755)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), str(REPO)], capture_output=True, text=True, check=False, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    return next(dist.glob("kit_spot-*.whl"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel) -> dict:
    base = tmp_path_factory.mktemp("wheel")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "kit-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                              str(wheel)], capture_output=True, text=True, check=False, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    console_scripts(venv / "bin", python, ("ansible-core",))
    (site / "sitecustomize.py").write_text(AUDIT_HOOK)
    work = base / "empty-cwd"
    work.mkdir()
    log = base / "checkout-reads.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIT_", "PYTHON", "VIRTUAL_ENV"))}
    from tests.support import make_home

    env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "COLUMNS": "160",
                "HOME": str(make_home(base / "home")),  # the examples' ~/.ssh/id_ed25519.pub
                "KIT_TEST_FORBIDDEN_ROOT": str(REPO), "KIT_TEST_READ_LOG": str(log),
                "KIT_TEST_ALLOWED": os.pathsep.join(str(REPO / d) + os.sep for d in (".venv", ".tools"))})
    return {"wheel": wheel, "venv": venv, "python": python, "cwd": work, "env": env, "log": log}


def kit(installed: dict, *args: str, timeout: float = 300, stdout=None) -> subprocess.CompletedProcess:
    installed["log"].unlink(missing_ok=True)  # each command is judged on its own reads
    proc = subprocess.run([str(installed["venv"] / "bin" / "kit"), *args], cwd=installed["cwd"], env=installed["env"],
                          stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                          check=False)
    reads = installed["log"].read_text() if installed["log"].exists() else ""
    assert not reads, f"kit {' '.join(args)} read from the checkout:\n{reads}"
    return proc


def test_wheel_carries_exactly_the_tracked_files(wheel):
    """The build backend maps the top-level folders into the wheel (no copies in the repository):
    every tracked file of kit/, training/, templates/, terraform/modules/, ansible/ and examples/ is
    in it, at its mapped place, and nothing else is (no __pycache__, no stray state)."""
    names = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    tracked = subprocess.run(["git", "ls-files", "kit", "training", "templates", "terraform/modules", "ansible",
                              "examples"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    mapped = {"templates/": "kit/_resources/templates/", "terraform/modules/": "kit/_resources/terraform/modules/",
              "ansible/": "kit/_resources/ansible/", "examples/": "kit/_resources/examples/"}
    expected = set()
    for name in tracked:
        for source, target in mapped.items():
            if name.startswith(source):
                name = target + name[len(source):]
                break
        expected.add(name)
    assert names == expected, (sorted(names - expected)[:20], sorted(expected - names)[:20])
    for needed in ("kit/data/spot-traces/gcp-a3-h100-2025-10/us-central1-c.json",
                   "kit/data/spot-traces/skynomad-gcp-h100/LICENSE", "kit/data/spot-traces/skynomad-gcp-h100/NOTICE",
                   "kit/data/provider-schemas/aws/resource/aws_instance.json",
                   "kit/_resources/ansible/site.yml", "kit/_resources/examples/local.yaml"):
        assert needed in names


def test_installed_kit_is_the_wheel(installed):
    proc = subprocess.run([str(installed["python"]), "-c", ("import kit, training, kit.paths as p; "
                           "print(kit.__file__); print(training.__file__); print(p.RESOURCES_DIR)")],
                          cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, check=True)
    for line in proc.stdout.split():
        assert line.startswith(str(installed["venv"])), proc.stdout


def test_the_audit_hook_catches_a_read_from_the_checkout(installed):
    """The guard itself can fail: a read of the checkout's README is refused and logged."""
    proc = subprocess.run([str(installed["python"]), "-c", f"open({str(REPO / 'README.md')!r}).read()"],
                          cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "read from the kit checkout" in proc.stderr
    assert str(REPO / "README.md") in installed["log"].read_text()
    installed["log"].unlink()


def test_examples_validate_and_render_for_both_clouds(installed):
    listing = kit(installed, "example")
    assert listing.returncode == 0 and "gcp-a3-spot" in listing.stdout, listing.stderr
    for name in ("aws-g5-spot", "gcp-a3-spot"):
        spec = installed["cwd"] / f"{name}.yaml"
        with spec.open("w") as out:
            assert kit(installed, "example", name, stdout=out).returncode == 0
        checked = kit(installed, "validate", spec.name)
        assert checked.returncode == 0, checked.stderr
        rendered = kit(installed, "render", spec.name)
        assert rendered.returncode == 0, rendered.stderr
        cluster = yaml.safe_load(spec.read_text())["name"]
        deploy = installed["cwd"] / "deploy" / cluster
        # the GCP example can move: its disks root is the one of its zone and shape (kit.render.roots)
        disks = "disks" if name.startswith("aws") else "disks-us-central1-a-8xa3-highgpu-1g"
        assert (deploy / "cluster" / "main.tf").is_file() and (deploy / disks / "main.tf").is_file()
        cloud = "aws" if name.startswith("aws") else "gcp"
        assert (deploy / "modules" / cloud / "instances" / "main.tf").is_file()
        assert f"Generated by kit from {spec.name}" in (deploy / "cluster" / "main.tf").read_text()


def test_traces_list_and_simulate_a_bundled_set(installed):
    listed = kit(installed, "traces", "--json")
    assert listed.returncode == 0, listed.stderr
    sets = {s["name"]: s for s in json.loads(listed.stdout)}
    assert len(sets["gcp-a3-h100-2025-10"]["zones"]) == 13
    run = kit(installed, "simulate", "gcp-a3-h100-2025-10", "--policy", "up,opt", "--starts", "1", "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["runs"] == 13 and summary["cost_vs_on_demand"]["opt"] <= summary["cost_vs_on_demand"]["up"]


def test_bootstrap_runs_the_installed_playbook(installed):
    """The roles resolve from the wheel (a missing role fails while the playbook loads, before any
    connection); the one host is an unreachable loopback port, so the run stops there."""
    spec = installed["cwd"] / "aws.yaml"
    with spec.open("w") as out:
        kit(installed, "example", "aws-g5-spot", stdout=out)
    inventory = installed["cwd"] / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"ghost": {"ansible_host": "127.0.0.1", "ansible_port": 9,
                                                                     "node_rank": 0}},
                                                 "vars": {"ansible_user": "root",
                                                          "ansible_ssh_common_args": "-o ConnectTimeout=3"}}}))
    proc = kit(installed, "bootstrap", spec.name, "--hosts", inventory.name)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "unreachable" in output and "ghost" in output, output[-3000:]
    assert "was not found" not in output and "could not be found" not in output, output[-3000:]


def test_train_from_an_empty_directory_then_again(installed):
    spec = installed["cwd"] / "tiny.yaml"
    with spec.open("w") as out:
        kit(installed, "example", "local", stdout=out)
    data = yaml.safe_load(spec.read_text())
    data["name"] = "tiny"
    data["training"].update(steps=30, ckpt_every=10)
    spec.write_text(yaml.safe_dump(data))
    run = kit(installed, "train", spec.name, "--no-preemptions", "--json-report", "r.json", timeout=400)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    report = json.loads((installed["cwd"] / "r.json").read_text())
    assert report["steps"] == report["total_steps"] == 30 and report["params_sha256"]
    export = installed["cwd"] / "deploy" / "tiny" / "export" / "step-00000030"
    assert report["export"] == str(export) and (export / "model.pt").is_file()
    again = kit(installed, "train", spec.name, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "already finished" in again.stdout and "damaged" not in again.stdout + again.stderr
    assert report["params_sha256"][:16] in again.stdout
    fresh = kit(installed, "train", spec.name, "--fresh", "--no-preemptions", "--json-report", "f.json", timeout=400)
    assert fresh.returncode == 0, (fresh.stdout[-3000:], fresh.stderr[-3000:])
    assert json.loads((installed["cwd"] / "f.json").read_text())["params_sha256"] == report["params_sha256"]
    previous = list((installed["cwd"] / "deploy" / "tiny" / "previous").glob("*/export/step-00000030/model.pt"))
    assert len(previous) == 1, "the finished run's export is kept aside, not overwritten or called damaged"

"""A fake NVIDIA stack for the nvidia_driver role on a netns test host (no GPU, no systemd there).

* ``build_repos(root, kernel)``: two flat apt repositories of empty packages (built with ``dpkg-deb``),
  served over HTTP by the test: ``debian/`` plays the distribution mirror (``linux-headers-<kernel>``),
  ``cuda/`` plays NVIDIA's CUDA repository (``cuda-drivers-570`` at driver 570.133.20, and
  ``nvidia-fabricmanager-570`` at 570.124.06, 570.133.20 and a newer 570.144, so that only an explicit
  pin gets the driver's version). ``cuda-keyring`` (under ``cuda-keyring/<os>/<arch>/``, like NVIDIA's URL
  layout) adds the CUDA repository to apt's sources, as the real one does.
* ``install_tools(host_root)``: ``nvidia-smi``, ``modprobe`` and ``systemctl`` stand-ins in
  ``/usr/local/{bin,sbin}`` of the host, with their state in ``/var/lib/fake-nvidia``:
  - ``modprobe nvidia`` loads the installed driver version, unless an older module is already loaded;
  - ``nvidia-smi`` fails without a loaded module, reports "Driver/library version mismatch" when the loaded
    module is not the installed driver, shows persistence mode and the NVSwitch fabric state;
  - ``systemctl`` knows ``nvidia-persistenced`` (when the driver is installed; its packaged ExecStart has
    ``--no-persistence-mode``, as Ubuntu's does, and drop-ins count only after ``daemon-reload``) and
    ``nvidia-fabricmanager`` (when installed; it refuses to start unless its version equals the loaded
    driver's, as the real one does; once started the fabric state is "Completed").
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

DRIVER = "570.133.20"
FM_VERSIONS = ("570.124.06-1", f"{DRIVER}-1", "570.144-1")

NVIDIA_SMI = r'''#!/usr/bin/python3
import os, subprocess, sys
S = "/var/lib/fake-nvidia"
def installed():
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "cuda-drivers-570"], capture_output=True, text=True)
    return r.stdout.split("-")[0] if r.returncode == 0 and r.stdout else None
def flag(name):
    return os.path.exists(os.path.join(S, name))
loaded = open(os.path.join(S, "loaded")).read().strip() if flag("loaded") else None
if loaded is None:
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."); sys.exit(9)
if loaded != installed():
    print("Failed to initialize NVML: Driver/library version mismatch"); print("NVML library version: 570.133"); sys.exit(18)
args = sys.argv[1:]
if args == ["-L"]:
    print("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-1111-2222-3333-444444444444)")
elif args[:1] == ["--query-gpu=driver_version"]:
    print(loaded)
elif args[:1] == ["--query-gpu=persistence_mode"]:
    print("Enabled" if flag("persistence") else "Disabled")
elif args == ["-q"]:
    state = "Completed" if flag("fabricmanager-running") else "In Progress"
    print("==============NVSMI LOG==============\n\nDriver Version                            : %s\n"
          "Attached GPUs                             : 1\nGPU 00000000:04:00.0\n"
          "    Product Name                          : NVIDIA H100 80GB HBM3\n"
          "    Persistence Mode                      : %s\n"
          "    Fabric\n        State                             : %s\n"
          "        Status                            : %s\n        CliqueId                          : 0\n"
          "    Accounting Mode                       : Disabled\n"
          % (loaded, "Enabled" if flag("persistence") else "Disabled", state,
             "Success" if state == "Completed" else "N/A"))
else:
    print("| NVIDIA-SMI %s    Driver Version: %s    CUDA Version: 12.8 |" % (loaded, loaded))
'''

MODPROBE = r'''#!/usr/bin/python3
import os, subprocess, sys
S = "/var/lib/fake-nvidia"
if sys.argv[1:] != ["nvidia"]:
    sys.exit(subprocess.call(["/usr/sbin/modprobe", *sys.argv[1:]]))
if os.path.exists(os.path.join(S, "loaded")):
    sys.exit(0)  # a module is loaded already (maybe an older one): modprobe succeeds and changes nothing
r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "cuda-drivers-570"], capture_output=True, text=True)
if r.returncode != 0 or not r.stdout:
    print("modprobe: FATAL: Module nvidia not found", file=sys.stderr); sys.exit(1)
open(os.path.join(S, "loaded"), "w").write(r.stdout.split("-")[0])
'''

SYSTEMCTL = r'''#!/usr/bin/python3
import glob, json, os, subprocess, sys
S = "/var/lib/fake-nvidia"
DB = os.path.join(S, "systemd.json")
db = json.load(open(DB)) if os.path.exists(DB) else {"enabled": [], "active": [], "dropins": {}}
def save():
    json.dump(db, open(DB, "w"))
def version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Version}", pkg], capture_output=True, text=True)
    # Status-Abbrev: selection (i, or h when held), then the state (i = installed)
    return r.stdout.split()[1] if r.returncode == 0 and r.stdout[1:2] == "i" else None
UNITS = {"nvidia-persistenced": "cuda-drivers-570", "nvidia-fabricmanager": "nvidia-fabricmanager-570"}
def known(unit):
    unit = unit.removesuffix(".service")
    return unit in UNITS and version(UNITS[unit]) is not None, unit
def exec_start(unit):
    cmd = "/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose"
    for line in db["dropins"].get(unit, []):
        if line.startswith("ExecStart="):
            cmd = line[len("ExecStart="):]
    return cmd
def start(unit):
    if unit == "nvidia-persistenced":
        if os.path.exists(os.path.join(S, "loaded")) and "--no-persistence-mode" not in exec_start(unit):
            open(os.path.join(S, "persistence"), "w").close()
    if unit == "nvidia-fabricmanager":
        loaded = open(os.path.join(S, "loaded")).read().strip() if os.path.exists(os.path.join(S, "loaded")) else None
        if loaded is None or version("nvidia-fabricmanager-570").split("-")[0] != loaded:
            print("Job for nvidia-fabricmanager.service failed (fabric manager version does not match the driver)",
                  file=sys.stderr)
            sys.exit(1)
        open(os.path.join(S, "fabricmanager-running"), "w").close()
    if unit not in db["active"]:
        db["active"].append(unit)
args = [a for a in sys.argv[1:] if not a.startswith("-")]
cmd, units = args[0], [u.strip("'") for u in args[1:]]
if cmd == "daemon-reload":
    db["dropins"] = {}
    for path in sorted(glob.glob("/etc/systemd/system/*.service.d/*.conf")):
        unit = os.path.basename(os.path.dirname(path))[:-len(".service.d")]
        db["dropins"].setdefault(unit, []).extend(l.strip() for l in open(path) if l.strip())
    save(); sys.exit(0)
found, unit = known(units[0]) if units else (False, "")
if cmd == "show":
    if not found:
        print("LoadState=not-found\nActiveState=inactive"); sys.exit(0)
    print("Id=%s.service\nLoadState=loaded\nActiveState=%s\nUnitFileState=%s" % (
        unit, "active" if unit in db["active"] else "inactive", "enabled" if unit in db["enabled"] else "disabled"))
    sys.exit(0)
if not found:
    print("Unit %s.service not found." % unit, file=sys.stderr); sys.exit(5 if cmd != "is-enabled" else 1)
if cmd == "is-enabled":
    print("enabled" if unit in db["enabled"] else "disabled"); sys.exit(0 if unit in db["enabled"] else 1)
if cmd == "is-active":
    print("active" if unit in db["active"] else "inactive"); sys.exit(0 if unit in db["active"] else 3)
if cmd == "enable":
    db["enabled"].append(unit)
elif cmd == "start":
    start(unit)
elif cmd == "stop":  # as a package's prerm does before it is removed
    db["active"] = [u for u in db["active"] if u != unit]
    for f in ("persistence",) if unit == "nvidia-persistenced" else ("fabricmanager-running",):
        if os.path.exists(os.path.join(S, f)):
            os.unlink(os.path.join(S, f))
elif cmd == "restart":
    db["active"] = [u for u in db["active"] if u != unit]
    for f in ("persistence",) if unit == "nvidia-persistenced" else ("fabricmanager-running",):
        if os.path.exists(os.path.join(S, f)):
            os.unlink(os.path.join(S, f))
    start(unit)
else:
    print("fake systemctl: unsupported %s" % cmd, file=sys.stderr); sys.exit(1)
save()
'''


def _deb(out: Path, name: str, version: str, arch: str = "amd64", files: dict[str, str] | None = None) -> Path:
    build = out / f"build-{name}-{version}"
    (build / "DEBIAN").mkdir(parents=True)
    (build / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: kit tests <kit@example.invalid>\n"
        f"Description: fake {name} for kit's nvidia_driver role test\n")
    for rel, text in (files or {}).items():
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        (build / rel).write_text(text)
    deb = out / f"{name}_{version}_{arch}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(build), str(deb)],
                   check=True, capture_output=True)
    return deb


def _flat_repo(repo: Path, debs: list[Path]) -> None:
    """Packages + Release of a flat repository (``deb [trusted=yes] URL ./``)."""
    entries = []
    for deb in debs:
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        data = deb.read_bytes()
        entries.append(control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    packages = "\n".join(entries)
    (repo / "Packages").write_text(packages)
    digest = hashlib.sha256(packages.encode()).hexdigest()
    (repo / "Release").write_text(f"Origin: kit-test\nLabel: kit-test\nSHA256:\n {digest} {len(packages.encode())} Packages\n")


def build_repos(root: Path, kernel: str, base_url: str) -> None:
    """``root/debian`` (the "mirror"), ``root/cuda`` (the CUDA repo) and the keyring deb under
    ``root/cuda-keyring/debian12/x86_64/`` (the role's ``nvidia_driver_cuda_repo_base`` = ``base_url/cuda-keyring``)."""
    work = root / "build"
    work.mkdir(parents=True)
    debian, cuda = root / "debian", root / "cuda"
    debian.mkdir()
    cuda.mkdir()
    headers = _deb(work, f"linux-headers-{kernel}", "1.0")
    headers.rename(debian / headers.name)
    _flat_repo(debian, [debian / headers.name])
    debs = [_deb(work, "cuda-drivers-570", f"{DRIVER}-1")] + [_deb(work, "nvidia-fabricmanager-570", v)
                                                               for v in FM_VERSIONS]
    for deb in debs:
        deb.rename(cuda / deb.name)
    _flat_repo(cuda, [cuda / d.name for d in debs])
    keyring_dir = root / "cuda-keyring" / "debian12" / "x86_64"
    keyring_dir.mkdir(parents=True)
    keyring = _deb(work, "cuda-keyring", "1.1-1", arch="all", files={
        "etc/apt/sources.list.d/cuda-debian12-x86_64.list": f"deb [trusted=yes] {base_url}/cuda ./\n"})
    keyring.rename(keyring_dir / "cuda-keyring_1.1-1_all.deb")


def install_tools(host_root: Path, mirror_url: str) -> None:
    """The stand-ins, their state directory, and apt sources that name only the fake mirror."""
    for rel, text in (("usr/local/bin/nvidia-smi", NVIDIA_SMI), ("usr/local/sbin/modprobe", MODPROBE),
                      ("usr/local/bin/systemctl", SYSTEMCTL)):
        path = host_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    (host_root / "var/lib/fake-nvidia").mkdir(parents=True, exist_ok=True)
    (host_root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] {mirror_url} ./\n")
    for extra in (host_root / "etc/apt/sources.list.d").glob("*"):
        extra.unlink()

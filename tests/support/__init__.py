"""What the tests share: the repository's root, the test SSH key, fakes of the clouds' APIs and of
the parts kit drives (``watch``, ``gcp_api``, ``nvidia``), real SSH hosts in network namespaces
(``netns_hosts``), trainer helpers (``trainer``) and the scripts tests run as child processes
(``ckpt_harness``, ``watch_crash_child``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The public key the examples' ~/.ssh/id_ed25519.pub stands for in tests and golden files: kit puts
# the key's content into the rendered tfvars, so rendering needs one (not a real key).
TEST_PUBLIC_KEY = REPO / "tests" / "golden" / "id_ed25519.pub"


def make_home(base: Path) -> Path:
    """A home directory holding the test key as ~/.ssh/id_ed25519.pub."""
    (base / ".ssh").mkdir(parents=True, exist_ok=True)
    shutil.copy(TEST_PUBLIC_KEY, base / ".ssh" / "id_ed25519.pub")
    return base


def overlay_skip_reason(overlaid: str) -> str | None:
    """Why a test that runs a role on this host, its writes to ``overlaid`` kept in overlays of a private
    mount namespace, cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return f"needs root (a private mount namespace with overlays of {overlaid})"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    return None


def overlay_mounts(tmp_path: Path, overlaid: tuple[str, ...]) -> list[str]:
    """The mount commands (run inside a private mount namespace) that keep writes to ``overlaid`` in
    ``tmp_path/upper-*``: a role run on this host changes nothing outside the test."""
    mounts = []
    for path in overlaid:
        upper, work = tmp_path / f"upper{path.replace('/', '-')}", tmp_path / f"work{path.replace('/', '-')}"
        upper.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        mounts.append(f"mount -t overlay overlay -o lowerdir={path},upperdir={upper},workdir={work} {path}")
    return mounts

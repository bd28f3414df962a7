"""`kit plan` / `kit apply` of the GCP example, as a user runs them, with real Terraform core and the
provider emulator installed from a filesystem mirror (tests/support/tf_emulator). The plans are
core's; the emulator answers as the provider does (docs/infrastructure.md, "Real plans")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tf_emulator import write_cli_config
from tests.support.tf_emulator.server import GONE_ENV

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def example(name: str, tmp_path: Path, monkeypatch) -> Path:
    """An example with a local state backend and a key of its own, and the emulator's mirror."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    text = (ROOT / "examples" / name).read_text()
    text = re.sub(r"public_key:.*", f"public_key: {tmp_path / 'key.pub'}", text)
    text = re.sub(r"backend:\n(  .*\n)+", "backend:\n  type: local\n", text)
    spec = tmp_path / "cluster.yaml"
    spec.write_text(text)
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(write_cli_config(tmp_path / "emulator")))
    monkeypatch.chdir(tmp_path)
    return spec


@pytest.fixture
def gcp(tmp_path, monkeypatch):
    return example("gcp-a3-spot.yaml", tmp_path, monkeypatch)


@pytest.fixture
def aws(tmp_path, monkeypatch):
    return example("aws-g5-spot.yaml", tmp_path, monkeypatch)


def kit(*args: str, ok: bool = True) -> str:
    proc = subprocess.run([str(Path(sys.executable).with_name("kit")), *args], capture_output=True, text=True,
                          timeout=600, check=False)
    if ok:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def changes(out: str) -> list[str]:
    """The per-resource lines of `kit plan` (symbol, root, address)."""
    return [" ".join(line.split()) for line in out.splitlines() if re.match(r"^\s*[-+~/]+\s+(disks|cluster)\s", line)]


def set_spec(spec: Path, **fields: str) -> None:
    text = spec.read_text()
    for key, value in fields.items():
        text = re.sub(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.MULTILINE)
    spec.write_text(text)


def test_first_deployment_then_no_changes_then_one_node_lost(gcp, tmp_path, monkeypatch):
    first = changes(kit("plan", str(gcp)))
    assert len(first) == 15 and all(c.startswith("+ ") for c in first)
    assert sum("google_compute_disk.this" in c for c in first) == 4
    assert sum("google_compute_instance.node" in c for c in first) == 4
    assert any("google_compute_resource_policy" in c for c in first)
    kit("apply", str(gcp))
    assert "Plan: 0 to add, 0 to change, 0 to destroy." in kit("plan", str(gcp))
    # node 2 was preempted and GCP deleted it: only it is created again, under the same policy
    (tmp_path / "gone.txt").write_text("a3-spot-node-2\n")
    monkeypatch.setenv(GONE_ENV, str(tmp_path / "gone.txt"))
    assert changes(kit("plan", str(gcp))) == ["+ cluster module.instances.google_compute_instance.node[2]"]


def test_fewer_nodes_would_destroy_disks_and_is_refused(gcp):
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    set_spec(gcp, nodes="2")
    out = kit("plan", str(gcp), ok=False)
    assert "prevent_destroy" in out and "google_compute_disk.this[3]" in out


def test_market_switch_replaces_the_instances_and_touches_no_disk(gcp):
    set_spec(gcp, instance_type="a3-highgpu-8g", market="spot", nodes="2", placement="none")
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    for market in ("on-demand", "spot"):
        set_spec(gcp, market=market)
        lines = changes(kit("plan", str(gcp)))
        replaced = [c for c in lines if "google_compute_instance.node" in c]
        assert len(replaced) == 2 and all(c.startswith(("-/+", "+/-")) for c in replaced), lines
        assert not [c for c in lines if "google_compute_disk" in c], lines
        kit("apply", str(gcp))


def test_aws_first_deployment_and_market_switch_both_ways(aws):
    first = changes(kit("plan", str(aws)))
    assert len(first) == 20 and all(c.startswith("+ ") for c in first)
    out = kit("apply", str(aws))
    assert out.count("(spot)") == 4, out  # the market each instance really runs on (instance_lifecycle)
    for market in ("on-demand", "spot"):
        set_spec(aws, market=market)
        lines = changes(kit("plan", str(aws)))
        replaced = [c for c in lines if "aws_instance.node" in c]
        assert len(replaced) == 4 and all(c.startswith("-/+") for c in replaced), lines
        assert not [c for c in lines if "aws_ebs_volume" in c], lines
        out = kit("apply", str(aws))
        assert out.count(f"({market})") == 4, out


def test_destroy_keeps_the_disks_unless_with_disks(gcp, tmp_path):
    """`kit destroy` removes the cluster only; `--with-disks` goes through the disks' prevent_destroy
    (lifted for that run by an override file, which is gone afterwards) and removes them too."""
    kit("plan", str(gcp))
    kit("apply", str(gcp))
    kit("destroy", str(gcp))
    state = json.loads(terraform_state(tmp_path, "disks"))
    assert sum(r["type"] == "google_compute_disk" for r in state.get("resources", [])) == 1  # counted resource
    assert not json.loads(terraform_state(tmp_path, "cluster")).get("resources")
    kit("destroy", str(gcp), "--with-disks")
    assert not json.loads(terraform_state(tmp_path, "disks")).get("resources")
    assert not list((tmp_path / "deploy").rglob("*_override.tf"))


def terraform_state(tmp_path: Path, root: str) -> str:
    return next((tmp_path / "deploy").glob(f"*/{root}/terraform.tfstate")).read_text()


def test_the_markdown_summary_of_a_real_plan_lists_every_address_and_replacement(aws):
    kit("plan", str(aws))
    kit("apply", str(aws))
    set_spec(aws, market="on-demand")
    md = kit("plan", str(aws), "--format", "markdown")
    for i in range(4):
        assert (f"| replace | cluster | `module.instances.aws_instance.node[{i}]` | "
                "forced by lifecycle.replace_triggered_by |") in md, md
        assert f"| replace | cluster | `module.instances.aws_volume_attachment.data[{i}]` | forced by instance_id |" in md
    assert "**Plan: 8 to add, 1 to change, 8 to destroy.**" in md
    assert "now $2.60/h (4 spot), after $6.50/h (4 on-demand)" in md, md

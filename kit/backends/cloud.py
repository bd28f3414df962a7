"""AWS and GCP through Terraform (kit.render / kit.terraform) and Ansible (kit.bootstrap).

The clouds differ only in their Terraform modules and in which error texts mean "no capacity"
(``kit.clouds.<cloud>``); everything here is shared. Other parts' modules are imported at
the point of use so the watcher does not pull Terraform or Ansible in until it acts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from kit.backends.base import Backend, CapacityError, Node
from kit.errors import KitError
from training.contract import PROGRESS_FILE

log = logging.getLogger("kit.backends.cloud")

if TYPE_CHECKING:
    from kit.spec import CloudSpec, SpecBase


def output_nodes(outputs: dict) -> list[Node]:
    """The nodes of a deployment's ``terraform output`` (``nodes``), in rank order."""
    items = outputs.get("nodes") or []
    if isinstance(items, dict) and "value" in items:  # raw `terraform output -json` shape
        items = items["value"]
    return [Node.from_output(item, rank) for rank, item in enumerate(items)]


class TerraformBackend(Backend):
    def __init__(self, spec: CloudSpec, deploy_dir: Path, *, watcher_url: str | None = None, watcher_token: str | None = None):
        self.spec: SpecBase = spec
        self.cloud = spec.cloud
        self.instance_type = spec.instance_type  # what a market switch never changes
        self.deploy_dir = Path(deploy_dir)
        self.watcher_url = watcher_url
        self.watcher_token = watcher_token

    def apply(self, spec: SpecBase, market: str) -> list[Node]:
        from kit import render, terraform
        from kit.spec import check_ssh_key

        check_ssh_key(spec)
        zones = {n.zone for n in self.nodes() if n.zone}  # where it runs before this apply (one output read)
        self._leave_region(spec)
        self.spec = spec
        render.render(spec, self.deploy_dir, market=market)  # a switch: market lines; a move: another disks root
        roots = render.roots(spec)
        try:
            # Plan afresh: a tfplan saved by an earlier `kit plan` may be for the other market.
            # kit.terraform refuses any disks plan that would lose a disk.
            summary = terraform.plan(self.deploy_dir, roots=roots)
            move = summary.move_line(min(zones) if zones else None, getattr(spec, "zone", ""),
                                     bucket=spec.checkpoint_bucket is not None)
            if move:
                log.warning("%s", move)
            terraform.apply(self.deploy_dir, parallelism=spec.nodes, roots=roots)
        except KitError as error:
            if spec.cloud_facts.is_capacity_error(str(error)):
                # a limit the user can raise (a quota) is said before Terraform's message, which may be cut short
                hint = spec.cloud_facts.capacity_hint(spec, str(error))
                raise CapacityError(f"no {market} capacity for {spec.nodes} x {self.instance_type}"
                                    f"{f' ({hint})' if hint else ''}: {error.what}",
                                    where=str(self.deploy_dir), fix="kit watch retries with backoff") from error
            raise
        return self.nodes()

    def _leave_region(self, spec: SpecBase) -> None:
        """A move to another region: the cluster root's provider is configured for one region, so it is
        destroyed in the old region first (its instances would otherwise be orphaned there); the disks
        stay, in their own roots. Whether it holds another region's instances is read from its state
        (``terraform.applied_elsewhere``), not its outputs: an apply or a destroy that failed half way
        leaves instances in the state and no outputs. A destroy that fails raises before anything is
        rendered for the new region, so the next try destroys again."""
        from kit import terraform

        if terraform.applied_elsewhere(self.deploy_dir, getattr(spec, "region", None)):
            terraform.destroy(self.deploy_dir, with_disks=False)

    def nodes(self) -> list[Node]:
        from kit import terraform

        if not self.deploy_dir.is_dir():
            return []
        try:
            outputs = terraform.output(self.deploy_dir)
        except KitError:
            return []  # not applied yet: no state, no outputs
        return output_nodes(outputs)

    def known_hosts(self, nodes: list[Node], *, timeout: float | None = None) -> Path | None:
        """The file of ``nodes``' host keys as the cloud's API published them (kit.remote.KnownHosts),
        waiting up to ``timeout`` (default: a boot's) for a fresh node's; None when the spec opted out
        (``ssh.verify_host_keys: false``). The file then holds these nodes only."""
        from kit import remote

        if not self.spec.ssh.verify_host_keys:
            return None
        cloud, spec = self.spec.cloud_facts, self.spec
        by_address = {node.address: node for node in nodes if node.address}
        known = remote.KnownHosts(self.deploy_dir / remote.KNOWN_HOSTS_FILE)
        known.pin({address: node.instance_id for address, node in by_address.items()},
                  lambda address: cloud.host_keys(spec, by_address[address]),
                  timeout=remote.SSH_BOOT_TIMEOUT_S if timeout is None else timeout, source=cloud.host_key_source)
        return known.path

    def bootstrap(self, nodes: list[Node]) -> None:
        from kit import bootstrap, remote, terraform
        from kit.watch.server import node_token

        secret = self.watcher_token if self.watcher_url else None  # the cluster's: never sent to a node
        role_vars = {"preemption_agent_watcher_url": self.watcher_url} if secret else {}
        outputs = terraform.output(self.deploy_dir)
        inventory = bootstrap.inventory_from_spec(self.spec, outputs, role_vars=role_vars,
                                                  known_hosts=self.known_hosts(output_nodes(outputs)))
        if secret:
            # each host its own token, for the instance its agent reports as: a host var, which wins over the
            # group's (https://docs.ansible.com/ansible/latest/inventory_guide/intro_inventory.html)
            for host in inventory["all"]["hosts"].values():
                host["preemption_agent_watcher_token"] = node_token(secret, host["instance_id"])
        remote.wait_for_ssh([host["ansible_host"] for host in inventory["all"]["hosts"].values()])
        result = bootstrap.bootstrap_nodes(inventory)
        if not result.ok:
            # each node's first failed task: what the watcher's log and the ledger keep of it
            firsts = "; ".join(f"{host}: {messages[0]}" for host, messages in sorted(result.failures.items()))
            raise KitError(f"bootstrap failed on {len(result.failures) or 'some'} node(s): {firsts or 'no task output'}",
                           where=str(self.deploy_dir), fix="fix what the failed task says; kit watch retries")

    def progress(self) -> dict | None:
        """``cat`` of every node's progress file over SSH (the watcher's endpoint is often not
        reachable from the cloud; the agents' heartbeats, when they arrive, say the same). This runs on
        the watch loop's thread, so the nodes are read in parallel within one deadline
        (kit.remote.PROGRESS_PULL_S): a node that has not answered by then (preempted but still in
        Terraform's outputs, cut off by a firewall) is skipped for this pull."""
        import json

        from kit import bootstrap, remote

        records, nodes = [], self.nodes()
        try:  # a node whose keys are not published yet is skipped (ssh refuses it) until they are
            known_hosts = self.known_hosts(nodes, timeout=0)
        except KitError as error:
            log.warning("%s", error.what)
            known_hosts = self.deploy_dir / remote.KNOWN_HOSTS_FILE
        key, deadline = bootstrap.ssh_private_key(self.spec), remote.PROGRESS_PULL_S
        # Half the deadline to connect (TCP, SSH handshake and key exchange: ConnectTimeout in ssh_config(5)):
        # a dead node's ssh then ends by itself, and a live one has the rest to log in and read the file.
        ssh = {node.rank: remote.with_connect_timeout(
            remote.ssh_base(host, self.spec.ssh.user, key, known_hosts=known_hosts), deadline / 2)
            for node in nodes if (host := node.address)}
        # a node gone, unanswered by the deadline or without the file yet (trainer not started) is not read
        for text in remote.read_files(ssh, PROGRESS_FILE, deadline_s=deadline).values():
            try:
                records.append(json.loads(text))
            except ValueError:
                continue  # not JSON
        return self.newest_progress(records)

    def checkpoint_dir(self, node: Node, scratch: Path) -> Path:
        from kit import bootstrap, remote

        host = node.address
        if not host:
            raise KitError(f"node {node.name} has no IP address", where="terraform output nodes",
                           fix="wait until the instance is running, then `kit train` again")
        nodes = [n for n in self.nodes() if n.instance_id != node.instance_id] + [node]
        ssh = remote.ssh_base(host, self.spec.ssh.user, bootstrap.ssh_private_key(self.spec),
                              known_hosts=self.known_hosts(nodes, timeout=60))
        return remote.fetch_newest_checkpoint(ssh, self.spec.training.ckpt_dir, Path(scratch) / node.name)

    def destroy(self, keep_disks: bool = True) -> None:
        from kit import render, terraform

        terraform.destroy(self.deploy_dir, with_disks=not keep_disks, roots=render.roots(self.spec))

    def disk_set(self, zone: str | None, shape: str | None) -> str | None:
        """A job that can move has one disks root per zone and shape (kit.render.roots)."""
        from kit.terraform import disk_root

        return disk_root(f"{zone}-{shape}") if self.spec.can_move and zone and shape else None

    def release_disks(self, name: str) -> None:
        """``terraform destroy`` of that disks root alone (its ``prevent_destroy`` lifted for the run, as
        ``kit destroy --with-disks`` does), then its directory: no other root reads it."""
        from kit import render, terraform

        if name == render.roots(self.spec)[0]:
            raise KitError(f"{name} holds the disks of the running zone and shape", where=str(self.deploy_dir),
                           fix="only disks of zones and shapes the job left are released")
        terraform.destroy_disks_root(self.deploy_dir, name)


def backend_for(spec: SpecBase, deploy_dir: Path, *, watcher_url: str | None = None, watcher_token: str | None = None) -> Backend:
    return spec.cloud_facts.backend(spec, deploy_dir, watcher_url=watcher_url, watcher_token=watcher_token)

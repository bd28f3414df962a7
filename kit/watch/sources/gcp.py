"""GCP: the cluster's Compute Engine instances (label ``kit-cluster``) and preemption operations.

What it reads (Compute Engine REST API v1):
* ``instances.list`` with ``filter=labels.kit-cluster="<name>"``: ``id``, ``status``
  (PROVISIONING, STAGING, RUNNING, STOPPING, STOPPED, SUSPENDING, SUSPENDED, REPAIRING,
  TERMINATED), ``scheduling.provisioningModel`` (SPOT / STANDARD), ``lastStopTimestamp``.
* ``zoneOperations.list`` with ``filter=operationType="compute.instances.preempted"``: one
  system operation per reclaim, naming the instance in ``targetId`` / ``targetLink``. This is
  how a preempted instance is told apart from one a person stopped (both end TERMINATED).

Instances are keyed by their numeric ``id``, not their name: Terraform recreates a replaced
node under the same name, and a loss of the new node must not look like the old one. The id does
come back in one case: a spot VM with termination action STOP is restarted by the next apply
(``desired_status = "RUNNING"``) under the same id, so an operation older than the instance's
``lastStartTimestamp`` belongs to an earlier run and is ignored.

Preempted operations are reported for every target in the zone, listed or not: an instance
deleted after its preemption (termination action DELETE) is no longer listed, and only the
watcher knows (from its ledger) which instance ids were the cluster's. Each operation is reported, not
only an instance's newest: one listed late (operations show up some time after the fact) names the run
that was going at its ``insertTime``, and the ledger gives it to that incarnation alone
(kit.watch.ledger.Ledger.mark_lost), never to an earlier or later run of a restarted id.

Both lists are zonal, so the source reads every zone the job may run in (the spec's ``zones``): after
a move the nodes are in another zone, and a source that listed only the first one would report every
one of them as "not listed by the cloud", i.e. lost, on every poll.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kit.clouds.gcp import Gcp
from kit.errors import KitError
from kit.watch.events import PREEMPTION, Event
from kit.watch.sources.base import (
    PENDING,
    RUNNING,
    STOPPED,
    STOPPING,
    TERMINATED,
    EventSource,
    InstanceStatus,
    Poll,
    SourceError,
    places,
)

CLUSTER_LABEL = Gcp.cluster_tag
PREEMPTED_OPERATION = "compute.instances.preempted"
STATES = {
    "PROVISIONING": PENDING, "STAGING": PENDING, "RUNNING": RUNNING, "REPAIRING": PENDING,
    "STOPPING": STOPPING, "SUSPENDING": STOPPING, "STOPPED": STOPPED, "SUSPENDED": STOPPED,
    "TERMINATED": STOPPED,  # TERMINATED keeps the instance (and its disks) but it is not running
}


def rfc3339(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class GcpSource(EventSource):
    name = "gcp"

    def __init__(self, cluster: str, project: str, zones: str | Sequence[str], *, credentials=None,
                 api_endpoint: str | None = None):
        self.cluster = cluster
        self.project = project
        self.zones = places(zones)
        self.where = f"gcp {project}/{','.join(self.zones)}"
        self._credentials = credentials
        self._api_endpoint = api_endpoint
        self._clients: tuple[Any, Any] | None = None  # (InstancesClient, ZoneOperationsClient), made on first use

    def clients(self):
        if self._clients is None:
            from google.cloud import compute_v1

            options = {"api_endpoint": self._api_endpoint} if self._api_endpoint else None
            kwargs = {"credentials": self._credentials, "client_options": options}
            self._clients = (compute_v1.InstancesClient(**kwargs), compute_v1.ZoneOperationsClient(**kwargs))
        return self._clients

    def poll(self) -> Poll:
        from google.api_core import exceptions as gexc
        from google.auth.exceptions import DefaultCredentialsError

        try:
            instances, operations = self._list()
        except DefaultCredentialsError as error:
            raise KitError("no Google credentials for the watcher", where=self.where,
                           fix="run `gcloud auth application-default login` or set "
                               "GOOGLE_APPLICATION_CREDENTIALS") from error
        except (gexc.Forbidden, gexc.Unauthorized) as error:
            raise KitError(f"Compute Engine refused the watcher's request: {error.message}",
                           where=self.where,
                           fix="grant compute.instances.list and compute.zoneOperations.list") from error
        except gexc.GoogleAPIError as error:
            raise SourceError(f"Compute Engine API error: {error}") from error
        return self._to_poll(instances, operations)

    def _list(self):
        from google.cloud import compute_v1

        instances_client, operations_client = self.clients()
        instances, operations = [], []
        for zone in self.zones:
            instances += instances_client.list(request=compute_v1.ListInstancesRequest(
                project=self.project, zone=zone, filter=f'labels.{CLUSTER_LABEL}="{self.cluster}"'))
            operations += operations_client.list(request=compute_v1.ListZoneOperationsRequest(
                project=self.project, zone=zone, filter=f'operationType="{PREEMPTED_OPERATION}"'))
        return instances, operations

    def _to_poll(self, instances, operations) -> Poll:
        poll = Poll()
        by_id = {str(inst.id): inst for inst in instances}
        by_name = {inst.name: str(inst.id) for inst in instances}
        preempted: dict[str, Any] = {}  # instance id -> its newest preemption operation
        reported: list[tuple[str, Any]] = []  # (instance id, operation): every one (module docstring)
        for op in operations:
            if op.operation_type != PREEMPTED_OPERATION:  # the filter is server-side; trust but check
                continue
            name = op.target_link.rsplit("/", 1)[-1] if op.target_link else ""
            target = str(op.target_id) if op.target_id else by_name.get(name, "")
            if not target:
                continue  # no id and not listed: nothing to match it against
            inst = by_id.get(target)
            op_time = rfc3339(op.insert_time)
            started = rfc3339(inst.last_start_timestamp) if inst is not None else None
            if started is not None and op_time is not None and op_time < started:
                continue  # an earlier run of an instance that was restarted since
            reported.append((target, op))
            if target not in preempted or (op_time or 0) > (rfc3339(preempted[target].insert_time) or 0):
                preempted[target] = op
        for instance_id, inst in by_id.items():
            op = preempted.get(instance_id)
            model = inst.scheduling.provisioning_model if inst.scheduling else ""
            poll.instances.append(InstanceStatus(
                instance=instance_id,
                state=STATES.get(inst.status, TERMINATED),
                market="spot" if model == "SPOT" or (inst.scheduling and inst.scheduling.preemptible) else "on-demand",
                preempted=op is not None,
                reason=(op.status_message or PREEMPTED_OPERATION) if op is not None else (inst.status_message or None),
                time=rfc3339(op.insert_time) if op is not None else rfc3339(inst.last_stop_timestamp),
            ))
        for instance_id, op in reported:
            # Other clusters' operations in the zone are reported too; the watcher keeps only the
            # ones naming an instance its ledger knows.
            name = by_id[instance_id].name if instance_id in by_id else op.target_link.rsplit("/", 1)[-1]
            poll.events.append(Event(
                kind=PREEMPTION, instance=instance_id, time=rfc3339(op.insert_time) or time.time(), source="gcp",
                detail={"operation": op.name, "name": name, "message": op.status_message,
                        "listed": instance_id in by_id},
                dedup_key=f"gcp:op:{op.id or op.name}",
            ))
        return poll

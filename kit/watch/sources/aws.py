"""AWS: the cluster's EC2 instances (tag ``kit:cluster``) and their spot requests, via boto3.

What it reads (EC2 API reference):
* ``DescribeInstances`` filtered by ``tag:kit:cluster``: ``State.Name``, ``StateReason.Code``
  (``Server.SpotInstanceTermination`` / ``Server.SpotInstanceShutdown`` = a spot reclaim),
  ``InstanceLifecycle`` (``spot`` for spot instances), ``SpotInstanceRequestId``.
* ``DescribeSpotInstanceRequests``: ``Status.Code`` of the requests behind those instances
  (``marked-for-*`` is the two-minute notice, recorded as a NOTICE: the instance still runs and
  its loss is confirmed by its state later; ``instance-terminated-*`` / ``instance-stopped-*``
  confirm a reclaim) and of the cluster's *open* requests that have no instance yet, tagged
  ``kit:cluster`` (``capacity-not-available`` / ``capacity-oversubscribed`` / ``price-too-low``:
  a launch waiting for capacity). kit's own module makes one-time requests through RunInstances,
  which fail at once without capacity (the apply raises CapacityError); the open-request path
  covers requests tagged for the cluster by other means (``TagSpecifications`` of type
  ``spot-instances-request``).
"""

from __future__ import annotations

import re
import time
from calendar import timegm
from collections.abc import Sequence
from typing import Any

from kit.clouds.aws import Aws
from kit.errors import KitError
from kit.watch.events import CAPACITY_ERROR, NOTICE, Event
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

CLUSTER_TAG = Aws.cluster_tag
STATES = {
    "pending": PENDING, "running": RUNNING, "shutting-down": TERMINATED, "terminated": TERMINATED,
    "stopping": STOPPING, "stopped": STOPPED,
}
SPOT_REASON_CODES = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")
SPOT_RECLAIM_STATUS = re.compile(r"^(instance-terminated|instance-stopped)-(by-price|no-capacity|capacity-oversubscribed|launch-group-constraint)$")
SPOT_NOTICE_STATUS = ("marked-for-termination", "marked-for-stop")
SPOT_CAPACITY_STATUS = ("capacity-not-available", "capacity-oversubscribed", "price-too-low")
# Errors retrying cannot fix: the user must fix credentials or IAM.
FATAL_ERROR_CODES = ("AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "OptInRequired")
_REASON_TIME = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def transition_time(reason: str | None) -> float | None:
    """``StateTransitionReason`` looks like ``User initiated (2025-10-04 12:00:00 GMT)``."""
    match = _REASON_TIME.search(reason or "")
    return float(timegm(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))) if match else None


class AwsSource(EventSource):
    name = "aws"

    def __init__(self, cluster: str, regions: str | Sequence[str], *, endpoint_url: str | None = None, session=None):
        self.cluster = cluster
        # every region the job may run in: after a move to another region its instances are there, and a
        # source that read only the first would report each of them as not listed, i.e. lost
        self.regions = places(regions)
        self.endpoint_url = endpoint_url
        self._session = session
        self._clients: dict[str, Any] = {}

    def client(self, region: str):
        if region not in self._clients:
            import boto3

            session = self._session or boto3.session.Session()
            self._clients[region] = session.client("ec2", region_name=region, endpoint_url=self.endpoint_url)
        return self._clients[region]

    def poll(self) -> Poll:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = f"aws {','.join(self.regions)}"
        try:
            instances, spot_status = [], {}
            for region in self.regions:
                listed = self._describe_instances(region)
                instances += listed
                spot_status.update(self._spot_requests(region, {i["InstanceId"] for i in listed}))
        except NoCredentialsError as error:
            raise KitError("no AWS credentials for the watcher", where=where,
                           fix="configure credentials (AWS_PROFILE or ~/.aws/credentials)") from error
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in FATAL_ERROR_CODES:
                raise KitError(f"AWS refused the watcher's request ({code})", where=where,
                               fix="give the credentials ec2:DescribeInstances and "
                                   "ec2:DescribeSpotInstanceRequests") from error
            raise SourceError(f"EC2 API error {code}: {error}") from error
        except BotoCoreError as error:
            raise SourceError(f"EC2 API unreachable: {error}") from error
        return self._to_poll(instances, spot_status)

    def _describe_instances(self, region: str) -> list[dict]:
        paginator = self.client(region).get_paginator("describe_instances")
        pages = paginator.paginate(Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.cluster]}])
        return [inst for page in pages for res in page.get("Reservations", []) for inst in res.get("Instances", [])]

    def _spot_requests(self, region: str, instance_ids: set[str]) -> dict[str, dict]:
        """The spot requests that concern the cluster, keyed by instance id (or by request id for
        an open request with no instance yet).

        Listed region-wide: a one-time request made through ``InstanceMarketOptions`` carries no
        tags, so requests with an instance are matched on ``InstanceId`` (the ``instance-id``
        filter is not implemented everywhere, e.g. moto). A request still waiting for capacity has
        no instance: it is ours only when it is tagged ``kit:cluster`` with this cluster. Closed
        requests age out after a few hours, so the list stays short."""
        pages = self.client(region).get_paginator("describe_spot_instance_requests").paginate()
        out = {}
        for page in pages:
            for req in page.get("SpotInstanceRequests", []):
                instance = req.get("InstanceId")
                if instance:
                    if instance in instance_ids:
                        out[instance] = req
                elif req.get("State", "open") == "open" and {"Key": CLUSTER_TAG, "Value": self.cluster} in (
                        req.get("Tags") or []):
                    out[req["SpotInstanceRequestId"]] = req
        return out

    def _to_poll(self, instances: list[dict], spot_requests: dict[str, dict]) -> Poll:
        poll = Poll()
        listed = {inst["InstanceId"] for inst in instances}
        for inst in instances:
            request = spot_requests.get(inst["InstanceId"], {})
            status_code = request.get("Status", {}).get("Code", "")
            reason_code = inst.get("StateReason", {}).get("Code")
            preempted = reason_code in SPOT_REASON_CODES or bool(SPOT_RECLAIM_STATUS.match(status_code))
            reason = " / ".join(r for r in (reason_code, status_code) if r) or None
            poll.instances.append(InstanceStatus(
                instance=inst["InstanceId"],
                state=STATES.get(inst["State"]["Name"], TERMINATED),
                market="spot" if inst.get("InstanceLifecycle") == "spot" or request else "on-demand",
                preempted=preempted, reason=reason,
                time=transition_time(inst.get("StateTransitionReason")),
            ))
            if status_code in SPOT_NOTICE_STATUS:  # the two-minute warning, seen from the API side
                # Not a loss: the instance still runs (and is kept by a re-apply). The state, and
                # StateReason Server.SpotInstance*, confirm the reclaim when it happens.
                updated = request.get("Status", {}).get("UpdateTime", "")
                poll.events.append(Event(
                    kind=NOTICE, instance=inst["InstanceId"], time=time.time(), source="aws",
                    detail={"spot_status": status_code, "notice": True},
                    dedup_key=f"aws:notice:{inst['InstanceId']}:{status_code}:{updated}",
                ))
        for key, request in spot_requests.items():
            if key in listed:
                continue  # a request with an instance: its codes are about that instance (above)
            request_id = request["SpotInstanceRequestId"]
            code = request.get("Status", {}).get("Code", "")
            if code in SPOT_CAPACITY_STATUS:
                poll.events.append(Event(
                    kind=CAPACITY_ERROR, instance=request.get("InstanceId") or request_id, time=time.time(),
                    source="aws", detail={"market": "spot", "spot_request": request_id, "spot_status": code,
                                          "message": request.get("Status", {}).get("Message")},
                    dedup_key=f"aws:capacity:{request_id}:{code}",
                ))
        return poll

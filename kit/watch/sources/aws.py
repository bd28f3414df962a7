"""AWS: the cluster's EC2 instances (tag ``kit:cluster``) and their spot requests, via boto3.

What it reads (EC2 API reference):
* ``DescribeInstances`` filtered by ``tag:kit:cluster``: ``State.Name``, ``StateReason.Code``
  (``Server.SpotInstanceTermination`` / ``Server.SpotInstanceShutdown`` = a spot reclaim),
  ``InstanceLifecycle`` (``spot`` for spot instances), ``SpotInstanceRequestId``.
* ``DescribeSpotInstanceRequests`` for those request ids: ``Status.Code``. ``marked-for-*`` is
  the two-minute notice, ``instance-terminated-*`` / ``instance-stopped-*`` confirm a reclaim,
  and ``capacity-not-available`` / ``capacity-oversubscribed`` / ``price-too-low`` mean a
  launch is waiting for capacity.
"""

from __future__ import annotations

import re
import time
from calendar import timegm

from kit.errors import KitError
from kit.watch.events import CAPACITY_ERROR, PREEMPTION, Event
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
)

CLUSTER_TAG = "kit:cluster"
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

    def __init__(self, cluster: str, region: str, *, endpoint_url: str | None = None, session=None):
        self.cluster = cluster
        self.region = region
        self.endpoint_url = endpoint_url
        self._session = session
        self._client = None

    def client(self):
        if self._client is None:
            import boto3

            session = self._session or boto3.session.Session()
            self._client = session.client("ec2", region_name=self.region, endpoint_url=self.endpoint_url)
        return self._client

    def poll(self) -> Poll:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            instances = self._describe_instances()
            spot_status = self._spot_requests({i["InstanceId"] for i in instances})
        except NoCredentialsError as error:
            raise KitError("no AWS credentials for the watcher", where=f"aws {self.region}",
                           fix="configure credentials (AWS_PROFILE or ~/.aws/credentials)") from error
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in FATAL_ERROR_CODES:
                raise KitError(f"AWS refused the watcher's request ({code})", where=f"aws {self.region}",
                               fix="give the credentials ec2:DescribeInstances and "
                                   "ec2:DescribeSpotInstanceRequests") from error
            raise SourceError(f"EC2 API error {code}: {error}") from error
        except BotoCoreError as error:
            raise SourceError(f"EC2 API unreachable: {error}") from error
        return self._to_poll(instances, spot_status)

    def _describe_instances(self) -> list[dict]:
        paginator = self.client().get_paginator("describe_instances")
        pages = paginator.paginate(Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.cluster]}])
        return [inst for page in pages for res in page.get("Reservations", []) for inst in res.get("Instances", [])]

    def _spot_requests(self, instance_ids: set[str]) -> dict[str, dict]:
        """The spot requests behind the cluster's instances, keyed by instance id.

        Listed region-wide and matched on ``InstanceId``: a one-time request made through
        ``InstanceMarketOptions`` carries no tags, and the ``instance-id`` filter is not
        implemented everywhere (moto). Closed requests age out after a few hours, so the list
        stays short."""
        if not instance_ids:
            return {}
        pages = self.client().get_paginator("describe_spot_instance_requests").paginate()
        return {req["InstanceId"]: req for page in pages for req in page.get("SpotInstanceRequests", [])
                if req.get("InstanceId") in instance_ids}

    def _to_poll(self, instances: list[dict], spot_requests: dict[str, dict]) -> Poll:
        poll = Poll()
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
                poll.events.append(Event(
                    kind=PREEMPTION, instance=inst["InstanceId"], time=time.time(), source="aws",
                    detail={"spot_status": status_code, "notice": True},
                    dedup_key=f"aws:notice:{inst['InstanceId']}",
                ))
        for request in spot_requests.values():
            request_id = request["SpotInstanceRequestId"]
            code = request.get("Status", {}).get("Code", "")
            if code in SPOT_CAPACITY_STATUS:
                poll.events.append(Event(
                    kind=CAPACITY_ERROR, instance=request.get("InstanceId") or request_id, time=time.time(),
                    source="aws", detail={"spot_request": request_id, "spot_status": code,
                                          "message": request.get("Status", {}).get("Message")},
                    dedup_key=f"aws:capacity:{request_id}:{code}",
                ))
        return poll

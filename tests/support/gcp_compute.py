"""A loopback fake of the Compute Engine v1 REST API (tests only), shaped like the documented API:
``instances`` (list, get, insert, delete, start, getGuestAttributes), ``disks`` (get, insert, delete) and
``zoneOperations.list``,
under ``/compute/v1/projects/{project}/zones/{zone}/``. Lists are paged (``items`` / ``nextPageToken``)
and honour only the ``filter`` expressions kit sends (``labels.kit-cluster="NAME"``,
``operationType="compute.instances.preempted"``); any other filter is a 400, so a wrong one fails the
test. Errors are ``{"error": {"code", "message", "errors"}}``; inserts and deletes answer with a DONE
``compute#operation``. In a zone of ``stocked_out``, ``instances.insert`` ends in an operation with the
error GCP gives when a zone has no capacity (``ZONE_RESOURCE_POOL_EXHAUSTED``), and no VM is made.

kit's watcher (``GcpSource``, google-cloud-compute's REST transport with ``api_endpoint``) reads it, and
the provider emulator (tests/support/tf_emulator/gcp_compute.py) creates and deletes what Terraform
applies in it, so both see one cloud. ``preempt(name)`` is what GCP does to a Spot VM whose termination
action is STOP (kit's): a system ``compute.instances.preempted`` operation, and the instance is stopped
(status ``TERMINATED``), keeping its id and disks until ``instances.start``.

``guest_attributes[name]`` holds what an instance's guest agent wrote (``{"hostkeys/ssh-ed25519": base64}``);
``instances.getGuestAttributes?queryPath=P`` answers the ``compute#guestAttributes`` of the documented API
with the entries under ``P`` (``queryValue.items`` of namespace, key, value) when the instance's metadata
has ``enable-guest-attributes`` TRUE and something is written there. Otherwise the fake answers 404: the
reference does not say which error GCP gives then, and kit treats any 404 as "not written yet".

Addresses, with ``subnet="198.18.S"``: a new instance's ``networkInterfaces[0]`` gets an internal
``networkIP`` (``.10`` up) and a ``ONE_TO_ONE_NAT`` access config with an external ``natIP`` (``.100``
up); the internal one is the instance's for its lifetime, while the external one, being ephemeral, is
released when the VM stops and a new one is given at ``instances.start`` ("IP addresses", VPC docs:
an ephemeral external address stays only until the VM is stopped). Without ``subnet`` an instance has no
interfaces, as before.

Credentials, with ``token="..."``: ``service_account_file(path)`` writes a service-account key (a new RSA key
whose public half the fake then trusts, ``token_uri`` the fake's) for ``GOOGLE_APPLICATION_CREDENTIALS``.
Every API request must carry ``Authorization: Bearer <credential>`` (401 otherwise, as the API answers a
request without valid credentials), the credential being either the access token that ``POST /token``
gives for the key's JWT bearer grant (RFC 7523 section 2.1, answered as RFC 6749 section 5.1 says), or a
JWT the key signed itself (RS256), which Google's APIs accept from service accounts and the Cloud client
libraries send ("self-signed JWT", google.aip.dev/auth/4111).
"""
from __future__ import annotations

import base64
import itertools
import json
import re
import threading
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tests.support.gcp_api import ComputeHandler

PAGE = 2  # small pages, so that a client must follow nextPageToken
PATH = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|disks|operations)(?:/([^/]+))?"
                  r"(/start|/getGuestAttributes)?$")
LABEL_FILTER = re.compile(r'^labels\.kit-cluster\s*=\s*"([^"]+)"$')
PREEMPTED = "compute.instances.preempted"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"  # a grant's assertion names Google's endpoint, wherever it is sent
_ids = itertools.count(4_000_000_000_000_000_001)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000+00:00")


class FakeCompute:
    """The fake's state; ``instances``, ``disks``, ``operations`` are plain lists of API resources."""

    def __init__(self, project: str = "kit-test", *, subnet: str | None = None, token: str | None = None) -> None:
        self.project = project
        self.subnet, self.token = subnet, token
        self.trusted_keys: list = []  # the public keys of service_account_file's keys
        self._internal = itertools.count(10)
        self._external = itertools.count(100)
        self.instances: list[dict] = []
        self.disks: list[dict] = []
        self.operations: list[dict] = []
        self.fail_with: int | None = None
        self.stocked_out: set[str] = set()  # zones where a new VM finds no capacity
        self.requests: list[str] = []
        self.guest_attributes: dict[str, dict[str, str]] = {}  # instance name -> "namespace/key" -> value
        self.endpoint = ""
        self._server: ThreadingHTTPServer | None = None

    def base(self, zone: str) -> str:
        return f"https://www.googleapis.com/compute/v1/projects/{self.project}/zones/{zone}"

    def start(self) -> FakeCompute:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler(self))
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeCompute:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def live(self, kind: str) -> list[dict]:
        return list(self.instances if kind == "instances" else self.disks)

    def preempt(self, name: str) -> None:
        """GCP reclaims a Spot VM (termination action STOP): the system operation, and the VM is stopped."""
        inst = next(i for i in self.instances if i["name"] == name)
        inst.update(status="TERMINATED", lastStopTimestamp=now())
        for nic in inst.get("networkInterfaces") or []:
            for access in nic.get("accessConfigs") or []:
                access.pop("natIP", None)  # an ephemeral external address is released when the VM stops
        zone = inst["zone"].rsplit("/", 1)[-1]
        op_id = str(next(_ids))
        self.operations.append({
            "kind": "compute#operation", "id": op_id, "name": f"systemevent-{op_id}", "zone": self.base(zone),
            "operationType": PREEMPTED, "targetLink": inst["selfLink"], "targetId": inst["id"], "status": "DONE",
            "statusMessage": "Instance was preempted.", "user": "system", "progress": 100, "insertTime": now(),
            "startTime": now(), "endTime": now(), "selfLink": f"{self.base(zone)}/operations/systemevent-{op_id}"})

    # ------------------------------------------------------------------ the methods
    def insert(self, kind: str, zone: str, body: dict) -> dict:
        items = self.instances if kind == "instances" else self.disks
        if kind == "instances" and zone in self.stocked_out:
            return self.stockout(zone, body)
        if any(i["name"] == body.get("name") for i in items):
            raise ApiError(409, f"The resource '{self.base(zone)}/{kind}/{body.get('name')}' already exists",
                           "alreadyExists")
        item = {**body, "kind": f"compute#{kind[:-1]}", "id": str(next(_ids)), "zone": self.base(zone),
                "creationTimestamp": now(), "selfLink": f"{self.base(zone)}/{kind}/{body['name']}"}
        if kind == "instances":
            item.update(status="RUNNING", lastStartTimestamp=now(), networkInterfaces=self.interfaces())
        else:
            item.update(status="READY")
        items.append(item)
        return self.operation(zone, f"compute.{kind}.insert", item)

    def stockout(self, zone: str, body: dict) -> dict:
        """What instances.insert answers in a zone without capacity: the operation ends DONE with an error
        (Operation.error.errors[], code ZONE_RESOURCE_POOL_EXHAUSTED) and no VM is made."""
        target = {"selfLink": f"{self.base(zone)}/instances/{body.get('name')}", "id": str(next(_ids))}
        message = (f"The zone 'projects/{self.project}/zones/{zone}' does not have enough resources available to "
                   "fulfill the request.  Try a different zone, or try again later.")
        return {**self.operation(zone, "compute.instances.insert", target), "httpErrorStatusCode": 503,
                "httpErrorMessage": "SERVICE UNAVAILABLE",
                "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message}]}}

    def delete(self, kind: str, zone: str, name: str) -> dict:
        items = self.instances if kind == "instances" else self.disks
        item = self.get(kind, zone, name)
        items.remove(item)
        return self.operation(zone, f"compute.{kind}.delete", item)

    def service_account_file(self, path: Path) -> Path:
        """A service-account key file (the JSON ``gcloud iam service-accounts keys create`` writes) with a new
        RSA key, whose public half the fake trusts, refreshed at the fake's token endpoint."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.trusted_keys.append(key.public_key())
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        path.write_text(json.dumps({"type": "service_account", "project_id": self.project, "private_key_id": "0" * 40,
                                    "private_key": pem.decode(), "client_email": f"kit@{self.project}.iam.gserviceaccount.com",
                                    "client_id": "1" * 21, "token_uri": f"{self.endpoint}/token"}))
        return path

    def signed_claims(self, jwt: str) -> dict | None:
        """The claims of a JWT signed (RS256) by a key the fake trusts; None for anything else."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        parts = jwt.split(".")
        if len(parts) != 3:
            return None
        signature = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        for key in self.trusted_keys:
            try:
                key.verify(signature, f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256())
            except InvalidSignature:
                continue
            return json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        return None

    def authorized(self, header: str) -> bool:
        credential = header.removeprefix("Bearer ")
        return header.startswith("Bearer ") and (credential == self.token or self.signed_claims(credential) is not None)

    def interfaces(self) -> list[dict]:
        """A new VM's network interface: an internal address and an ephemeral external one."""
        if self.subnet is None:
            return []
        return [{"kind": "compute#networkInterface", "name": "nic0", "networkIP": f"{self.subnet}.{next(self._internal)}",
                 "accessConfigs": [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "External NAT",
                                    "natIP": self.external_ip()}]}]

    def external_ip(self) -> str:
        return f"{self.subnet}.{next(self._external)}"

    def start_instance(self, zone: str, name: str) -> dict:
        """instances.start: the VM runs again with its id, disks and internal address, and a new ephemeral
        external address (the one it had was released when it stopped)."""
        inst = self.get("instances", zone, name)
        if inst["status"] == "STOPPING":  # the API's answer to an operation on a VM between states
            raise ApiError(400, f"The resource '{inst['selfLink']}' is not ready", "resourceNotReady")
        inst.update(status="RUNNING", lastStartTimestamp=now())
        for nic in inst.get("networkInterfaces") or []:
            for access in nic.get("accessConfigs") or []:
                access["natIP"] = self.external_ip()
        return self.operation(zone, "compute.instances.start", inst)

    def get_guest_attributes(self, zone: str, name: str, query_path: str) -> dict:
        inst = self.get("instances", zone, name)
        enabled = any(m.get("key") == "enable-guest-attributes" and str(m.get("value")).upper() == "TRUE"
                      for m in (inst.get("metadata") or {}).get("items") or [])
        written = {k: v for k, v in self.guest_attributes.get(name, {}).items() if k.startswith(query_path)}
        if not enabled or not written:
            raise ApiError(404, f"The resource '{inst['selfLink']}/guestAttributes/{query_path}' was not found",
                           "notFound")
        items = [{"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v} for k, v in written.items()]
        return {"kind": "compute#guestAttributes", "queryPath": query_path, "queryValue": {"items": items},
                "selfLink": f"{inst['selfLink']}/getGuestAttributes"}

    def get(self, kind: str, zone: str, name: str) -> dict:
        items = self.instances if kind == "instances" else self.disks
        for item in items:
            if item["name"] == name and item["zone"].endswith(f"/zones/{zone}"):
                return item
        raise ApiError(404, f"The resource '{self.base(zone)}/{kind}/{name}' was not found", "notFound")

    def operation(self, zone: str, kind: str, target: dict) -> dict:
        op_id = str(next(_ids))
        return {"kind": "compute#operation", "id": op_id, "name": f"operation-{op_id}", "zone": self.base(zone),
                "operationType": kind.rsplit(".", 1)[-1], "targetLink": target["selfLink"], "targetId": target["id"],
                "status": "DONE", "progress": 100, "insertTime": now(), "endTime": now(),
                "selfLink": f"{self.base(zone)}/operations/operation-{op_id}"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


class Handler(ComputeHandler):
    state: FakeCompute  # set per server by handler()

    def route(self, method: str) -> None:
        url = urlparse(self.path)
        self.state.requests.append(f"{method} {self.path}")
        if self.state.token is not None and method == "POST" and url.path == "/token":
            return self.grant()
        if self.state.token is not None and not self.state.authorized(self.headers.get("Authorization") or ""):
            return self.error(401, "Request is missing required authentication credential.", "required")
        match = PATH.match(url.path)
        if not match or match.group(1) != self.state.project:
            return self.error(404, f"The resource '{url.path}' was not found", "notFound")
        if self.state.fail_with:
            return self.error(self.state.fail_with, "Required 'compute.instances.list' permission", "forbidden")
        _, zone, kind, name, action = match.groups()
        try:
            if method == "GET" and name is None:
                return self.listing(zone, kind, parse_qs(url.query))
            if method == "GET" and kind == "instances" and name and action == "/getGuestAttributes":
                path = parse_qs(url.query).get("queryPath", [""])[0]
                return self.reply(200, self.state.get_guest_attributes(zone, name, path))
            self.reply(200, self.call(method, zone, kind, name, action))
        except ApiError as error:
            self.error(error.status, error.message, error.reason)

    def grant(self) -> None:
        """The token endpoint's answer to a JWT bearer grant (RFC 7523 section 2.1, RFC 6749 section 5.1)."""
        form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
        claims = self.state.signed_claims((form.get("assertion") or [""])[0])
        if form.get("grant_type") != [JWT_BEARER] or claims is None or claims.get("aud") != TOKEN_AUDIENCE:
            return self.reply(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        self.reply(200, {"access_token": self.state.token, "expires_in": 3599, "token_type": "Bearer"})

    def call(self, method: str, zone: str, kind: str, name: str | None, action: str | None) -> dict:
        if kind != "operations" and name is not None:
            if method == "POST" and kind == "instances" and action:
                return self.state.start_instance(zone, name)
            if method == "GET" and not action:
                return self.state.get(kind, zone, name)
            if method == "DELETE" and not action:
                return self.state.delete(kind, zone, name)
        if kind != "operations" and method == "POST" and name is None:
            length = int(self.headers.get("Content-Length") or 0)
            return self.state.insert(kind, zone, json.loads(self.rfile.read(length) or b"{}"))
        raise ApiError(405, "Method not allowed", "badRequest")

    def listing(self, zone: str, kind: str, query: dict) -> None:
        flt = query.get("filter", [""])[0]
        items = self.matching(zone, kind, flt)
        if items is None:
            return self.error(400, f"Invalid value for field 'filter': '{flt}'.", "invalid")
        start = int(query.get("pageToken", ["0"])[0])
        body = {"kind": f"compute#{kind[:-1]}List", "id": f"projects/{self.state.project}/zones/{zone}/{kind}",
                "items": items[start:start + PAGE], "selfLink": f"{self.state.base(zone)}/{kind}"}
        if start + PAGE < len(items):
            body["nextPageToken"] = str(start + PAGE)
        self.reply(200, body)

    def matching(self, zone: str, kind: str, flt: str) -> list[dict] | None:
        """The zone's items the filter selects; None for a filter the fake does not know."""
        in_zone = [i for i in {"instances": self.state.instances, "disks": self.state.disks,
                               "operations": self.state.operations}[kind] if i["zone"].endswith(f"/zones/{zone}")]
        if kind == "instances":
            label = LABEL_FILTER.match(flt)
            return [i for i in in_zone if (i.get("labels") or {}).get("kit-cluster") == label.group(1)] \
                if label else None
        if kind == "operations":
            return [o for o in in_zone if o["operationType"] == PREEMPTED] \
                if flt == f'operationType="{PREEMPTED}"' else None
        return in_zone

    def do_GET(self) -> None:
        self.route("GET")

    def do_POST(self) -> None:
        self.route("POST")

    def do_DELETE(self) -> None:
        self.route("DELETE")


def handler(state: FakeCompute) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"state": state})

"""The emulator's Compute Engine resources, backed by the loopback Compute API fake
(tests/support/gcp_compute.py): what Terraform creates is what kit's watcher (``GcpSource``) sees. Used
when ``$ENDPOINT_ENV`` names the fake.

Covered: ``google_compute_instance`` (labels, machine type, scheduling with the provisioning model,
metadata, attached disks, and the addresses the API gives its network interface, read back into
``network_interface[0].network_ip`` and ``access_config[0].nat_ip`` after a create, a start and every
refresh; a stopped instance is read back with ``desired_status`` = its status, as the provider reads
it, so ``desired_status = "RUNNING"`` plans an update that starts it) and ``google_compute_disk``.
With ``GOOGLE_APPLICATION_CREDENTIALS`` set, requests carry the access token google-auth gets for those
credentials, as the provider's do.
Networks, firewalls, resource policies, service accounts and IAM keep the emulator's placeholders.
An insert whose operation ends with errors (a zone without capacity) fails the create with the provider's
message, "Error waiting for instance to create: ...".
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from tf.types import Unknown

ENDPOINT_ENV = "KIT_TF_EMULATOR_GCP_ENDPOINT"
KINDS = {"google_compute_instance": "instances", "google_compute_disk": "disks"}


class ApplyError(Exception):
    """A create the cloud refused: the provider's error, reported to Terraform as a diagnostic."""


def enabled() -> bool:
    return bool(os.environ.get(ENDPOINT_ENV))


def _first(value) -> dict:
    return value[0] if isinstance(value, list) and value else {}


def _addresses(s: dict, item: dict) -> None:
    """The addresses the API gave the VM, into the state's first interface (the provider reads them back)."""
    nics, api = s.get("network_interface"), item.get("networkInterfaces") or []
    if not isinstance(nics, list) or not nics or not api:
        return
    nics[0] = {**nics[0], "network_ip": api[0].get("networkIP")}
    access, api_access = nics[0].get("access_config"), api[0].get("accessConfigs") or []
    if isinstance(access, list) and access and api_access:
        access[0] = {**access[0], "nat_ip": api_access[0].get("natIP")}


class GoogleCompute:
    def __init__(self, project: str) -> None:
        self.endpoint = os.environ[ENDPOINT_ENV].rstrip("/")
        self.project = project
        self.credentials = None
        if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
            import google.auth

            self.credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.credentials is not None:
            from google.auth.transport.requests import Request

            if not self.credentials.valid:
                self.credentials.refresh(Request())
            headers["Authorization"] = f"Bearer {self.credentials.token}"
        return headers

    def _call(self, method: str, zone: str, path: str, body: dict | None = None) -> dict | None:
        url = f"{self.endpoint}/compute/v1/projects/{self.project}/zones/{zone}/{path}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise RuntimeError(f"Compute API {method} {path}: {error.code} {error.read().decode()}") from error

    # ----------------------------------------------------------------- create / update / delete
    def create(self, kind: str, s: dict) -> dict:
        if kind not in KINDS:
            return s
        known = {k: v for k, v in s.items() if v is not Unknown}
        zone, name = known["zone"], known["name"]
        body = self._instance(known) if kind == "google_compute_instance" else {
            "name": name, "sizeGb": str(known.get("size") or 10), "type": f"zones/{zone}/diskTypes/{known.get('type')}",
            "labels": known.get("labels") or {}}
        operation = self._call("POST", zone, KINDS[kind], body) or {}
        errors = (operation.get("error") or {}).get("errors") or []
        if errors:  # the provider waits for the operation and fails the create with its errors
            raise ApplyError(f"Error waiting for {kind.removeprefix('google_compute_')} to create: "
                             + "; ".join(e.get("message", e.get("code", "")) for e in errors))
        item = self._call("GET", zone, f"{KINDS[kind]}/{name}") or {}
        s.update(id=f"projects/{self.project}/zones/{zone}/{KINDS[kind]}/{name}", self_link=item.get("selfLink"))
        if kind == "google_compute_instance":
            s.update(instance_id=item["id"], current_status=item["status"])
            _addresses(s, item)
        return s

    def _instance(self, s: dict) -> dict:
        sched = _first(s.get("scheduling"))
        return {"name": s["name"], "machineType": f"zones/{s['zone']}/machineTypes/{s['machine_type']}",
                "labels": s.get("labels") or {},
                "metadata": {"items": [{"key": k, "value": v} for k, v in sorted((s.get("metadata") or {}).items())]},
                "scheduling": {"provisioningModel": sched.get("provisioning_model") or "STANDARD",
                               "preemptible": bool(sched.get("preemptible")),
                               "automaticRestart": bool(sched.get("automatic_restart")),
                               "onHostMaintenance": sched.get("on_host_maintenance") or "MIGRATE",
                               **({"instanceTerminationAction": sched["instance_termination_action"]}
                                  if sched.get("instance_termination_action") else {})},
                "disks": [{"source": d.get("source"), "deviceName": d.get("device_name"), "boot": False}
                          for d in s.get("attached_disk") or []]}

    def update(self, kind: str, prior: dict, planned: dict) -> dict:
        """An in-place update; the one the fake acts on: a stopped instance whose desired_status is RUNNING
        is started (the provider calls instances.start)."""
        if kind == "google_compute_instance" and planned.get("desired_status") == "RUNNING" and \
                prior.get("desired_status") != "RUNNING":
            self._call("POST", planned["zone"], f"instances/{planned['name']}/start", {})
            planned["current_status"] = "RUNNING"
            _addresses(planned, self._call("GET", planned["zone"], f"instances/{planned['name']}") or {})
        return planned

    def delete(self, kind: str, s: dict) -> None:
        if kind in KINDS:
            self._call("DELETE", s["zone"], f"{KINDS[kind]}/{s['name']}")

    # ----------------------------------------------------------------- read
    def refresh(self, kind: str, s: dict) -> dict | None:
        """The resource as the cloud has it now; None once it is gone."""
        if kind not in KINDS:
            return s
        item = self._call("GET", s["zone"], f"{KINDS[kind]}/{s['name']}")
        if item is None:
            return None
        if kind == "google_compute_instance":
            s = {**s, "current_status": item["status"], "desired_status": item["status"]}
            _addresses(s, item)
        return s

    def data(self, kind: str, c: dict) -> dict:
        return c

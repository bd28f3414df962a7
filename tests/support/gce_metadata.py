"""A loopback stand-in for the Compute Engine metadata server, shaped as "About VM metadata" and "Query
VM metadata" document it (cloud.google.com/compute/docs/metadata): ``http://metadata.google.internal``
(169.254.169.254), paths under ``/computeMetadata/v1/``; a request without the header
``Metadata-Flavor: Google`` is 403, and every answer carries that header. Served: ``instance/id``,
``instance/name``, ``instance/hostname``, ``instance/zone`` (``projects/<number>/zones/<zone>``),
``instance/preempted`` (``FALSE``, or ``TRUE`` once the VM is being preempted: "Detect if a VM was
preempted"), and the instance's custom metadata under ``instance/attributes/<key>``; anything else is 404.

Run inside a GCE test host's network namespace, on 169.254.169.254:80 of that namespace
(tests/support/gce_hosts.py): ``python -m tests.support.gce_metadata --instance-file PATH``. The file is
a JSON object (``id``, ``name``, ``zone``, ``preempted``, ``attributes``) re-read on every request, so the
harness changes what the server says by rewriting it.
"""
from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.http_reply import QuietHandler

ADDRESS = "169.254.169.254"
HOSTNAME = "metadata.google.internal"
PROJECT_NUMBER = "123456789012"
PREFIX = "/computeMetadata/v1/instance/"


def answer(instance: dict, path: str) -> str | None:
    """The text the server answers for ``path`` (query string removed); None for 404."""
    if not path.startswith(PREFIX):
        return None
    key = path[len(PREFIX):]
    fixed = {"id": str(instance["id"]), "name": instance["name"],
             "hostname": f"{instance['name']}.{instance['zone']}.c.{instance.get('project', 'kit-test')}.internal",
             "zone": f"projects/{PROJECT_NUMBER}/zones/{instance['zone']}",
             "preempted": "TRUE" if instance.get("preempted") else "FALSE"}
    if key in fixed:
        return fixed[key]
    if key.startswith("attributes/"):
        return (instance.get("attributes") or {}).get(key.removeprefix("attributes/"))
    return None


def handler(instance_file: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        content_type = "application/text"
        extra_headers = (("Metadata-Flavor", "Google"),)

        def reply(self, status: int, body: str = "") -> None:
            self.send_body(status, body.encode())

        def do_GET(self) -> None:
            if self.headers.get("Metadata-Flavor") != "Google":
                return self.reply(403, "Missing Metadata-Flavor:Google header.")
            text = answer(json.loads(instance_file.read_text()), self.path.split("?", 1)[0])
            self.reply(404) if text is None else self.reply(200, text)

    return Handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--instance-file", required=True, type=Path)
    p.add_argument("--port", type=int, default=80)
    a = p.parse_args()
    ThreadingHTTPServer((ADDRESS, a.port), handler(a.instance_file)).serve_forever()


if __name__ == "__main__":
    main()

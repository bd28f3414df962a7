"""A loopback stand-in for the EC2 instance metadata service, IMDSv2 only (kit's instances require
tokens: ``metadata_options.http_tokens = "required"``), shaped as the EC2 user guide documents it
("Use the Instance Metadata Service to access instance metadata"; "Spot Instance interruption
notices"): ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` gives a token; a
GET without a valid ``X-aws-ec2-metadata-token`` is 401; ``/latest/meta-data/instance-id``;
``/latest/meta-data/spot/instance-action`` is 404 until the interruption notice, then
``{"action": "terminate", "time": "..."}``; ``/latest/meta-data/events/recommendations/rebalance``
is 404.

Run inside an EC2 test host's network namespace, listening on 169.254.169.254:80 of that namespace
(tests/support/ec2_hosts.py): ``python -m tests.support.imds --instance ID --notice-file PATH``. The
notice is given by writing the notice JSON to ``PATH``.
"""
from __future__ import annotations

import argparse
import secrets
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.http_reply import QuietHandler

ADDRESS = "169.254.169.254"


def handler(instance: str, notice: Path) -> type[BaseHTTPRequestHandler]:
    tokens: set[str] = set()

    class Handler(QuietHandler):
        def reply(self, status: int, body: str = "") -> None:
            self.send_body(status, body.encode())

        def do_PUT(self) -> None:
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if self.path != "/latest/api/token":
                return self.reply(404)
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return self.reply(400)
            token = secrets.token_urlsafe(32)
            tokens.add(token)
            self.reply(200, token)

        def do_GET(self) -> None:
            if self.headers.get("X-aws-ec2-metadata-token") not in tokens:
                return self.reply(401)
            if self.path == "/latest/meta-data/instance-id":
                return self.reply(200, instance)
            if self.path == "/latest/meta-data/spot/instance-action" and notice.exists():
                return self.reply(200, notice.read_text())
            self.reply(404)

    return Handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--instance", required=True)
    p.add_argument("--notice-file", required=True, type=Path)
    p.add_argument("--port", type=int, default=80)
    a = p.parse_args()
    ThreadingHTTPServer((ADDRESS, a.port), handler(a.instance, a.notice_file)).serve_forever()


if __name__ == "__main__":
    main()

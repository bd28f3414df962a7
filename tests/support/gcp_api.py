"""The HTTP side shared by the loopback fakes of the Compute Engine v1 REST API (tests only):
JSON replies and errors shaped like the documented API's (``{"error": {"code", "message", "errors"}}``)."""

from __future__ import annotations

import json

from tests.support.http_reply import QuietHandler


class ComputeHandler(QuietHandler):
    content_type = "application/json"

    def reply(self, status: int, body: dict) -> None:
        self.send_body(status, json.dumps(body).encode())

    def error(self, status: int, message: str, reason: str) -> None:
        self.reply(status, {"error": {"code": status, "message": message,
                                      "errors": [{"message": message, "domain": "global", "reason": reason}]}})

"""The HTTP side shared by the loopback fakes of the Compute Engine v1 REST API (tests only):
JSON replies and errors shaped like the documented API's (``{"error": {"code", "message", "errors"}}``)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class ComputeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, message: str, reason: str) -> None:
        self.reply(status, {"error": {"code": status, "message": message,
                                      "errors": [{"message": message, "domain": "global", "reason": reason}]}})

"""The HTTP side shared by the tests' loopback stand-ins for cloud services (the EC2 instance metadata
service, the Compute Engine metadata server, the Compute Engine API): no access log on stderr, and a reply
of one body with its type and length, as each service documents its answers."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    content_type = "text/plain"
    extra_headers: tuple[tuple[str, str], ...] = ()  # sent with every reply (the GCE metadata server's Metadata-Flavor)

    def log_message(self, *args) -> None:
        pass

    def send_body(self, status: int, data: bytes) -> None:
        self.send_response(status)
        for name, value in self.extra_headers:
            self.send_header(name, value)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

"""The agents' endpoint: ``POST /v1/clusters/{cluster}/events``.

Each cluster has its own bearer token (``cluster_token``), written once to
``<deploy_dir>/watcher/token`` (mode 0600) and handed to the agents by bootstrap. Answers:
202 ``{"ok": true}`` (recorded), 400 (malformed body or Content-Length, with the reason), 401
(missing or wrong token), 404 (unknown path or cluster), 405 (not POST), 408 (the body did not
arrive within the 10 s socket timeout), 413 (body over 64 KiB).

It is stdlib ``ThreadingHTTPServer`` in a daemon thread: the load is a few requests per node per
minute, and a dependency-free server keeps the watcher installable anywhere.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kit.watch.events import BadReport, Event, event_from_agent

log = logging.getLogger("kit.watch.server")

MAX_BODY = 64 * 1024
PATH = re.compile(r"^/v1/clusters/(?P<cluster>[A-Za-z0-9][A-Za-z0-9_.-]{0,62})/events/?$")


def cluster_token(deploy_dir: Path) -> str:
    """The cluster's token, created on first use (URL-safe, 256 bits)."""
    path = Path(deploy_dir) / "watcher" / "token"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Socket timeout (seconds) for every read: a client that stalls mid-request, or keeps an idle
    # connection open, loses its handler thread after this instead of holding it forever.
    timeout = 10

    def log_message(self, fmt: str, *args) -> None:  # route through logging, not stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    def _reply(self, status: int, body: dict) -> None:
        if status != 202:
            # An early refusal leaves the body unread on the socket: never reuse this connection.
            self.close_connection = True
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="kit-watcher"')
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(405, {"ok": False, "error": "use POST"})

    def do_POST(self) -> None:
        match = PATH.match(self.path)
        if not match:
            return self._reply(404, {"ok": False, "error": f"no such endpoint {self.path}"})
        cluster = match.group("cluster")
        expected = self.server.tokens.get(cluster)
        if expected is None:
            return self._reply(404, {"ok": False, "error": f"this watcher does not watch cluster {cluster!r}"})
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        # Constant-time compare: the token is the only thing between the internet and our ledger.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            return self._reply(401, {"ok": False, "error": "missing or wrong bearer token"})
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._reply(400, {"ok": False, "error": "Content-Length required (a non-negative integer)"})
        if length < 0:  # rfile.read(-1) would read to EOF, past the size limit
            return self._reply(400, {"ok": False, "error": f"Content-Length must be >= 0, got {length}"})
        if length > MAX_BODY:
            return self._reply(413, {"ok": False, "error": f"body over {MAX_BODY} bytes"})
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            return self._reply(408, {"ok": False, "error": f"body not received within {self.timeout} s"})
        if len(raw) < length:
            return self._reply(400, {"ok": False, "error": f"body ended after {len(raw)} of {length} bytes"})
        try:
            event = event_from_agent(json.loads(raw))
        except (ValueError, UnicodeDecodeError) as error:  # BadReport and JSONDecodeError are ValueErrors
            reason = str(error) if isinstance(error, BadReport) else f"body is not JSON: {error}"
            return self._reply(400, {"ok": False, "error": reason})
        try:
            self.server.sink(cluster, event)
        except Exception:  # a ledger failure is ours, not the agent's: 500 makes it retry
            log.exception("recording an agent event failed")
            return self._reply(500, {"ok": False, "error": "could not record the event"})
        self._reply(202, {"ok": True})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    tokens: dict[str, str]
    sink: Callable[[str, Event], None]


class WatcherServer:
    """``with WatcherServer({cluster: token}, sink) as server: server.url``"""

    def __init__(self, tokens: dict[str, str], sink: Callable[[str, Event], None], *,
                 host: str = "127.0.0.1", port: int = 0):
        self._server = _Server((host, port), _Handler)
        self._server.tokens = dict(tokens)
        self._server.sink = sink
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kit-watch-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> WatcherServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> WatcherServer:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def ledger_sink(ledger, wake: threading.Event | None = None) -> Callable[[str, Event], None]:
    """Record agent events in the ledger. A notice, a shutdown or the trainer's "done" wakes the
    watch loop at once (poll the cloud now / stop), instead of at the next interval."""
    from kit.watch.events import PREEMPTION, PROGRESS, REBALANCE, SHUTDOWN

    def sink(cluster: str, event: Event) -> None:
        ledger.record(event)
        urgent = event.kind in (PREEMPTION, REBALANCE, SHUTDOWN) or (
            event.kind == PROGRESS and event.detail.get("state") == "done")
        if wake is not None and urgent:
            wake.set()

    return sink

"""The agents' endpoint: ``POST /v1/clusters/{cluster}/events``.

Each cluster has its own secret (``cluster_token``), written once to ``<deploy_dir>/watcher/token``
(mode 0600, atomically; a file left empty or short is replaced), which never leaves the watcher's
machine: each node gets its own bearer token, ``node_token(cluster token, its instance id)``, from
bootstrap (cloud) or the local backend, and a post is accepted only with the token of the instance
its body names, so a node (or a stolen copy of its token) cannot report as another. Every body
names its instance (``training.messages.AgentReport`` requires one), so the token is checked after
the size checks and the parse, before anything is recorded; an empty cluster token is never served
nor accepted. Answers: 202 ``{"ok": true}`` (recorded), 400 (malformed body or Content-Length,
with the reason), 401 (missing token, or not the token of the instance the body names), 403 (a
report from an instance that is not one of the cluster's nodes, or at another rank), 404 (unknown
path or cluster), 405 (not POST), 408 (the body did not arrive within the 10 s socket timeout), 413
(body over 64 KiB). Every malformed body gets its 4xx: the agent does not retry those.

Slow clients cannot hold the server: every read times out after 10 s, a connection lives at most
``REQUEST_DEADLINE_S`` in all (a client trickling a byte every few seconds is cut off there), and
at most ``MAX_CONNECTIONS`` are served at once (more are closed at once, unread).

It is stdlib ``ThreadingHTTPServer`` in a daemon thread: the load is a few requests per node per
minute, and a dependency-free server keeps the watcher installable anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kit.watch.events import BadReport, Event, event_from_agent
from kit.watch.ledger import Ledger
from training.contract import write_atomic

log = logging.getLogger("kit.watch.server")

MAX_BODY = 64 * 1024
REQUEST_DEADLINE_S = 30.0  # a whole connection: request line, headers, body and reply
MAX_CONNECTIONS = 64       # served at once; an agent posts a few times a minute
PATH = re.compile(r"^/v1/clusters/(?P<cluster>[A-Za-z0-9][A-Za-z0-9_.-]{0,62})/events/?$")


TOKEN_BYTES = 32                                         # 256 bits (secrets.token_urlsafe)
TOKEN_CHARS = len(secrets.token_urlsafe(TOKEN_BYTES))    # its URL-safe base64 text: 43 characters


def cluster_token(deploy_dir: Path) -> str:
    """The cluster's token, created on first use (URL-safe, 256 bits). A token file that is empty or
    shorter than a generated token (a crash between creating and writing it, a truncated copy) is
    replaced by a new token: an empty expected token would let anyone post."""
    path = Path(deploy_dir) / "watcher" / "token"
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = None
    if token is not None and len(token) >= TOKEN_CHARS:
        return token
    if token is not None:
        log.warning("%s holds no usable token (%d characters): writing a new one; agents need a new bootstrap",
                    path, len(token))
    token = secrets.token_urlsafe(TOKEN_BYTES)
    # 0600 from creation, fsynced, renamed: the path never holds part of the secret, and a crash leaves
    # the old file or the new one, not an empty one
    write_atomic(path, token + "\n", durable=True, mode=0o600)
    return token


def node_token(cluster_token: str, instance: str) -> str:
    """The bearer token of one node: HMAC-SHA256 (RFC 2104, https://www.rfc-editor.org/rfc/rfc2104)
    of its instance id keyed by the cluster's token, in URL-safe base64 without padding (RFC 4648
    section 5, https://www.rfc-editor.org/rfc/rfc4648#section-5; 43 characters). The watcher derives
    it again from the instance a report names, so it stores nothing per node, and a token is good for
    its own instance only; without the cluster token no node's token can be computed. An instance that
    restarts under its id keeps its token; a replacement (a new id) gets its own at its bootstrap."""
    if not cluster_token:
        raise ValueError("an empty cluster token would let anyone compute every node's token")
    digest = hmac.new(cluster_token.encode(), instance.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Socket timeout (seconds) for every read: a client that stalls mid-request, or keeps an idle
    # connection open, loses its handler thread after this instead of holding it forever.
    timeout = 10

    def log_message(self, fmt: str, *args) -> None:  # route through logging, not stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    def setup(self) -> None:
        super().setup()
        # The per-read timeout does not stop a client that trickles a byte every few seconds: past
        # the deadline the socket is shut down, and the pending read ends.
        self._deadline = threading.Timer(self.server.deadline_s, self._cut_off)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut_off(self) -> None:
        log.info("closing a connection from %s: no complete request within %.0f s", self.address_string(),
                 self.server.deadline_s)
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:  # the client (or the deadline) closed the socket first
            pass

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
        """Each step replies itself (4xx) and returns None (False) when the request goes no further. A
        token is good for one instance, so it is checked against the parsed body's (a request with no
        bearer token at all is refused before its body is read)."""
        bearer = self._bearer()
        raw = self._body() if bearer is not None else None
        event = self._event(raw) if raw is not None else None
        if bearer is not None and event is not None and self._authorized(*bearer, event):
            self._record(bearer[0], event)

    def _bearer(self) -> tuple[str, str] | None:
        """The cluster the path names and the bearer token the request carries."""
        match = PATH.match(self.path)
        if not match:
            self._reply(404, {"ok": False, "error": f"no such endpoint {self.path}"})
            return None
        cluster = match.group("cluster")
        if cluster not in self.server.tokens:
            self._reply(404, {"ok": False, "error": f"this watcher does not watch cluster {cluster!r}"})
            return None
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            self._reply(401, {"ok": False, "error": "missing bearer token"})
            return None
        return cluster, given

    def _authorized(self, cluster: str, given: str, event: Event) -> bool:
        """``given`` is the token of the instance the report names (node_token). Constant-time compare
        (hmac.compare_digest, https://docs.python.org/3/library/hmac.html#hmac.compare_digest): the
        token is the only thing between the network and our ledger. An empty cluster token is never a
        match (WatcherServer refuses to serve one; this is the last line)."""
        secret = self.server.tokens[cluster]
        if not secret or not hmac.compare_digest(given.encode(), node_token(secret, event.instance).encode()):
            self._reply(401, {"ok": False, "error": f"wrong bearer token for instance {event.instance!r}"})
            return False
        return True

    def _body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._reply(400, {"ok": False, "error": "Content-Length required (a non-negative integer)"})
            return None
        if length < 0:  # rfile.read(-1) would read to EOF, past the size limit
            self._reply(400, {"ok": False, "error": f"Content-Length must be >= 0, got {length}"})
            return None
        if length > MAX_BODY:
            self._reply(413, {"ok": False, "error": f"body over {MAX_BODY} bytes"})
            return None
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            self._reply(408, {"ok": False, "error": f"body not received within {self.timeout} s"})
            return None
        if len(raw) < length:
            self._reply(400, {"ok": False, "error": f"body ended after {len(raw)} of {length} bytes"})
            return None
        return raw

    def _event(self, raw: bytes) -> Event | None:
        try:
            return event_from_agent(json.loads(raw))
        except BadReport as error:
            self._reply(400, {"ok": False, "error": str(error)})
            return None
        except (ValueError, UnicodeDecodeError, RecursionError) as error:  # RecursionError: nested too deep
            self._reply(400, {"ok": False, "error": f"body is not JSON this endpoint can read: "
                                                           f"{type(error).__name__}"})
            return None

    def _record(self, cluster: str, event: Event) -> None:
        try:
            self.server.sink(cluster, event)
        except NotANode as error:
            self._reply(403, {"ok": False, "error": str(error)})
            return
        except Exception:  # a ledger failure is ours, not the agent's: 500 makes it retry
            log.exception("recording an agent event failed")
            self._reply(500, {"ok": False, "error": "could not record the event"})
            return
        self._reply(202, {"ok": True})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    tokens: dict[str, str]
    sink: Callable[[str, Event], None]
    deadline_s: float = REQUEST_DEADLINE_S
    slots: threading.BoundedSemaphore

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            log.warning("refusing a connection from %s: %d already served", client_address[0], MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class WatcherServer:
    """``with WatcherServer({cluster: cluster_token}, sink) as server: server.url``; each node posts
    with its own ``node_token`` of that cluster token."""

    def __init__(self, tokens: dict[str, str], sink: Callable[[str, Event], None], *,
                 host: str = "127.0.0.1", port: int = 0, deadline_s: float = REQUEST_DEADLINE_S,
                 max_connections: int = MAX_CONNECTIONS):
        empty = sorted(cluster for cluster, token in tokens.items() if not token.strip())
        if empty:
            raise ValueError(f"an empty token would let anyone post for cluster(s) {', '.join(empty)}")
        self._server = _Server((host, port), _Handler)
        self._server.tokens = dict(tokens)
        self._server.sink = sink
        self._server.deadline_s = deadline_s
        self._server.slots = threading.BoundedSemaphore(max_connections)
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


class NotANode(ValueError):
    """A report from an instance the ledger has never had as a node of the cluster, or at another rank."""


def check_sender(ledger: Ledger, event: Event) -> None:
    """Only the cluster's own nodes report, each at its own rank: an instance the ledger has had as
    a node (now or earlier: a notice may arrive after the cloud listed the node gone)."""
    for node in ledger.all_nodes():
        if event.instance in (node.instance_id, node.name):
            if event.node_rank is not None and event.node_rank != node.rank:
                raise NotANode(f"{event.instance} is node {node.rank}, not node {event.node_rank}")
            return
    raise NotANode(f"{event.instance!r} is not a node of this cluster")


def ledger_sink(ledger: Ledger, wake: threading.Event | None = None) -> Callable[[str, Event], None]:
    """Record agent events from the cluster's nodes in the ledger. A notice, a shutdown or the
    trainer's "done" wakes the watch loop at once (poll the cloud now / stop), instead of at the
    next interval."""
    from kit.watch.events import PREEMPTION, PROGRESS, REBALANCE, SHUTDOWN

    def sink(cluster: str, event: Event) -> None:
        check_sender(ledger, event)
        ledger.record(event)
        urgent = event.kind in (PREEMPTION, REBALANCE, SHUTDOWN) or (
            event.kind == PROGRESS and event.detail.get("state") == "done")
        if wake is not None and urgent:
            wake.set()

    return sink

"""What ``kit train`` and ``kit watch`` share for one cluster: one session object.

``with Session(spec) as session``: the deployment directory's lock (one watcher per cluster) and
its ledger. ``session.start(...)`` then brings up the rest, in this order: the agents' token, the
policy, the backend (with its clock: the local backend's runs compressed), the agents' endpoint,
the event source, the actor and the watcher, and the progress puller. Leaving the block stops
the endpoint, closes the backend and releases the lock.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from kit.errors import InputError, KitError
from kit.watch.ledger import Ledger, WatcherLock

if TYPE_CHECKING:
    from kit.backends.base import Backend
    from kit.spec import SpecBase
    from kit.watch.server import WatcherServer

LEDGER_FILE = "ledger.sqlite"
LOCK_FILE = "watcher.lock"
log = logging.getLogger("kit.watch")


LISTEN_FIX = ("give an IPv4 address of this machine and a free port, e.g. --listen 127.0.0.1:0 (this machine only; "
              "port 0 picks a free one) or --listen 0.0.0.0:8787 (every interface)")


def parse_listen(listen: str) -> tuple[str, int]:
    """``--listen HOST:PORT`` -> (host, port), its form only (no socket; :func:`check_listen` tries it).
    IPv4 only: the endpoint is Python's ``http.server.ThreadingHTTPServer``, whose ``address_family`` is
    ``AF_INET`` (docs.python.org/3/library/socketserver.html), so an IPv6 host could never be bound."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"--listen {listen!r} is not HOST:PORT", where="--listen",
                         fix="e.g. --listen 0.0.0.0:8787 (port 0 picks a free one)")
    if ":" in host:  # [::1], ::1
        raise InputError(f"{listen!r} is an IPv6 address, and the agents' endpoint listens on IPv4 only",
                         where="--listen", fix=LISTEN_FIX)
    return host or "127.0.0.1", int(port)


def cannot_listen(listen: str, error: OSError, *, kind: type[KitError]) -> KitError:
    """The error for an address the endpoint cannot bind: not of this machine ("Cannot assign requested
    address"), not an address (a name that does not resolve), or a port in use."""
    return kind(f"cannot listen on {listen}: {error.strerror or error}", where="--listen", fix=LISTEN_FIX)


def check_listen(listen: str) -> tuple[str, int]:
    """:func:`parse_listen`, then a test bind of the address (closed at once), before anything is written:
    the endpoint binds only after the ledger, lock and token exist. With SO_REUSEADDR, as the server binds
    (``HTTPServer.allow_reuse_address``): a port left in TIME_WAIT by an earlier run is free, one that a
    process listens on is not (socket(7)). The port may still be taken before the real bind (then
    :meth:`Session.start` refuses it)."""
    import socket

    host, port = parse_listen(listen)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:  # socket.gaierror (a host that does not resolve) is one too
        raise cannot_listen(listen, error, kind=InputError) from None
    return host, port


MIN_INTERVAL_S = 0.1  # a poll loop faster than this only hammers the cloud's API (EC2 throttles callers)


def check_interval(interval_s: float | None) -> float | None:
    """``--interval`` (seconds between the watcher's polls of the cloud), refused unless a finite number
    of at least :data:`MIN_INTERVAL_S`; None: the backend's own (15 s for the clouds, SkyPilot's
    controller cadence; 0.5 s for the local cloud)."""
    import math

    if interval_s is not None and not (math.isfinite(interval_s) and interval_s >= MIN_INTERVAL_S):
        raise InputError(f"--interval {interval_s} must be a number of seconds >= {MIN_INTERVAL_S:g}",
                         where="--interval", fix="e.g. --interval 15 (agent notices wake the watcher earlier anyway)")
    return interval_s


def make_policy_for(spec: SpecBase):
    """The spec's ``policy`` section -> a kit.policy Policy. A ``default`` job that may move (several zones or
    shapes) decides its market as the simulator's multi-zone ``default`` does (its market is "the best spot
    offer the capacity search finds"): ``kit.policy.zones.moving_market_policy``."""
    from kit.policy import make_policy
    from kit.policy.zones import moving_market_policy

    section = spec.policy
    if section.name == "default" and spec.can_move:
        return moving_market_policy()
    params = {}
    if section.name == "threshold":
        t = section.threshold
        params = {"k": t.k, "window_hours": t.window_hours, "cooldown_hours": t.cooldown_hours}
    return make_policy(section.name, **params)


class Session:
    def __init__(self, spec: SpecBase, deploy_dir: Path):
        self.spec = spec
        self.deploy_dir = Path(deploy_dir)
        self.wake = threading.Event()  # an agent's notice or "done" ends the wait for the next tick
        self._lock: WatcherLock | None = None
        self._server: WatcherServer | None = None
        self._backend: Backend | None = None

    # ------------------------------------------------------------------ lock and ledger
    def __enter__(self) -> Session:  # noqa: PYI034
        try:  # a path under a file, or where one may not write (/sys, /proc): the user's to fix, as kit render's
            self.deploy_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise InputError(f"cannot create the deployment directory: {error.strerror or error}",
                             where=str(self.deploy_dir),
                             fix="choose a directory you can write (kit --deploy-dir DIR)") from None
        self._lock = WatcherLock(self.deploy_dir / LOCK_FILE)
        self._lock.__enter__()
        self.ledger = Ledger(self.deploy_dir / LEDGER_FILE)
        return self

    def reopen_ledger(self) -> None:
        """After the ledger file was moved aside (a fresh run of a finished job)."""
        self.ledger.close()
        self.ledger = Ledger(self.deploy_dir / LEDGER_FILE)

    def __exit__(self, *exc) -> None:
        try:
            if self._server is not None:
                self._server.stop()
            if self._backend is not None:
                self._backend.close()
        finally:
            if self._lock is not None:
                self._lock.__exit__(*exc)

    # ------------------------------------------------------------------ the rest
    def start(self, *, listen: str | None = None, advertise_url: str | None = None,
              interval_s: float | None = None) -> None:
        from kit.backends.cloud import backend_for
        from kit.watch import sources
        from kit.watch.acting import Actor
        from kit.watch.progress import ProgressPuller
        from kit.watch.server import WatcherServer, cluster_token, ledger_sink
        from kit.watch.watcher import Watcher

        spec = self.spec
        self.token = cluster_token(self.deploy_dir)
        self.policy = make_policy_for(spec)
        cloud = spec.cloud_facts
        listen = listen or cloud.listen_default(advertise_url)
        host, port = parse_listen(listen)
        try:  # checked early (check_listen), but another process may have taken the port since
            server = WatcherServer({spec.name: self.token}, ledger_sink(self.ledger, self.wake), host=host, port=port)
        except OSError as error:
            raise cannot_listen(listen, error, kind=KitError) from None
        self._server = server.start()
        self.url = cloud.agent_url(advertise_url, server.url, host in ("0.0.0.0", "::"))
        # the cluster's secret: the backend hands each node only its own token (kit.watch.server.node_token)
        backend = self._backend = backend_for(spec, self.deploy_dir, watcher_url=self.url, watcher_token=self.token)
        self.clock = backend.attach(self.ledger)
        self.interval_s = interval_s or backend.tick_interval_s
        source = sources.source_for(spec, self.deploy_dir)
        # The watcher's tick, in clock hours, is interval x scale, or longer when an apply +
        # bootstrap takes longer (kit.watch.watcher.Watcher.tick_hours).
        self.watcher = Watcher(spec, self.ledger, Actor(backend, self.ledger, spec, clock=self.clock, source=source),
                               self.policy, source=source, interval_s=self.interval_s, clock=self.clock,
                               time_scale=backend.time_scale)
        self.watcher.wake = self.wake
        self.puller = ProgressPuller(backend, self.ledger, source=spec.cloud, clock=self.clock,
                                     time_scale=backend.time_scale, every_s=backend.progress_every_s)

    def stop_early(self, announce) -> None:
        """The loop stopped before the job was done (Ctrl-C, SIGTERM, ``--once``, a failure): the backend
        stops what cannot outlive kit (the local nodes save, then stop; cloud nodes keep running), and the
        ledger records it now, so its view (``kit status``) does not charge nodes that stopped. A failure
        to record is only logged: the next run's first poll records the same, and the reason the loop
        stopped is what the user must see."""
        if not self.backend.interrupted(announce):
            return  # nothing stopped (cloud nodes run on): nothing to tell the ledger, no cloud call to fail again
        try:
            self.watcher.record_losses()
        except Exception as error:  # noqa: BLE001 - see above
            log.warning("could not record the stopped nodes now (the next run will): %s", error)

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("Session.start() has not run")
        return self._backend

    @property
    def server_url(self) -> str:
        if self._server is None:
            raise RuntimeError("Session.start() has not run")
        return self._server.url

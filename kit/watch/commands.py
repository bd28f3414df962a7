"""``kit watch SPEC`` and ``kit status SPEC``: wiring spec, ledger, server, source, backend, policy."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from rich.console import Console

from kit.errors import InputError, KitError

LEDGER_FILE = "ledger.sqlite"
LOCK_FILE = "watcher.lock"


def _load(spec_path: Path):
    try:
        from kit.render import deployment_dir
        from kit.spec import load_spec
    except ImportError as error:  # a partial checkout: the spec/render part is missing
        raise KitError(f"this kit has no spec loader ({error})", fix="install a complete kit") from error

    spec = load_spec(spec_path)
    return spec, Path(deployment_dir(spec))


def make_policy_for(spec):
    """The spec's ``policy{}`` section -> a kit.policy Policy (interface 5)."""
    from kit.policy import make_policy

    section = getattr(spec, "policy", None)
    name = getattr(section, "name", None) or "default"
    params = {}
    threshold = getattr(section, "threshold", None)
    if name == "threshold" and threshold is not None:
        params = {"k": threshold.k, "window_hours": threshold.window_hours, "cooldown_hours": threshold.cooldown_hours}
    return make_policy(name, **params)


def observation_type():
    """The Observation class the policy expects (interface 5)."""
    from kit.policy import Observation

    return Observation


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"--listen {listen!r} is not HOST:PORT", where="--listen",
                         fix="e.g. --listen 0.0.0.0:8787 (port 0 picks a free one)")
    return host or "127.0.0.1", int(port)


def status_line(result, report_cost, spec) -> str:
    progress = f"step {result.step}/{result.total_steps}" if result.step is not None else "no heartbeat yet"
    nodes = f"{result.nodes_up}/{spec.nodes} up" + (f", {result.nodes_lost} lost" if result.nodes_lost else "")
    action = ""
    if result.outcome is not None:
        action = f"  last action: {result.action} -> {result.outcome.status}"
    cost = "?" if report_cost["cost"] is None else f"${report_cost['cost']:,.2f}"
    clock = time.strftime("%H:%M:%S", time.localtime(result.now))
    return (f"[{clock}] {spec.name}: market [bold]{result.market or 'none'}[/bold], {nodes}, {progress}, "
            f"policy says {result.decision or '-'}{action}, cost {cost}")


def run_watch(spec_path: Path, *, interval_s: float, listen: str, advertise_url: str | None, once: bool) -> int:
    from rich.live import Live

    from kit.backends import cloud
    from kit.watch import sources
    from kit.watch.acting import Actor
    from kit.watch.ledger import Ledger, WatcherLock
    from kit.watch.progress import ProgressPuller
    from kit.watch.server import WatcherServer, cluster_token, ledger_sink
    from kit.watch.status import cost_of
    from kit.watch.watcher import Watcher

    if interval_s <= 0:
        raise InputError(f"--interval {interval_s} must be > 0", where="--interval", fix="e.g. --interval 15")
    host, port = parse_listen(listen)
    spec, deploy_dir = _load(spec_path)
    console = Console()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with WatcherLock(deploy_dir / LOCK_FILE):
        ledger = Ledger(deploy_dir / LEDGER_FILE)
        token = cluster_token(deploy_dir)
        policy = make_policy_for(spec)
        wake = threading.Event()
        with WatcherServer({spec.name: token}, ledger_sink(ledger, wake), host=host, port=port) as server:
            url = advertise_url or server.url
            console.print(f"watching [bold]{spec.name}[/bold] ({spec.cloud}) with policy {policy.name}; agents post to "
                          f"{url}/v1/clusters/{spec.name}/events (token in {deploy_dir / 'watcher' / 'token'})")
            backend = cloud.backend_for(spec, deploy_dir, watcher_url=url, watcher_token=token)
            source = sources.source_for(spec, deploy_dir)
            watcher = Watcher(spec, ledger, Actor(backend, ledger, spec, source=source), policy,
                              source=source, interval_s=interval_s, observation=observation_type())
            watcher.wake = wake
            stop = threading.Event()
            if once:
                stop.set()
            with Live(console=console, refresh_per_second=2, transient=False) as live:
                puller = ProgressPuller(backend, ledger, source=spec.cloud)

                def show(result) -> None:
                    if puller.pull() and not result.done:
                        wake.set()  # new progress: let the policy see it at once
                    live.update(status_line(result, cost_of(ledger, spec, result.now), spec))

                try:
                    result = watcher.run(stop, on_tick=show)
                except KeyboardInterrupt:
                    console.print("stopped; the ledger keeps everything: `kit watch` again continues")
                    return 130
        if result.done:
            console.print(f"[green]training done[/green] (step {result.step}/{result.total_steps})")
    return 0


def run_status(spec_path: Path, *, as_json: bool) -> None:
    from kit.watch.ledger import Ledger
    from kit.watch.status import render_status, status_report

    spec, deploy_dir = _load(spec_path)
    path = deploy_dir / LEDGER_FILE
    if not path.exists():
        raise KitError(f"no ledger for cluster {spec.name!r} yet", where=str(path),
                       fix=f"run `kit watch {spec_path}` (or `kit train`) first")
    report = status_report(Ledger(path), spec)
    if as_json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        render_status(report, Console())

"""``kit watch SPEC`` and ``kit status SPEC``: wiring spec, ledger, server, source, backend, policy."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from kit.errors import KitError, interrupted_exit_code
from kit.watch.session import (  # noqa: F401 - re-exported
    LEDGER_FILE,
    LOCK_FILE,
    check_interval,
    check_listen,
    make_policy_for,
)

if TYPE_CHECKING:
    from kit.spec import SpecBase


def _load(spec_path: Path):
    from kit.render import deployment_dir
    from kit.spec import load_spec

    spec = load_spec(spec_path)
    return spec, Path(deployment_dir(spec))


def status_line(result, report_cost, spec: SpecBase) -> str:
    progress = f"step {result.step}/{result.total_steps}" if result.step is not None else "no heartbeat yet"
    nodes = f"{result.nodes_up}/{spec.nodes} up" + (f", {result.nodes_lost} lost" if result.nodes_lost else "")
    action = ""
    if result.outcome is not None:
        action = f"  last action: {result.action} -> {result.outcome.status}"
    cost = "?" if report_cost["cost"] is None else f"${report_cost['cost']:,.2f}"
    clock = time.strftime("%H:%M:%S", time.localtime(result.now))
    return (f"{escape(f'[{clock}] {spec.name}')}: market [bold]{escape(result.market or 'none')}[/bold], "
            + escape(f"{nodes}, {progress}, policy says {result.decision or '-'}{action}, cost {cost}"))


def run_watch(spec_path: Path, *, interval_s: float, listen: str, advertise_url: str | None, once: bool) -> int:
    from rich.live import Live

    from kit.watch.session import Session
    from kit.watch.status import cost_of

    check_interval(interval_s)
    check_listen(listen)  # the endpoint binds after the ledger, lock and token were written: tried first
    spec, deploy_dir = _load(spec_path)
    console = Console()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with Session(spec, deploy_dir) as session:
        session.start(listen=listen, advertise_url=advertise_url, interval_s=interval_s)
        console.print(f"watching [bold]{spec.name}[/bold] " + escape(
            f"({spec.cloud}) with policy {session.policy.name}; agents post to "
            f"{session.url or session.server_url}/v1/clusters/{spec.name}/events (token in {deploy_dir / 'watcher' / 'token'})"))
        stop = threading.Event()
        if once:
            stop.set()
        session.backend.start()
        with Live(console=console, refresh_per_second=2, transient=False) as live:

            def show(result) -> None:
                if session.puller.pull() and not result.done:
                    session.wake.set()  # new progress: let the policy see it at once
                session.backend.on_tick()
                live.update(status_line(result, cost_of(session.ledger, spec, result.now), spec))

            def announce(note: str) -> None:
                console.print(escape(f"stopping: {note}"))

            try:
                result = session.watcher.run(stop, on_tick=show)
            except BaseException as error:  # the loop failed or was interrupted: nothing it started runs on unseen
                session.stop_early(announce)
                if not isinstance(error, KeyboardInterrupt):
                    raise
                console.print("stopped; the ledger keeps everything: `kit watch` again continues")
                return interrupted_exit_code(error)
            if not result.done:  # --once
                session.stop_early(announce)
    if result.done:
        console.print(f"[green]training done[/green] (step {result.step}/{result.total_steps})")
    return 0


def _as_of(ledger, spec: SpecBase, deploy_dir: Path) -> tuple[float | None, bool]:
    """When the status's figures stand, and whether the job's nodes stopped with a kit that is gone: a finished
    job's as it ended (its disks and hours do not go on counting); a job whose nodes cannot outlive kit (the
    local cloud's) left up in the ledger while no kit runs it (kit was killed: nothing recorded their end) as
    of the ledger's last record; any other now (None)."""
    from kit.watch.ledger import WatcherLock

    ended = ledger.ended_at()
    if ended is not None:
        return ended, False
    if spec.cloud_facts.nodes_outlive_kit or not ledger.nodes(("up",)) or WatcherLock.held(deploy_dir / LOCK_FILE):
        return None, False
    return ledger.last_record(), True


def run_status(spec_path: Path, *, as_json: bool) -> None:
    from kit.watch.ledger import Ledger
    from kit.watch.status import render_status, status_report

    spec, deploy_dir = _load(spec_path)
    path = deploy_dir / LEDGER_FILE
    if not path.exists():
        raise KitError(f"no ledger for cluster {spec.name!r} yet", where=str(path),
                       fix=f"run `kit watch {spec_path}` (or `kit train`) first")
    ledger = Ledger(path)
    now, stopped_with_kit = _as_of(ledger, spec, deploy_dir)
    report = {**status_report(ledger, spec, now=now), "stopped_with_kit": stopped_with_kit}
    if as_json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        render_status(report, Console())

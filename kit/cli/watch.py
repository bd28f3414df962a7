"""``kit watch`` and ``kit status``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import App

app = App()


@app.command("watch")
def watch(
    spec: Annotated[Path, typer.Argument(help="cluster.yaml of the cluster to watch")],
    interval: Annotated[float, typer.Option(help="seconds between cloud polls (agent notices wake it early)")] = 15.0,
    listen: Annotated[str, typer.Option(help="HOST:PORT for the agents' endpoint (port 0: any free)")] = "127.0.0.1:0",
    advertise_url: Annotated[str | None, typer.Option(help="URL the nodes reach the endpoint at")] = None,
    once: Annotated[bool, typer.Option(help="run one tick and exit")] = False,
) -> None:
    """Watch a cluster: record preemptions and progress, let the policy pick the market, re-apply."""
    from kit.watch.commands import run_watch

    raise typer.Exit(run_watch(spec, interval_s=interval, listen=listen, advertise_url=advertise_url, once=once))


@app.command("status")
def status(
    spec: Annotated[Path | None, typer.Argument(
        help="cluster.yaml of the cluster (default: the built-in examples/local.yaml, as `kit train`)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """The ledger's view: nodes, market, preemptions, decisions, progress and cost so far."""
    from kit.paths import DEFAULT_SPEC
    from kit.watch.commands import run_status

    run_status(spec or DEFAULT_SPEC, as_json=json_out)

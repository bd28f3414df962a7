"""The ``kit`` command line. Each command lives in the module of its concern; this file only wires them.

Imports inside commands are deferred so ``kit --help`` stays fast (torch, boto3 and google
clients are heavy).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kit import __version__
from kit.errors import KitError
from kit.paths import DEFAULT_DEPLOY_ROOT, DEPLOY_ROOT_ENV

app = typer.Typer(
    name="kit",
    help="Train on cheap spot GPUs across AWS and GCP: render, apply, bootstrap, watch, report.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err_console = Console(stderr=True)


def fail(error: KitError) -> None:
    """Print a user-fixable error (no traceback) and exit with its code."""
    err_console.print(f"[bold red]error:[/bold red] {error.render()}", highlight=False, soft_wrap=True)
    raise typer.Exit(error.exit_code)


@app.callback()
def _root(
    deploy_dir: Annotated[Path | None, typer.Option(
        "--deploy-dir", envvar=DEPLOY_ROOT_ENV, file_okay=False,
        help="where deployments go: DIR/<name>/ holds the rendered Terraform, the ledger, local nodes' "
             f"disks and the export (default: ./{DEFAULT_DEPLOY_ROOT})")] = None,
) -> None:
    """Train on cheap spot GPUs across AWS and GCP: render, apply, bootstrap, watch, report."""
    if deploy_dir is not None:  # one place decides (kit.paths.deploy_root); child processes inherit it
        os.environ[DEPLOY_ROOT_ENV] = str(deploy_dir.expanduser().absolute())


@app.command()
def version() -> None:
    """Print kit's version."""
    typer.echo(__version__)


@app.command()
def watch(
    spec: Annotated[Path, typer.Argument(help="cluster.yaml of the cluster to watch")],
    interval: Annotated[float, typer.Option(help="seconds between cloud polls (agent notices wake it early)")] = 15.0,
    listen: Annotated[str, typer.Option(help="HOST:PORT for the agents' endpoint (port 0: any free)")] = "127.0.0.1:0",
    advertise_url: Annotated[str | None, typer.Option(help="URL the nodes reach the endpoint at")] = None,
    once: Annotated[bool, typer.Option(help="run one tick and exit")] = False,
) -> None:
    """Watch a cluster: record preemptions and progress, let the policy pick the market, re-apply."""
    from kit.watch.commands import run_watch

    try:
        code = run_watch(spec, interval_s=interval, listen=listen, advertise_url=advertise_url, once=once)
    except KitError as error:
        fail(error)
    raise typer.Exit(code)


@app.command()
def status(
    spec: Annotated[Path, typer.Argument(help="cluster.yaml of the cluster")],
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """The ledger's view: nodes, market, preemptions, decisions, progress and cost so far."""
    from kit.watch.commands import run_status

    try:
        run_status(spec, as_json=json_out)
    except KitError as error:
        fail(error)


# ---------------------------------------------------------------------------------------------
# Command groups of the other concerns. Each module defines ``register(app)`` which adds its
# commands with ``app.command()(function)``; ``kit --help`` lists them in the workflow's order.
def _register_parts() -> None:
    from kit import bootstrap_cli, infra_cli, simulate_cli, train_cli

    for part in (train_cli, infra_cli, bootstrap_cli, simulate_cli):
        part.register(app)


_register_parts()


def main() -> None:  # pragma: no cover - console entry point alternative
    try:
        app()
    except KitError as error:  # commands normally catch their own; this is the last net
        err_console.print(f"[bold red]error:[/bold red] {error.render()}")
        sys.exit(error.exit_code)

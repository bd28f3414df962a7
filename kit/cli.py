"""The ``kit`` command line. Each command lives in the module of its concern; this file only wires them.

Imports inside commands are deferred so ``kit --help`` stays fast (torch, boto3 and google
clients are heavy).
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from kit import __version__
from kit.errors import KitError

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
def _root() -> None:
    """Train on cheap spot GPUs across AWS and GCP: render, apply, bootstrap, watch, report."""


@app.command()
def version() -> None:
    """Print kit's version."""
    typer.echo(__version__)


def main() -> None:  # pragma: no cover - console entry point alternative
    try:
        app()
    except KitError as error:  # commands normally catch their own; this is the last net
        err_console.print(f"[bold red]error:[/bold red] {error.render()}")
        sys.exit(error.exit_code)

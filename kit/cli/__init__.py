"""The ``kit`` command line: a package of Typer apps, one per concern, merged into one command set.

``kit.cli.train`` (train), ``kit.cli.infra`` (example, validate, render, plan, apply, destroy),
``kit.cli.bootstrap`` (bootstrap), ``kit.cli.watch`` (watch, status), ``kit.cli.simulate``
(simulate, traces). Every command goes through the one error handler in ``kit.cli.app``.
Imports inside commands are deferred so ``kit --help`` stays fast (torch, boto3 and google
clients are heavy).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kit import __version__
from kit.cli import bootstrap, infra, simulate, train, watch
from kit.cli.app import App
from kit.paths import DEFAULT_DEPLOY_ROOT, DEPLOY_ROOT_ENV

app = App(name="kit", help="Train on cheap spot GPUs across AWS and GCP: render, apply, bootstrap, watch, report.",
          no_args_is_help=True)


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


# in the order `kit --help` lists them: the workflow's
for part in (train, infra, bootstrap, watch, simulate):
    app.add_typer(part.app)

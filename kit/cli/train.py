"""``kit train``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import App

app = App()


@app.command("train")
def train(
    spec: Annotated[Path | None, typer.Argument(help="cluster.yaml (default: the built-in examples/local.yaml)")] = None,
    cloud: Annotated[str | None, typer.Option(help="local|aws|gcp (must match the spec)")] = None,
    time_scale: Annotated[float | None, typer.Option(help="local: trace seconds per wall second")] = None,
    preempt_every: Annotated[float | None, typer.Option(help="local: preempt a spot node every S wall seconds")] = None,
    no_preemptions: Annotated[bool, typer.Option("--no-preemptions", help="local: no injected preemptions")] = False,
    json_report: Annotated[Path | None, typer.Option(help="write the cost report as JSON")] = None,
    plot: Annotated[Path | None, typer.Option(help="PNG of progress over time, markets, preemptions")] = None,
    keep_disks: Annotated[bool, typer.Option("--keep-disks", help="keep the data disks after completion")] = False,
    interval: Annotated[float | None, typer.Option(
        help="seconds between cloud polls (agent notices wake it early; default 15, local 0.5)")] = None,
    listen: Annotated[str | None, typer.Option(help="HOST:PORT of the agents' endpoint (default 127.0.0.1:0; 0.0.0.0:8787 with --advertise-url)")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="train again although this spec's job already "
                                                         "finished (the finished run is kept under previous/)")] = False,
    advertise_url: Annotated[str | None, typer.Option(
        help="URL the nodes reach that endpoint at (clouds; without it the agents do not post and kit "
             "reads progress over SSH)")] = None,
) -> None:
    """Train on spot nodes: apply, bootstrap, watch, recover, report cost, tear down."""
    from kit import clouds
    from kit.errors import InputError
    from kit.train import run_train

    if cloud is not None and cloud not in clouds.NAMES:
        raise InputError(f"unknown cloud {cloud!r}", where="--cloud", fix=f"use one of: {', '.join(clouds.NAMES)}")
    run_train(spec, cloud=cloud, time_scale=time_scale, preempt_every=preempt_every,
              no_preemptions=no_preemptions, json_report=json_report, plot=plot, keep_disks=keep_disks,
              interval_s=interval, listen=listen, advertise_url=advertise_url, fresh=fresh)

"""``kit validate``, ``kit render``, ``kit plan``, ``kit apply``, ``kit destroy``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console()

SpecArg = Annotated[Path, typer.Argument(help="cluster.yaml")]


def _fail(error) -> None:
    from kit.cli import fail

    fail(error)


def warn_about(spec) -> None:
    """What a valid spec still risks (kit.spec.spec_warnings), before anything acts on it."""
    from kit.spec import spec_warnings

    for warning in spec_warnings(spec):
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)


def example(
    name: Annotated[str | None, typer.Argument(help="example to print (no name: list them)")] = None,
) -> None:
    """Print one of kit's example specs, to start a cluster.yaml from: `kit example gcp-a3-spot > cluster.yaml`."""
    from kit.errors import InputError
    from kit.paths import EXAMPLES_DIR

    examples = {p.stem: p for p in sorted(EXAMPLES_DIR.glob("*.yaml"))}
    if name is None:
        for stem, path in examples.items():
            first = next((line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.strip()), "")
            console.print(f"{stem:<14} {first}", highlight=False, soft_wrap=True)
        return
    path = examples.get(name.removesuffix(".yaml"))
    if path is None:
        _fail(InputError(f"no example named {name!r}", where="kit example NAME",
                         fix=f"use one of: {', '.join(examples)}"))
        return
    typer.echo(path.read_text(), nl=False)


def validate(spec: SpecArg) -> None:
    """Check a cluster spec; exit 2 with the field and the fix when it is wrong."""
    from kit.errors import KitError
    from kit.spec import load_spec

    try:
        s = load_spec(spec)
    except KitError as error:
        _fail(error)
        return
    console.print(f"[green]ok[/green] {spec}: {s.nodes} x {s.instance_type or 'local node'} "
                  f"({s.gpus_per_node} GPU each) on {s.cloud} {s.zone or ''} {s.market}", highlight=False)
    warn_about(s)


def render(
    spec: SpecArg,
    out: Annotated[Path | None, typer.Option("--out", help="deployment directory (default deploy/<name>)")] = None,
    market: Annotated[str | None, typer.Option(help="spot or on-demand (default: the spec's)")] = None,
) -> None:
    """Write the Terraform root modules (cluster + disks) for a spec."""
    from kit.errors import KitError
    from kit.spec import load_spec

    try:
        s = load_spec(spec)
        from kit import render as r

        out_dir = out or r.deployment_dir(s)
        warn_about(s)
        files = r.render(s, out_dir, market=market)
    except KitError as error:
        _fail(error)
        return
    console.print(f"rendered {len(files)} files into {out_dir}", highlight=False)


def plan(
    spec: SpecArg,
    out: Annotated[Path | None, typer.Option("--out", help="deployment directory (default deploy/<name>)")] = None,
    market: Annotated[str | None, typer.Option(help="spot or on-demand (default: the spec's)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="text or markdown (for PR comments)")] = "text",
) -> None:
    """Render, init and plan; saves the plans and prints every resource change, replacements with
    their reasons, and the cost per hour now and after. `kit apply` applies exactly these plans."""
    from kit import terraform
    from kit.backends.gcp_firewall import network_warnings
    from kit.errors import InputError, KitError
    from kit.plan_summary import hourly_cost
    from kit.spec import check_ssh_key, load_spec

    try:
        if fmt not in ("text", "markdown"):
            raise InputError(f"unknown format {fmt!r}", where="--format", fix="use text or markdown")
        s = load_spec(spec)
        from kit import render as r

        out_dir = out or r.deployment_dir(s)
        check_ssh_key(s)
        warn_about(s)
        r.render(s, out_dir, market=market)
        summary = terraform.plan(out_dir)
        summary.cost = hourly_cost(s, market or s.market, terraform.deployed_nodes(out_dir))
        summary.warnings = network_warnings(s)
    except KitError as error:
        _fail(error)
        return
    typer.echo(summary.markdown() if fmt == "markdown" else summary.text())


def apply(
    spec: SpecArg,
    out: Annotated[Path | None, typer.Option("--out", help="deployment directory (default deploy/<name>)")] = None,
) -> None:
    """Apply the plan saved by ``kit plan``."""
    from kit import terraform
    from kit.errors import KitError
    from kit.spec import load_spec

    try:
        s = load_spec(spec)
        from kit import render as r

        out_dir = out or r.deployment_dir(s)
        terraform.apply(out_dir, parallelism=s.nodes)
        outputs = terraform.output(out_dir)
    except KitError as error:
        _fail(error)
        return
    for node in outputs.get("nodes") or []:
        console.print(f"{node.get('name')}: {node.get('public_ip') or node.get('private_ip')} "
                      f"({node.get('market')})", highlight=False)


def destroy(
    spec: SpecArg,
    out: Annotated[Path | None, typer.Option("--out", help="deployment directory (default deploy/<name>)")] = None,
    with_disks: Annotated[bool, typer.Option("--with-disks", help="also destroy the data disks (checkpoints!)")] = False,
) -> None:
    """Destroy the instances; the data disks stay unless --with-disks."""
    from kit import terraform
    from kit.errors import KitError
    from kit.spec import load_spec

    try:
        s = load_spec(spec)
        from kit import render as r

        out_dir = out or r.deployment_dir(s)
        terraform.destroy(out_dir, with_disks=with_disks)
    except KitError as error:
        _fail(error)
        return
    console.print("destroyed" + (" (disks too)" if with_disks else " (disks kept)"))


def register(app: typer.Typer) -> None:
    app.command("example")(example)
    app.command("validate")(validate)
    app.command("render")(render)
    app.command("plan")(plan)
    app.command("apply")(apply)
    app.command("destroy")(destroy)

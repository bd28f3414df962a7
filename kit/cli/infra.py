"""``kit example``, ``kit validate``, ``kit render``, ``kit plan``, ``kit apply``, ``kit destroy``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from kit.cli.app import App

if TYPE_CHECKING:
    from kit.spec import SpecBase

app = App()
console = Console()

SpecArg = Annotated[Path, typer.Argument(help="cluster.yaml")]
OutOption = Annotated[Path | None, typer.Option("--out", help="deployment directory (default deploy/<name>)")]
MarketOption = Annotated[str | None, typer.Option(help="spot or on-demand (default: the spec's)")]


def warn_about(spec: SpecBase) -> None:
    """What a valid spec still risks (kit.spec.spec_warnings), before anything acts on it."""
    from kit.spec import spec_warnings

    for warning in spec_warnings(spec):
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)


def require_terraform(spec: SpecBase, command: str, fix: str) -> None:
    """``kit apply``, ``destroy`` and ``bootstrap`` act on the nodes Terraform made: a cloud that renders no
    Terraform (the local one: its nodes are processes of ``kit train``, docs/local.md) is refused first,
    with what to use instead, not sent on to "run `kit render`", which refuses it too."""
    from kit import clouds
    from kit.errors import InputError

    if not spec.cloud_facts.renders_terraform:
        terraform_clouds = " and ".join(name for name in clouds.NAMES if clouds.get(name).renders_terraform)
        raise InputError(f"cloud {spec.cloud!r} has no Terraform: `kit {command}` is for {terraform_clouds}",
                         where="spec.cloud", fix=fix)


def _deployment(spec: Path, out: Path | None):
    """The loaded spec and its deployment directory (``--out`` or ``deploy/<name>``)."""
    from kit.render import deployment_dir
    from kit.spec import load_spec

    s = load_spec(spec)
    return s, out or deployment_dir(s)


@app.command("example")
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
            console.print(escape(f"{stem:<14} {first}"), highlight=False, soft_wrap=True)
        return
    chosen = examples.get(name.removesuffix(".yaml"))
    if chosen is None:
        raise InputError(f"no example named {name!r}", where="kit example NAME", fix=f"use one of: {', '.join(examples)}")
    typer.echo(chosen.read_text(), nl=False)


@app.command("validate")
def validate(spec: SpecArg) -> None:
    """Check a cluster spec; exit 2 with the field and the fix when it is wrong."""
    from kit.spec import load_spec

    s = load_spec(spec)
    console.print(f"[green]ok[/green] {escape(str(spec))}: {escape(s.summary)}", highlight=False)
    warn_about(s)


@app.command("render")
def render(spec: SpecArg, out: OutOption = None, market: MarketOption = None) -> None:
    """Write the Terraform root modules (cluster + disks) for a spec."""
    from kit import render as r
    from kit import terraform

    s, out_dir = _deployment(spec, out)
    warn_about(s)
    terraform.refuse_region_change(out_dir, getattr(s, "region", None))
    files = r.render(s, out_dir, market=market)
    console.print(escape(f"rendered {len(files)} files into {out_dir}"), highlight=False)


@app.command("plan")
def plan(
    spec: SpecArg,
    out: OutOption = None,
    market: MarketOption = None,
    fmt: Annotated[str, typer.Option("--format", help="text or markdown (for PR comments)")] = "text",
) -> None:
    """Render, init and plan: every resource change (replacements with their reasons), cost per hour.

    The plans are saved; `kit apply` applies exactly these."""
    from kit import render as r
    from kit import terraform
    from kit.errors import InputError
    from kit.plan_summary import hourly_cost
    from kit.spec import check_ssh_key

    if fmt not in ("text", "markdown"):
        raise InputError(f"unknown format {fmt!r}", where="--format", fix="use text or markdown")
    s, out_dir = _deployment(spec, out)
    check_ssh_key(s)
    warn_about(s)
    terraform.refuse_region_change(out_dir, getattr(s, "region", None))
    r.render(s, out_dir, market=market)
    summary = terraform.plan(out_dir, roots=r.roots(s))
    here = s.prices.of(s.start_zone)
    summary.cost = hourly_cost((here.spot_per_hour, here.on_demand_per_hour), s.nodes, market or s.market,
                               terraform.deployed_nodes(out_dir))
    summary.warnings = s.cloud_facts.plan_warnings(s)
    typer.echo(summary.markdown() if fmt == "markdown" else summary.text())


@app.command("apply")
def apply(spec: SpecArg, out: OutOption = None) -> None:
    """Apply the plans saved (and shown) by `kit plan`."""
    from kit import render, terraform

    s, out_dir = _deployment(spec, out)
    require_terraform(s, "apply", "`kit train SPEC` starts a local cluster's nodes (and the watcher)")
    terraform.apply(out_dir, parallelism=s.nodes, roots=render.roots(s))
    for node in terraform.output(out_dir).get("nodes") or []:
        console.print(escape(f"{node.get('name')}: {node.get('public_ip') or node.get('private_ip')} "
                             f"({node.get('market')})"), highlight=False)


@app.command("destroy")
def destroy(
    spec: SpecArg,
    out: OutOption = None,
    with_disks: Annotated[bool, typer.Option("--with-disks", help="also destroy the data disks (checkpoints!)")] = False,
) -> None:
    """Destroy the instances; the data disks stay unless --with-disks."""
    from kit import render, terraform

    s, out_dir = _deployment(spec, out)
    require_terraform(s, "destroy", "`kit train SPEC` stops a local cluster's nodes when it ends (or on Ctrl-C); "
                                    f"the data disks it keeps are directories under {out_dir}: delete them with rm -r")
    terraform.destroy(out_dir, with_disks=with_disks, roots=render.roots(s))
    console.print("destroyed" + (" (disks too)" if with_disks else " (disks kept)"))

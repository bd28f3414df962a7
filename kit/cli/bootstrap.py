"""``kit bootstrap SPEC [--hosts inventory.yml] [--check] [-e k=v] [--limit] [-v]``."""
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


def _progress_printer(verbose: int):
    def on_event(ev: dict) -> None:
        kind = ev.get("event")
        data = ev.get("event_data") or {}
        host, task = escape(str(data.get("host", ""))), escape(str(data.get("task", "")))  # not markup
        if kind == "playbook_on_task_start" and verbose:
            console.print(f"[bold]TASK[/bold] {task}", highlight=False)
        elif kind == "runner_on_ok":
            changed = (data.get("res") or {}).get("changed")
            if changed or verbose:
                console.print(f"  [{'yellow' if changed else 'green'}]{'changed' if changed else 'ok'}[/] "
                              f"{host}: {task}", highlight=False)
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            console.print(f"  [red]failed[/red] {host}: {task}", highlight=False)
        elif kind == "runner_on_unreachable":
            console.print(f"  [red]unreachable[/red] {host}: {task}", highlight=False)
        elif kind == "runner_on_skipped" and verbose > 1:
            console.print(f"  [dim]skipped {host}: {task}[/dim]", highlight=False)
    return on_event


def _inventory(spec: SpecBase, hosts: Path | None) -> dict:
    """The ansible inventory: the --hosts file, else the cluster's terraform output."""
    from kit import bootstrap as bs
    from kit.errors import InputError
    from kit.yamlfile import read_yaml

    if hosts is None:
        from kit import terraform
        from kit.backends.cloud import TerraformBackend, output_nodes
        from kit.render import deployment_dir

        backend = TerraformBackend(spec, deployment_dir(spec))  # type: ignore[arg-type]
        outputs = terraform.output(backend.deploy_dir)
        return bs.inventory_from_spec(spec, outputs, known_hosts=backend.known_hosts(output_nodes(outputs)))
    inventory = read_yaml(hosts, what="inventory", fix="pass an ansible YAML inventory")
    shape = "use the ansible YAML inventory shape: all: {hosts: {name: {ansible_host: ...}}, vars: {...}}"
    if not isinstance(inventory, dict) or "all" not in inventory:
        raise InputError("inventory has no `all` group", where=str(hosts), fix=shape)
    group = inventory["all"]
    if not isinstance(group, dict) or not isinstance(group.get("hosts") or {}, dict) \
            or not isinstance(group.get("vars") or {}, dict):
        raise InputError("`all` must be a mapping whose hosts and vars are mappings", where=f"{hosts}: all", fix=shape)
    return inventory


@app.command("bootstrap")
def bootstrap(
    spec: Annotated[Path, typer.Argument(help="cluster.yaml")],
    hosts: Annotated[Path | None, typer.Option("--hosts", help="inventory YAML (default: from terraform output)")] = None,
    check: Annotated[bool, typer.Option("--check", help="dry run (ansible --check --diff)")] = False,
    extra: Annotated[list[str] | None, typer.Option("-e", "--extra-vars", help="key=value")] = None,
    limit: Annotated[str | None, typer.Option("--limit", help="ansible host pattern")] = None,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True)] = 0,
) -> None:
    """Install the driver, the trainer and the preemption agent on the cluster's nodes (ansible)."""
    from kit import bootstrap as bs
    from kit.cli.infra import require_terraform
    from kit.spec import load_spec

    s = load_spec(spec)
    require_terraform(s, "bootstrap", "`kit train SPEC` starts and bootstraps a local cluster's nodes itself")
    extra_vars = bs.parse_extra_vars(extra)
    inventory = _inventory(s, hosts)
    n = len((inventory.get("all") or {}).get("hosts") or {})
    console.print(escape(f"bootstrapping {n} host(s){' (check mode)' if check else ''}"), highlight=False)
    result = bs.bootstrap_nodes(inventory, check=check, limit=limit, extra_vars=extra_vars,
                                verbosity=verbose, on_event=_progress_printer(verbose))
    for host, st in sorted(result.stats.items()):
        console.print(escape(f"{host}: ok={st.get('ok', 0)} changed={st.get('changed', 0)} "
                             f"failed={st.get('failures', 0)} unreachable={st.get('dark', 0)}"), highlight=False)
    if not result.ok:
        for host, msgs in sorted(result.failures.items()):
            console.print(f"[red]{escape(host)}[/red] failed:", highlight=False)
            for msg in msgs:
                console.print(escape(f"  - {msg}"), highlight=False)
        raise typer.Exit(1)
    console.print("[green]bootstrap done[/green]")

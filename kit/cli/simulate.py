"""``kit simulate`` (replay spot traces against the policies; the models in kit/simulate/) and ``kit traces``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kit.cli.app import App
from kit.paths import check_plot_file
from kit.policy import DEFAULT_CHANGEOVER_H
from kit.policy.offers import DEFAULT_CHECKPOINT_GB, DEFAULT_TRANSFER_GBPS, EACH, Moves

if TYPE_CHECKING:  # the simulator loads only when a command runs
    from kit.simulate.zones import Offers

app = App()


def _policies(policy: str) -> list[str]:
    from kit.errors import InputError
    from kit.simulate import ALL_POLICIES

    if policy == "all":
        return list(ALL_POLICIES)
    names = [p.strip() for p in policy.split(",") if p.strip()]
    bad = [p for p in names if p not in ALL_POLICIES]
    if bad or not names:
        raise InputError(f"unknown policy {', '.join(bad) or policy!r}", where="--policy",
                         fix=f"use one of: {', '.join(ALL_POLICIES)}, all (or a comma-separated list)")
    return names


@app.command("simulate")
def simulate_command(
    traces: Annotated[list[Path], typer.Argument(
        help="trace .json files, directories of them, or a bundled set by name (`kit traces` lists them)")],
    policy: Annotated[str, typer.Option(help="policy name, 'opt' (omniscient bound) or 'all'")] = "all",
    nodes: Annotated[int, typer.Option(help="gang size N: spot usable in a tick iff its count >= N")] = 16,
    job_hours: Annotated[float, typer.Option(help="compute the job needs, C0 (h)")] = 48.0,
    deadline_hours: Annotated[float, typer.Option(help="deadline R0 from the start (h)")] = 60.0,
    changeover_hours: Annotated[float, typer.Option(help="billed setup per launch, d (h)")] = DEFAULT_CHANGEOVER_H,
    starts: Annotated[int, typer.Option(help="start ticks per trace, K")] = 8,
    spot_price: Annotated[float | None, typer.Option(help="spot $/h per node when a trace has none")] = None,
    on_demand_price: Annotated[float | None, typer.Option(help="on-demand $/h per node when a trace has none")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one line of JSON")] = False,
    plot_file: Annotated[Path | None, typer.Option("--plot", help="write a PNG: progress for one start + cost bars")] = None,
    zones: Annotated[str, typer.Option(help="'each': every trace as its own one-zone market; 'all': the traces as one "
                                            "multi-zone market (offers, probes, moves); or zones z1,z2 of the set")] = EACH,
    offers: Annotated[Path | None, typer.Option(help="YAML offers file: the instance shapes (multi-zone only)")] = None,
    shape: Annotated[list[str] | None, typer.Option(help="an instance shape, TYPE:NODES[:GPUS_PER_NODE[:MARKETS]], "
                                                         "MARKETS spot, on-demand or spot+on-demand; repeat for "
                                                         "several (multi-zone only; instead of --offers)")] = None,
    checkpoint_gb: Annotated[float | None, typer.Option(help=f"checkpoint size moved with the job, GB (default "
                                                              f"{DEFAULT_CHECKPOINT_GB:g}; multi-zone only)")] = None,
    transfer_gbps: Annotated[float | None, typer.Option(help=f"checkpoint transfer rate between zones, Gbit/s (default "
                                                              f"{DEFAULT_TRANSFER_GBPS:g}; multi-zone only)")] = None,
    egress_per_gb: Annotated[float | None, typer.Option(help="$ per GB across regions (default: the clouds' "
                                                               "list prices, docs/policies.md; multi-zone only)")] = None,
) -> None:
    """Replay spot capacity traces: cost vs on-demand and deadline misses per policy (and opt)."""
    import json

    from kit.errors import InputError
    from kit.simulate import simulate
    from kit.simulate.plot import plot
    from kit.simulate.single import DEFAULT_ON_DEMAND_PRICE, DEFAULT_SPOT_PRICE, Params
    from kit.traces import load_traces

    params = Params(nodes=nodes, job_h=job_hours, deadline_h=deadline_hours, changeover_h=changeover_hours,
                    starts=starts, spot_price=spot_price if spot_price is not None else DEFAULT_SPOT_PRICE,
                    on_demand_price=on_demand_price if on_demand_price is not None else DEFAULT_ON_DEMAND_PRICE)
    moves = _moves(zones, checkpoint_gb, transfer_gbps, egress_per_gb)
    if moves is not None:
        _simulate_zones(traces, policy, zones, _shapes(offers, shape), json_out, plot_file, params, moves)
        return
    if offers is not None or shape:
        raise InputError("instance shapes describe a multi-zone market", where="--shape" if shape else "--offers",
                         fix="add --zones all")
    names = _policies(policy)
    if plot_file is not None:
        check_plot_file(plot_file)
    params.check()
    loaded = load_traces(traces)
    summary = simulate(loaded, names, params)
    _require_runs(summary, traces, params.deadline_h)
    if plot_file is not None:
        plot(loaded, names, params, summary, str(plot_file))
        summary["plot"] = str(plot_file)
    if json_out:
        typer.echo(json.dumps(summary, separators=(",", ":")))
        return
    _print_table(summary, names)


def _moves(zones: str, checkpoint_gb: float | None, transfer_gbps: float | None,
           egress_per_gb: float | None) -> Moves | None:
    """The checkpoint's moves of a multi-zone replay (the defaults where a flag is not given); None for ``--zones
    each``, which refuses a move's flag: a one-zone replay never moves the checkpoint, and ignored the flag without
    a word."""
    from kit.errors import InputError

    given = {field: value for field, value in (("checkpoint_gb", checkpoint_gb), ("transfer_gbps", transfer_gbps),
                                               ("egress_per_gb", egress_per_gb)) if value is not None}
    if zones != EACH:
        return Moves(**given)  # Moves' own defaults for the flags not given
    if given:
        raise InputError("the checkpoint's moves between zones are part of a multi-zone market",
                         where="--" + next(iter(given)).replace("_", "-"), fix="add --zones all (or leave the flag out)")
    return None


def format_misses(value: float) -> str:
    """Deadline misses for people: a count, or for ``POLICY@mean-zone`` the mean over zones of each zone's
    count (kit.simulate.zones), a fraction where the zones differ, to two decimals."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _require_runs(summary: dict, traces: list[Path], deadline_h: float) -> None:
    """Refuse a summary that compares nothing (no run), or whose figures are not all finite numbers: a NaN or
    infinite cost is no answer, and JSON has neither (RFC 8259, section 6): ``json.dumps`` would write
    ``NaN``, which other readers reject. Before the plot or the output is written."""
    from kit.errors import InputError
    from kit.policy.offers import MAX_PRICE_PER_HOUR

    where = ", ".join(str(t) for t in traces)
    if summary["runs"] == 0:
        raise InputError(f"every trace is shorter than the deadline window ({deadline_h:g} h)",
                         where=where, fix="use longer traces or a shorter --deadline-hours")
    bad = _not_finite(summary)
    if bad is not None:
        raise InputError(f"the replay's {bad[0]} came out {bad[1]}: the prices are too large to compute with",
                         where=where, fix=f"give prices (the traces' or --spot-price/--on-demand-price) of at most "
                                          f"{MAX_PRICE_PER_HOUR:g} $ per node-hour")


def _not_finite(value: object, path: str = "") -> tuple[str, float] | None:
    """The first figure in ``value`` (a summary: dicts and lists of numbers) that is NaN or infinite, and its
    path (``cost_vs_on_demand.spot``); None when all are finite."""
    import math

    if isinstance(value, float):  # numpy's float64 is one too
        return None if math.isfinite(value) else (path, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, item in items:
        found = _not_finite(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _shapes(offers: Path | None, shape: list[str] | None) -> Offers | None:
    """The shapes of a multi-zone market: an offers file, ``--shape`` flags, or neither (None: one shape)."""
    from kit.errors import InputError
    from kit.simulate.zones import load_offers, shapes_from_flags

    if offers is not None and shape:
        raise InputError("give the shapes either in an offers file or as --shape flags, not both",
                         where="--offers, --shape", fix="drop one of them")
    if offers is not None:
        return load_offers(offers)
    return shapes_from_flags(shape) if shape else None


def _zone_policies(policy: str) -> list[str]:
    """The multi-zone policy names ``--policy`` gives (each name is checked where it is replayed)."""
    from kit.errors import InputError
    from kit.simulate.zones import OPT, ZONE_ALL, ZONE_POLICY_NAMES

    if policy == "all":
        return list(ZONE_ALL)
    names = [p.strip() for p in policy.split(",") if p.strip()]
    if not names:
        raise InputError(f"no policy in {policy!r}", where="--policy",
                         fix=f"use all, or one or more (comma-separated) of: {', '.join((OPT, *ZONE_POLICY_NAMES))}, "
                             "POLICY@each, POLICY@ZONE")
    return names


def _simulate_zones(traces: list[Path], policy: str, zones: str, offers: Offers | None, json_out: bool,
                    plot_file: Path | None, params, moves: Moves) -> None:
    """``kit simulate --zones all|z1,z2``: the traces as one multi-zone market (``offers``: shapes and
    prices from :func:`_shapes`, None for one shape)."""
    import json

    from kit.errors import InputError
    from kit.simulate.zones import simulate_market, zone_market
    from kit.traces import load_traces

    if plot_file is not None:
        check_plot_file(plot_file)
    loaded = load_traces(traces)
    if zones != "all":
        wanted = [z.strip() for z in zones.split(",") if z.strip()]
        unknown = [z for z in wanted if z not in {t.name for t in loaded}]
        if unknown or not wanted:
            raise InputError(f"zone {', '.join(unknown) or zones!r} is not in the traces", where="--zones",
                             fix=f"use all, each, or zones of: {', '.join(t.name for t in loaded)}")
        twice = sorted({z for z in wanted if wanted.count(z) > 1})
        if twice:  # one market per zone: a zone named twice is a slip, most likely for another zone
            raise InputError(f"zone {', '.join(twice)} is named more than once", where="--zones",
                             fix="name each zone once")
        loaded = [t for t in loaded if t.name in wanted]
    shapes, prices = offers if offers is not None else (None, None)
    market = zone_market(loaded, params, moves, shapes, prices)
    summary = simulate_market(market, _zone_policies(policy), params, moves)
    _require_runs(summary, traces, params.deadline_h)
    if plot_file is not None:
        from kit.simulate.plot import plot_zones

        plot_zones(market, params, moves, summary, str(plot_file))
        summary["plot"] = str(plot_file)
    if json_out:
        typer.echo(json.dumps(summary, separators=(",", ":")))
        return
    p = summary["params"]
    n = len(summary["zones"])
    typer.echo(f"{summary['runs']} starts on {n} zone{'s' if n != 1 else ''} as one market (shapes: "
               f"{', '.join(p['shapes'])}; N={p['nodes']}, C0={p['job_hours']} h, R0={p['deadline_hours']} h, "
               f"d={p['changeover_hours']} h, checkpoint {p['checkpoint_gb']} GB at {p['transfer_gbps']} Gbit/s)")
    labels = {name: f"{name} ({summary['best_zone'][name]})" if summary["best_zone"].get(name) else name
              for name in summary["policies"]}
    width = max(34, *(len(label) for label in labels.values()))  # a best zone's name may be long
    typer.echo(f"{'policy':<{width}} {'cost vs on-demand':>18} {'p75':>7} {'misses':>7} {'moves':>6} {'probes':>7} "
               f"{'egress $':>9} {'changeovers $':>14} {'launches':>9} {'no progress':>12}")

    def cell(key: str, name: str, width: int, digits: int) -> str:
        value = summary[key][name]  # None: opt's schedule is not rebuilt
        return f"{'-' if value is None else format(value, f'.{digits}f'):>{width}}"

    for name in summary["policies"]:
        typer.echo(f"{labels[name]:<{width}} {summary['cost_vs_on_demand'][name]:>18.4f} "
                   f"{summary['cost_vs_on_demand_p75'][name]:>7.3f} "
                   f"{format_misses(summary['deadline_misses'][name]):>7} {cell('moves', name, 6, 1)} "
                   f"{cell('probes', name, 7, 1)} {cell('egress', name, 9, 2)} {cell('changeover_cost', name, 14, 2)} "
                   f"{cell('launches', name, 9, 1)} {cell('launches_without_progress', name, 12, 1)}")


def _print_table(summary: dict, names: list[str]) -> None:
    p = summary["params"]
    typer.echo(f"{summary['runs']} runs  (N={p['nodes']}, C0={p['job_hours']} h, R0={p['deadline_hours']} h, "
               f"d={p['changeover_hours']} h, {p['starts']} starts per trace)")
    if summary["skipped_traces"]:
        typer.echo(f"skipped (shorter than the window): {', '.join(summary['skipped_traces'])}")
    typer.echo(f"{'policy':<10} {'cost vs on-demand':>18} {'p75':>7} {'misses':>7}")
    for name in names:
        cost = summary["cost_vs_on_demand"][name]
        p75 = summary["cost_vs_on_demand_p75"][name]
        typer.echo(f"{name:<10} {cost:>18.4f} {p75:>7.3f} {summary['deadline_misses'][name]:>7}")
    if summary.get("plot"):
        typer.echo(f"plot: {summary['plot']}")


@app.command("traces")
def traces_command(
    json_out: Annotated[bool, typer.Option("--json", help="print one line of JSON")] = False,
) -> None:
    """List the spot-capacity trace sets bundled with kit: zones, ticks, span and prices."""
    import json

    from kit.paths import SPOT_TRACES_DIR
    from kit.traces import bundled_sets, summarize_set

    sets = [summarize_set(d) for d in bundled_sets()]
    if json_out:
        typer.echo(json.dumps([s.as_json() for s in sets], separators=(",", ":")))
        return
    typer.echo(f"bundled spot-capacity traces ({SPOT_TRACES_DIR}); replay one with `kit simulate NAME`, "
               "or name a zone's file in a local spec's local.trace")
    for s in sets:
        span = f"{s.start_utc} to {s.end_utc}" if s.start_utc else "start not recorded"
        typer.echo(f"\n{s.name}: {len(s.zones)} zones, {s.ticks} ticks of {s.gap_seconds:g} s = {s.span_hours:.1f} h "
                   f"({span})")
        what = f"{s.instance_type or 'instances'}" + (f" x {s.nodes_requested} requested" if s.nodes_requested else "")
        prices = f"spot ${s.spot_per_hour[0]:.2f}-{s.spot_per_hour[1]:.2f}/h"
        if s.on_demand_per_hour:
            prices += f", on-demand ${s.on_demand_per_hour[0]:.2f}-{s.on_demand_per_hour[1]:.2f}/h"
        typer.echo(f"  {what}; {prices} per instance")
        typer.echo(f"  zones: {', '.join(s.zones)}")

"""The PNG of ``kit simulate --plot``: progress against time for one start, and the mean cost per policy."""

from __future__ import annotations

from kit.errors import InputError, KitError
from kit.policy import ON_DEMAND, SPOT
from kit.simulate.single import OPT, Params, simulate_policy, span_ticks, start_ticks
from kit.traces import Trace


def _shown_start(traces: list[Trace], policies: list[str], params: Params, summary: dict) -> tuple[Trace, int]:
    """On the trace where the policies' mean costs differ most (on-demand and opt left out), the
    start where they differ most."""
    usable = [t for t in traces if start_ticks(t, params)]
    if not usable:
        raise InputError("no trace is long enough to plot", where="--plot", fix="use longer traces or a shorter deadline")
    per_trace = summary.get("per_trace") or {}
    compared = [p for p in policies if p not in (OPT, ON_DEMAND)]

    def spread(costs: list[float]) -> float:
        return max(costs) - min(costs) if len(costs) > 1 else 0.0

    trace = max(usable, key=lambda t: spread([per_trace.get(t.name, {}).get(p, 0.0) for p in compared]))
    start = max(start_ticks(trace, params),
                key=lambda s: spread([simulate_policy(trace, s, p, params).cost_vs_on_demand for p in compared]))
    return trace, start


def _plot_progress(ax, trace: Trace, start: int, policies: list[str], params: Params) -> None:
    G = trace.tick_h
    for i, up in enumerate(trace.spot_available(params.nodes)[start:start + span_ticks(params, G)]):
        if up:
            ax.axvspan(i * G, (i + 1) * G, color="tab:green", alpha=0.08, lw=0)
    ax.plot([0, params.deadline_h], [0, params.job_h], "k--", lw=1, label="uniform progress")
    ax.axvline(params.deadline_h, color="tab:red", lw=1, ls=":", label="deadline")
    colors = {"spot": "tab:green", "on-demand": "tab:red"}
    for n, name in enumerate(p for p in policies if p != OPT):
        run = simulate_policy(trace, start, name, params, record=True)
        ts = [0.0] + [row["t"] + G for row in run.timeline]
        ps = [0.0] + [row["progress"] for row in run.timeline]
        line, = ax.plot(ts, ps, lw=1.5, label=f"{name} ({run.cost_vs_on_demand:.2f})")
        # market held per tick, as a thin band under the curves
        y0 = -1.5 - 1.2 * n
        for row in run.timeline:
            if row["market"]:
                ax.fill_between([row["t"], row["t"] + G], y0, y0 + 0.9, color=colors[row["market"]], lw=0)
        ax.text(-0.5, y0 + 0.2, name, ha="right", fontsize=7, color=line.get_color())
    ax.set_xlabel("hours since start")
    ax.set_ylabel("compute done (h)")
    ax.set_title(f"{trace.name}, start tick {start}: progress (green shade: spot up; bands: spot/on-demand)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def _plot_costs(bars, policies: list[str], summary: dict) -> None:
    names = [p for p in policies if summary["cost_vs_on_demand"].get(p) is not None]
    values = [summary["cost_vs_on_demand"][p] for p in names]
    bars.bar(names, values, color=["tab:gray" if p == OPT else "tab:blue" for p in names])
    for x, v in enumerate(values):
        bars.text(x, v, f"{v:.3f}", ha="center", va="bottom", fontsize=7)
    bars.set_ylabel("mean cost vs on-demand")
    misses = ", ".join(f"{p}={summary['deadline_misses'][p]}" for p in names if summary["deadline_misses"][p])
    bars.set_title(f"{summary['runs']} runs; deadline misses: {misses or 'none'}", fontsize=9)
    bars.tick_params(axis="x", rotation=30, labelsize=8)


def plot(traces: list[Trace], policies: list[str], params: Params, summary: dict, out: str) -> None:
    """Progress vs time for one start (``_shown_start``), and cost per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace, start = _shown_start(traces, policies, params, summary)
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [2, 1]})
    _plot_progress(ax, trace, start, policies, params)
    _plot_costs(bars, policies, summary)
    fig.tight_layout()
    _save(fig, out)


def _save(fig, out: str) -> None:
    """Write the PNG and close the figure. The file was tried before the replay (kit.paths.check_plot_file),
    but a disk may fill or a directory go meanwhile: said as the others, not a traceback."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(out, dpi=110)
    except OSError as error:
        raise KitError(f"cannot write the plot: {error.strerror or error}", where=f"--plot {out}",
                       fix="name a file in a directory you can write, with room for it") from None
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------------------- many zones
def _zone_runs(market, start: int, params: Params, moves, names: list[str]) -> dict:
    """Recorded replays of the named multi-zone policies (``up@ZONE``: pinned in that zone)."""
    from kit.simulate.zones import policies_for, replay

    return {name: replay(market, start, params, moves, policies_for(name, market, moves, seed=start)[0], record=True)
            for name in names}


def plot_zones(market, params: Params, moves, summary: dict, out: str) -> None:
    """One start of the multi-zone market (the one where ``default`` and ``failover`` differ most):
    progress against time with the uniform-progress line, and each policy's zone and market over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kit.simulate.zones import zone_starts

    best = summary.get("best_zone", {}).get("up@best-zone")
    names = [n for n in ("default", "failover") if n in summary["policies"]] + ([f"up@{best}"] if best else [])
    if not names:
        raise InputError("--plot needs default, failover or up@each among the policies", where="--plot",
                         fix="use --policy all")

    def spread(s: int) -> float:
        costs = [r.cost_vs_on_demand for r in _zone_runs(market, s, params, moves, names).values()]
        return max(costs) - min(costs)

    start = max(zone_starts(market, params), key=spread)
    runs = _zone_runs(market, start, params, moves, names)
    zones = list(market.zones)
    fig, axes = plt.subplots(1 + len(names), 1, figsize=(13, 4 + 2.2 * len(names)), sharex=True,
                             gridspec_kw={"height_ratios": [2] + [1] * len(names)})
    ax = axes[0]
    ax.plot([0, params.deadline_h], [0, params.job_h], "k--", lw=1, label="uniform progress")
    ax.axvline(params.deadline_h, color="tab:red", lw=1, ls=":", label="deadline")
    for name, run in runs.items():
        ts = [0.0] + [row["t"] + market.G for row in run.timeline]
        ax.plot(ts, [0.0] + [row["progress"] for row in run.timeline], lw=1.5,
                label=f"{name} ({run.cost_vs_on_demand:.3f}, {run.moves} moves, {run.probes} probes)")
    ax.set_ylabel("compute done (h)")
    ax.set_title(f"start tick {start}: progress; below, the zone and market each policy holds "
                 "(green spot, red on-demand)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    colors = {SPOT: "tab:green", ON_DEMAND: "tab:red"}
    for lane, (name, run) in zip(axes[1:], runs.items()):
        for row in run.timeline:
            if row["market"]:
                y = zones.index(row["zone"])
                lane.fill_between([row["t"], row["t"] + market.G], y - 0.4, y + 0.4, color=colors[row["market"]], lw=0)
        lane.set_yticks(range(len(zones)), zones, fontsize=6)
        lane.set_ylim(-0.6, len(zones) - 0.4)
        lane.set_ylabel(name, fontsize=8)
    axes[-1].set_xlabel("hours since start")
    fig.tight_layout()
    _save(fig, out)

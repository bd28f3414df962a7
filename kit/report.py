"""``kit train --plot``: progress over time with the market, where the job ran (zone and shape), the
preemptions, the launch attempts that found no capacity, and the disks left idle in zones the job left."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kit.spec import SpecBase

MARKET_COLORS = {"spot": "tab:green", "on-demand": "tab:orange"}


def plot_run(ledger, spec: SpecBase, out: Path, *, scale: float = 1.0) -> Path:
    return RunPlot(ledger, spec, scale).draw(Path(out))


class RunPlot:
    """One figure from the ledger, drawn in named steps; times on the ledger's clock, shown in hours."""

    def __init__(self, ledger, spec: SpecBase, scale: float = 1.0):
        self.ledger, self.spec, self.scale = ledger, spec, scale
        self.started = ledger.started_at() or 0.0
        self.rows = ledger.progress_history()
        self.top = max([step for _, step in self.rows] + [1])
        self.now = newest_progress(self.rows, self.started)

    def hours(self, t: float) -> float:
        return (t - self.started) / 3600.0

    def draw(self, out: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(10.5, 4))
        ax.plot([self.hours(at) for at, _ in self.rows], [step for _, step in self.rows], color="black", lw=1.5,
                label="step")
        self.markets(ax)
        self.losses(ax)
        self.attempts(ax)
        self.idle_disks(ax)
        unit = "trace hours" if self.scale != 1.0 else "hours"  # a compressed clock (the local backend's)
        ax.set_xlabel(f"{unit} since start" + (f" (wall × {self.scale:g})" if self.scale != 1.0 else ""))
        ax.set_ylabel("step")
        ax.set_title(f"kit train {self.spec.name}: progress, market (shaded), zone and shape (blue), preemptions "
                     "(red)", fontsize=9)
        # beside the axes: inside, it hid the ends of the idle-disk bars and their zones (lower right) or
        # the first zone's label (upper left)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0.0)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out

    def markets(self, ax) -> None:
        """The market held (shaded, from node 0's incarnations) and, at each move or shape switch, where."""
        seen: set = set()
        where = None
        for node in self.ledger.all_nodes():
            if node.rank != 0:
                continue
            end = node.until if node.until is not None else max(self.now, node.since)
            label = node.market if node.market not in seen else None
            seen.add(node.market)
            ax.axvspan(self.hours(node.since), self.hours(end), color=MARKET_COLORS.get(node.market, "grey"),
                       alpha=0.2, label=label)
            if (node.zone, node.shape) != where:  # a move or a shape switch: say where it runs from here
                where = (node.zone, node.shape)
                ax.text(self.hours(node.since), self.top, f" {node.zone or ''} {node.shape or ''}", rotation=90,
                        va="top", fontsize=7, color="tab:blue")

    def losses(self, ax) -> None:
        from kit.watch.events import BY_KIT, LOSS_KINDS, PREEMPTION

        losses = [e for e in self.ledger.events(kinds=LOSS_KINDS) if e["source"] != "agent"]
        labelled: set[str] = set()
        for event in losses:
            # a preemption, or a node lost for another reason (a crash; local nodes kit stopped when it was interrupted)
            preempted = event["kind"] == PREEMPTION
            label = "preemption" if preempted else (
                "nodes stopped by kit (interrupted)" if event["detail"].get(BY_KIT) else "node lost (not a preemption)")
            ax.axvline(self.hours(event["time"]), color="tab:red" if preempted else "grey", ls="--" if preempted else ":",
                       lw=1, label=None if label in labelled else label)
            labelled.add(label)

    def attempts(self, ax) -> None:
        """Launch attempts on offers that had no capacity (free, as the simulator's failed probes)."""
        from kit.watch.events import CAPACITY_ERROR

        failed = self.ledger.events(kinds=(CAPACITY_ERROR,))
        if failed:
            ax.plot([self.hours(e["time"]) for e in failed], [0.0] * len(failed), "x", color="tab:red",
                    clip_on=False, label=f"no capacity ({len(failed)} offer tries)")

    def idle_disks(self, ax) -> None:
        """Disks of zones the job left, while they sat idle (until deleted, or now): one bar per zone."""
        idle = idle_disk_spans(self.ledger, self.now)
        for i, (zone, (start, end)) in enumerate(sorted(idle.items())):
            y = -0.04 * self.top * (i + 1)
            ax.plot([self.hours(start), self.hours(end)], [y, y], color="grey", lw=3, solid_capstyle="butt",
                    label="idle disks of a zone left" if i == 0 else None)
            ax.text(self.hours(end), y, f" {zone}", va="center", fontsize=6, color="grey")


def idle_disk_spans(ledger, now: float) -> dict[str, tuple[float, float]]:
    """Per zone, from when its last disk went idle to when they were deleted (or ``now``): zones whose
    disks no node uses."""
    from kit.watch.events import DISKS_RELEASED

    released = {e["detail"].get("zone"): e["time"] for e in ledger.events(kinds=(DISKS_RELEASED,))}
    by_zone: dict[str, list[dict[str, Any]]] = {}
    for row in ledger.disks():
        by_zone.setdefault(row["zone"] or "?", []).append(row)
    spans = {}
    for zone, rows in by_zone.items():
        if any(r["attached_now"] for r in rows):
            continue
        start = max(max(r["last_until"], r["first_used"]) for r in rows)
        end = released.get(zone, now)
        if end > start:
            spans[zone] = (start, end)
    return spans


def newest_progress(rows, default: float) -> float:
    """The time of the newest heartbeat in ``rows`` (``default`` without one): where the plot ends."""
    return max([at for at, _ in rows] + [default])

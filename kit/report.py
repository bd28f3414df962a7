"""``kit train --plot``: progress over time with the market, where the job ran (zone and shape), the
preemptions, the launch attempts that found no capacity, and the disk sets (zone and shape) while idle."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
        """Disk sets while they sat idle (no node on them, until deleted, used again, or now): one row per set."""
        idle = idle_disk_spans(self.ledger, self.now)
        for i, ((zone, shape), spans) in enumerate(sorted(idle.items())):
            y = -0.04 * self.top * (i + 1)
            for k, (start, end) in enumerate(spans):
                ax.plot([self.hours(start), self.hours(end)], [y, y], color="grey", lw=3, solid_capstyle="butt",
                        label="idle disks (no node on them)" if i == k == 0 else None)
            ax.text(self.hours(spans[-1][1]), y, f" {zone} {shape}".rstrip(), va="center", fontsize=6, color="grey")


def idle_disk_spans(ledger, now: float) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per disk set, (zone, shape) of the nodes on it (a disks root on the clouds:
    kit.backends.cloud.TerraformBackend.disk_set), the spans its disks sat idle
    (kit.watch.disks.lifetime, as ``kit status`` counts them). A disk is busy while any node uses it, whatever
    that node's shape (the local backend's shapes in a zone share theirs); a ``disks-released`` event naming
    one of the set's disks in its zone deleted them."""
    from kit.watch.disks import lifetime_of, releases, zone_key

    nodes = ledger.all_nodes()
    deletions = releases(ledger)
    sets: dict[tuple[str, str], set[str]] = {}
    for node in nodes:
        if node.disk_id:
            sets.setdefault((zone_key(node.zone), node.shape or ""), set()).add(node.disk_id)
    spans = {}
    for (zone, shape), disks in sets.items():
        idle = lifetime_of(nodes, deletions, zone, disks, now).idle
        if idle:
            spans[(zone, shape)] = list(idle)
    return spans


def newest_progress(rows, default: float) -> float:
    """The time of the newest heartbeat in ``rows`` (``default`` without one): where the plot ends."""
    return max([at for at, _ in rows] + [default])

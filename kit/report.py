"""``kit train --plot``: progress over time with the market, where the job ran (zone and shape) and
the preemptions marked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.spec import SpecBase


def plot_run(ledger, spec: SpecBase, out: Path, *, scale: float = 1.0) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kit.watch.events import LOSS_KINDS

    started = ledger.started_at() or 0.0
    hours = lambda t: (t - started) / 3600.0
    rows = ledger.progress_history()
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([hours(at) for at, _ in rows], [step for _, step in rows], color="black", lw=1.5, label="step")
    colors = {"spot": "tab:green", "on-demand": "tab:orange"}
    seen, where = set(), None
    top = max([step for _, step in rows] + [1])
    for node in ledger.all_nodes():
        if node.rank != 0:
            continue
        end = node.until if node.until is not None else ledger_now(rows, node.since)
        label = node.market if node.market not in seen else None
        seen.add(node.market)
        ax.axvspan(hours(node.since), hours(end), color=colors.get(node.market, "grey"), alpha=0.2, label=label)
        if (node.zone, node.shape) != where:  # a move or a shape switch: say where it runs from here
            where = (node.zone, node.shape)
            ax.text(hours(node.since), top, f" {node.zone or ''} {node.shape or ''}", rotation=90, va="top",
                    fontsize=7, color="tab:blue")
    losses = [e for e in ledger.events(kinds=LOSS_KINDS) if e["source"] != "agent"]
    for i, event in enumerate(losses):
        ax.axvline(hours(event["time"]), color="tab:red", ls="--", lw=1, label="preemption" if i == 0 else None)
    # a compressed clock (the local backend's) counts trace hours
    unit = "trace hours" if scale != 1.0 else "hours"
    ax.set_xlabel(f"{unit} since start" + (f" (wall × {scale:g})" if scale != 1.0 else ""))
    ax.set_ylabel("step")
    ax.set_title(f"kit train {spec.name}: progress, market (shaded), zone and shape (blue), preemptions (red)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def ledger_now(rows, default: float) -> float:
    return max([at for at, _ in rows] + [default])

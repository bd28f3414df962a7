"""Policy benchmark (issue 5): every policy and the omniscient bound on the shared GCP H100 traces,
plus checks on traces the default policy was not tuned on.

    .venv/bin/python bench/policies.py [--out bench-policies.json] [--skip-synthetic]

1. main: all 13 zones of shared/data/spot-traces/gcp-a3-h100-2025-10/, N=16, C0=48 h, d=0.2 h,
   R0 = 60 h and 72 h, 8 starts (identical to ``kit simulate DIR --policy all ...``);
2. held-out zones: ``default``'s constants were chosen on the even-numbered zones (alphabetical
   order: 0, 2, 4, ...) only; the odd-numbered zones are reported separately;
3. perturbed GCP traces: every zone time-reversed, and shuffled in 6-hour blocks (seeded);
4. synthetic markets: single-node on/off Markov traces with the spreads published for AWS V100
   (availability 20-80 %, mean spot runs 20 min to 4 h), on-demand/spot price ratios of 2.5 and
   4.3, deadlines 60 h and 72 h and a tight 53.3 h (C0/R0 = 0.9).

Prints Markdown tables (pasted into docs/benchmarks.md, section "Policies").
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kit.paths import spot_traces_dir
from kit.simulate import ALL_POLICIES, Params, simulate
from kit.traces import Trace, load_traces

GCP = "gcp-a3-h100-2025-10"


def table(title: str, results: dict[str, dict], policies=ALL_POLICIES) -> str:
    cols = list(results)
    lines = [f"**{title}**", "", "| policy | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for p in policies:
        cells = []
        for c in cols:
            s = results[c]
            cells.append(f"{s['cost_vs_on_demand'][p]:.4f} ({s['deadline_misses'][p]})")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    runs = ", ".join(f"{c}: {results[c]['runs']} runs" for c in cols)
    lines += ["", f"mean cost vs on-demand (deadline misses); {runs}", ""]
    return "\n".join(lines)


def reversed_trace(t: Trace) -> Trace:
    return Trace(path=t.path, gap_seconds=t.gap_seconds, data=t.data[::-1], metadata={**t.metadata, "zone": t.name + "~rev"},
                 prices=t.prices[::-1] if t.prices else None)


def block_shuffled(t: Trace, seed: int, block_h: float = 6.0) -> Trace:
    n = max(1, round(block_h / t.tick_h))
    blocks = [t.data[i:i + n] for i in range(0, len(t.data), n)]
    random.Random(seed).shuffle(blocks)
    data = tuple(x for b in blocks for x in b)
    return Trace(path=t.path, gap_seconds=t.gap_seconds, data=data, metadata={**t.metadata, "zone": t.name + "~shuf"})


def markov(seed: int, share: float, mean_run_h: float, ratio: float, n_ticks: int = 2016, gap: int = 600) -> Trace:
    """Single-node on/off capacity: runs up/down geometric, mean up ``mean_run_h``, availability ``share``."""
    rng = random.Random(seed)
    g = gap / 3600
    leave_up = min(1.0, g / mean_run_h)
    leave_down = min(1.0, leave_up * share / (1 - share))
    up, data = rng.random() < share, []
    for _ in range(n_ticks):
        data.append(1 if up else 0)
        up = (rng.random() >= leave_up) if up else (rng.random() < leave_down)
    meta = {"gap_seconds": gap, "zone": f"markov-{share}-{mean_run_h}-{ratio}-{seed}",
            "spot_price_per_hour": 1.0, "on_demand_price_per_hour": ratio}
    return Trace(path=Path(meta["zone"] + ".json"), gap_seconds=gap, data=tuple(data), metadata=meta)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=spot_traces_dir() / GCP)
    ap.add_argument("--out", type=Path, default=None, help="write every summary as JSON here")
    ap.add_argument("--skip-synthetic", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    traces = sorted(load_traces([args.traces]), key=lambda t: t.name)
    out: dict[str, dict] = {}
    md = []

    def run(key, ts, nodes, deadline):
        s = simulate(ts, list(ALL_POLICIES), Params(nodes=nodes, job_h=48.0, deadline_h=deadline, changeover_h=0.2,
                                                   starts=8))
        s.pop("per_trace", None) if key.startswith("synthetic") else None
        out[key] = s
        return s

    main_res = {f"R0={r:g} h": run(f"main-{r:g}", traces, 16, r) for r in (60.0, 72.0)}
    md.append(table(f"All {len(traces)} GCP H100 zones, N=16, C0=48 h, d=0.2 h, 8 starts", main_res))
    tune, held = traces[0::2], traces[1::2]
    split = {}
    for r in (60.0, 72.0):
        split[f"tuning zones, R0={r:g}"] = run(f"tune-{r:g}", tune, 16, r)
        split[f"held-out zones, R0={r:g}"] = run(f"held-{r:g}", held, 16, r)
    md.append(table("Tuning zones (" + ", ".join(t.name for t in tune) + ") vs held-out zones ("
                    + ", ".join(t.name for t in held) + ")", split))
    perturbed = {}
    rev = [reversed_trace(t) for t in traces]
    shuf = [block_shuffled(t, seed=i) for i, t in enumerate(traces)]
    for r in (60.0, 72.0):
        perturbed[f"reversed, R0={r:g}"] = run(f"reversed-{r:g}", rev, 16, r)
        perturbed[f"6 h blocks shuffled, R0={r:g}"] = run(f"shuffled-{r:g}", shuf, 16, r)
    md.append(table("Perturbed GCP traces (time-reversed; shuffled in 6 h blocks)", perturbed))
    if not args.skip_synthetic:
        synth = {}
        for ratio in (2.5, 4.3):
            ts = [markov(seed, share, run_h, ratio) for share in (0.2, 0.5, 0.8) for run_h in (1 / 3, 1.0, 4.0)
                  for seed in range(2)]
            for r in (53.3, 60.0, 72.0):
                synth[f"k={ratio}, R0={r:g}"] = run(f"synthetic-k{ratio}-{r:g}", ts, 1, r)
        md.append(table("Synthetic on/off markets (single node; availability 0.2/0.5/0.8 x mean run 20 min/1 h/4 h "
                        "x 2 seeds = 18 traces per column; k = on-demand/spot price)", synth))
    md.append(f"_{time.time() - t0:.0f} s on this machine._")
    print("\n".join(md))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

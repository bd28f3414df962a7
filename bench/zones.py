"""Multi-zone benchmark: kit's ``default`` against the omniscient bound and the baselines, with moves.

    .venv/bin/python bench/zones.py [--out bench-zones.json] [--skip-synthetic] [--development]   # ~7 min
    .venv/bin/python bench/zones.py --baselines bench-zones.json [--development]   # default only: ~1-2 min

1. The bundled GCP H100 set as one market (``kit simulate gcp-a3-h100-2025-10 --zones all``):
   all 13 zones, N = 16, 4, 1; C0 = 48 h; R0 = 60 h and 72 h; d = 0.2 h; 8 starts; a 50 GB checkpoint
   at 10 Gbit/s; egress at the clouds' list prices;
2. the same with the zones of one region (us-central1: 3 zones; us-east4: 2 zones), N = 16, 4, 1;
   and, held out, the bundled AWS V100 set (9 zones, 195-s ticks, 1 node);
3. synthetic markets: 5 zones, each an on/off Markov chain with its own availability (0.2 to 0.9),
   mean spot run (20 min to 12 h) and spot price, 2 nodes, 3 seeds per setting, d = 1 to 4 ticks;
   and a summary of the same settings on ten more seeds (21-30) that no constant was chosen on;
   with ``--development``, the same summary on seeds 31-50, the development markets the multi-zone
   ``default``'s constants were compared on (about 4 min more);
4. ``opt``'s runtime on 13 zones at R0 = 60 h and 72 h, 8 starts, with d = 0.2 h and 0.2001 h (no common
   unit with the tick: waste kept as exact Pareto fronts), and on 5 zones of 32-second ticks (one start).

With ``--baselines`` (an earlier ``--out`` of this script), each market row replays only the policies a
change to ``default`` can move (``default`` and the one-zone ``default`` in each zone) and takes ``opt``,
``failover`` and ``up`` from that file: for comparing versions of ``default`` quickly, on the same traces
and baselines' code; the ``opt`` runtime table is left out.

Each row is one draw of the shuffles ``failover`` tries zones in and ``default`` breaks ties with, both seeded
by the start; bench/zone_seeds.py replays 10 draws of the GCP rows.

Prints Markdown tables (pasted into docs/benchmarks.md, section "Many zones"). Every row reports
every policy; "ok" says whether ``default`` has no more misses than ``opt``, is below ``failover``
and below the best zone's ``up``, and where it stands against 1.10 x ``opt``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import replay_args

from kit.cli.simulate import format_misses
from kit.paths import SPOT_TRACES_DIR
from kit.policy.offers import Moves
from kit.simulate.single import Params
from kit.simulate.zones import (
    POLICY_FIELDS,
    ZONE_ALL,
    ZoneSet,
    _ZoneOpt,
    default_shapes,
    opt_program,
    simulate_zones,
    zone_starts,
)
from kit.traces import Trace, load_traces, markov_availability, markov_rates

# With --baselines: the summaries of an earlier run, by row key; their opt, failover and up stand in for a replay
BASELINES: dict[str, dict] = {}
MOVED_BY_DEFAULT = ["default", "default@each"]  # the policies a change to kit's default can move


def replay_row(key: str, traces: list[Trace], params: Params) -> dict:
    """Every policy of ``ZONE_ALL`` on one row's market (``simulate_zones``), or, with ``--baselines``, only
    :data:`MOVED_BY_DEFAULT`, the others' figures taken from the earlier run's summary of the same row."""
    earlier = BASELINES.get(key)
    if earlier is None:
        if BASELINES:
            raise SystemExit(f"--baselines has no row {key!r}: run bench/zones.py --out FILE with the same flags first")
        return simulate_zones(traces, list(ZONE_ALL), params, Moves())
    summary = simulate_zones(traces, MOVED_BY_DEFAULT, params, Moves())
    for field in POLICY_FIELDS:
        summary[field] = {**earlier.get(field, {}), **summary[field]}  # a field newer than the file: default's only
    return summary


# The GCP markets: all 13 zones, and the zones of one region (label, trace-name prefix)
MARKETS = (("13 zones", None), ("us-central1 (3 zones)", "us-central1-"), ("us-east4 (2 zones)", "us-east4-"))
SHOWN = ("opt", "default", "failover", "up@best-zone", "up@mean-zone", "default@best-zone")


def row(label: str, summary: dict) -> tuple[str, dict]:
    c, m = summary["cost_vs_on_demand"], summary["deadline_misses"]
    d = c["default"]
    verdict = {"misses_ok": m["default"] <= m["opt"], "below_failover": d < c["failover"],
               "below_best_up": d < c["up@best-zone"], "vs_opt": d / c["opt"]}
    cells = " | ".join(f"{c[p]:.4f} ({format_misses(m[p])})" for p in SHOWN)
    ok = ("yes" if verdict["misses_ok"] and verdict["below_failover"] and verdict["below_best_up"] else "**no**")
    return f"| {label} | {cells} | {verdict['vs_opt']:.3f} | {ok} |", verdict


def header(first: str) -> list[str]:
    return [f"| {first} | " + " | ".join(SHOWN) + " | default / opt | below baselines |",
            "|---|" + "---:|" * (len(SHOWN) + 2)]


def gcp(md: list[str], out: dict, traces: list[Trace]) -> None:
    md += [("**GCP H100, 13 zones and one region at a time** (mean cost vs on-demand in the cheapest zone, "
           "(deadline misses); 8 starts)"), "", *header("setting")]
    for label, prefix in MARKETS:
        ts = [t for t in traces if prefix is None or t.name.startswith(prefix)]
        for nodes in (16, 4, 1):
            for deadline in (60.0, 72.0):
                params = Params(nodes=nodes, job_h=48.0, deadline_h=deadline, changeover_h=0.2, starts=8)
                key = f"gcp/{label}/N{nodes}/R{deadline:g}"
                summary = replay_row(key, ts, params)
                line, verdict = row(f"{label}, N={nodes}, R0={deadline:g}", summary)
                md.append(line)
                out[key] = {"summary": summary, "verdict": verdict}
    md.append("")


def aws(md: list[str], out: dict, traces: list[Trace]) -> None:
    """Held out: a cloud, GPU, year and tick (195 s) that no constant of ``default`` was chosen on."""
    md += [("**AWS p3.2xlarge (V100), 9 zones, 195-s ticks, held out** (1 node, C0 = 48 h, 8 starts; "
            "per-tick spot prices)"), "", *header("setting")]
    for deadline, d in ((53.3, 0.2), (60.0, 0.2), (72.0, 0.2), (60.0, 0.1)):
        params = Params(nodes=1, job_h=48.0, deadline_h=deadline, changeover_h=d, starts=8)
        key = f"aws/R{deadline:g}/d{d}"
        summary = replay_row(key, traces, params)
        line, verdict = row(f"R0={deadline:g}, d={d}", summary)
        md.append(line)
        out[key] = {"summary": summary, "verdict": verdict}
    md.append("")


SYNTHETIC_ZONES = ("us-east4-a", "us-east4-b", "us-central1-a", "europe-west1-c", "asia-southeast1-b")
SYNTHETIC_NODES = 2  # a zone is up when it has room for both nodes (markov_availability: fewer while down)


@dataclass(frozen=True)
class SyntheticZone:
    """One zone of a synthetic market: an on/off Markov chain of capacity (``kit.traces.markov_availability``)."""

    zone: str
    share: float  # long-run share of up ticks
    run_h: float  # mean spot run
    spot_price: float  # per node-hour (on-demand: 4.0)
    seed: int

    @property
    def rates(self) -> tuple[float, float]:
        """(P(down next tick | up), P(up next tick | down)) of its chain, 10-minute ticks (``markov_rates``)."""
        return markov_rates(self.share, self.run_h * 6)


def synthetic_zones(seed: int) -> list[SyntheticZone]:
    """The five zones of the synthetic market of ``seed``: availability 0.2-0.9, mean run 20 min to 12 h."""
    rng = random.Random(seed)
    out = []
    for i, zone in enumerate(SYNTHETIC_ZONES):
        share, run_h = rng.uniform(0.2, 0.9), rng.choice([0.33, 1.0, 3.0, 12.0])
        out.append(SyntheticZone(zone, share, run_h, round(rng.uniform(0.8, 1.3), 3), seed * 101 + i))
    return out


def synthetic_set(seed: int, n: int = 2016) -> list[Trace]:
    out = []
    for z in synthetic_zones(seed):
        data = markov_availability(z.seed, n, z.share, z.run_h * 6, SYNTHETIC_NODES)
        meta = {"gap_seconds": 600, "zone": z.zone, "spot_price_per_hour": z.spot_price,
                "on_demand_price_per_hour": 4.0}
        out.append(Trace(path=Path(f"{z.zone}.json"), gap_seconds=600, data=tuple(data), metadata=meta))
    return out


def synthetic_run(key: str, seed: int, d_ticks: int, deadline: float) -> dict:
    """Every policy on the synthetic market of ``seed`` (:func:`replay_row`, row ``key``): 2 nodes, C0 = 48 h, d in
    10-min ticks, 8 starts."""
    return replay_row(key, synthetic_set(seed), synthetic_params(d_ticks, deadline))


def synthetic_params(d_ticks: int, deadline: float) -> Params:
    """The job of the synthetic rows: 2 nodes, C0 = 48 h, d in 10-minute ticks, 8 starts."""
    return Params(nodes=SYNTHETIC_NODES, job_h=48.0, deadline_h=deadline, changeover_h=d_ticks / 6, starts=8)


def synthetic(md: list[str], out: dict) -> None:
    md += [("**Synthetic 5-zone markets** (2 nodes, each zone its own Markov availability and run length; "
           "C0 = 48 h, 3 seeds x 8 starts per row)"), "", *header("d, R0, seed")]
    for d_ticks in (1, 2, 4):
        for deadline in (60.0, 72.0):
            for seed in (11, 12, 13):
                key = f"synthetic/d{d_ticks}/R{deadline:g}/s{seed}"
                summary = synthetic_run(key, seed, d_ticks, deadline)
                line, verdict = row(f"d={d_ticks} ticks, R0={deadline:g}, seed {seed}", summary)
                md.append(line)
                out[key] = {"summary": summary, "verdict": verdict}
    md.append("")
    held_out_seeds(md, out)


HELD_OUT_SEEDS = range(21, 31)
DEVELOPMENT_SEEDS = range(31, 51)


def held_out_seeds(md: list[str], out: dict) -> None:
    """The same synthetic settings on ten more seeds (21-30) that no constant was chosen on: one summary
    line per changeover, so the three reported seeds cannot flatter ``default``."""
    seed_summary(md, out, HELD_OUT_SEEDS, "synthetic-held-out")


def development_seeds(md: list[str], out: dict) -> None:
    """The same summary on seeds 31-50, the development markets ``default``'s constants were compared on
    (docs/benchmarks.md reports them for every change; they are not evidence of generalisation)."""
    seed_summary(md, out, DEVELOPMENT_SEEDS, "synthetic-development")


def seed_summary(md: list[str], out: dict, seeds: range, key: str) -> None:
    md += [(f"**Synthetic 5-zone markets, seeds {seeds[0]}-{seeds[-1]}** (the same settings; "
           "R0 = 60 h and 72 h, 8 starts each)"), "",
           ("| d | rows | below baselines | loses to failover | loses to up@best-zone | mean default | "
            "mean default / opt | misses |"),
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for d_ticks in (1, 2, 4):
        verdicts = []
        for seed in seeds:
            for deadline in (60.0, 72.0):
                row_key = f"{key}/d{d_ticks}/R{deadline:g}/s{seed}"
                summary = synthetic_run(row_key, seed, d_ticks, deadline)
                verdict = row("", summary)[1]
                verdict["misses"] = summary["deadline_misses"]["default"]
                verdict["cost"] = summary["cost_vs_on_demand"]["default"]
                out[row_key] = {"summary": summary, "verdict": verdict}
                verdicts.append(verdict)
        below = sum(v["misses_ok"] and v["below_failover"] and v["below_best_up"] for v in verdicts)
        n = len(verdicts)
        md.append(f"| {d_ticks} tick{'s' if d_ticks > 1 else ''} | {n} | {below} | "
                  f"{sum(not v['below_failover'] for v in verdicts)} | {sum(not v['below_best_up'] for v in verdicts)} | "
                  f"{sum(v['cost'] for v in verdicts) / n:.4f} | {sum(v['vs_opt'] for v in verdicts) / n:.3f} | "
                  f"{sum(v['misses'] for v in verdicts)} |")
    md.append("")


def markets_32s() -> list[Trace]:
    """Five zones of 32-second ticks (bench/opt.py's on/off market, one seed and price per zone)."""
    from opt import markov_32s  # here, not at the top: bench/opt.py imports this module (via zone_known.py)

    return [markov_32s(seed=i, zone=zone, spot_price=1.0 + 0.1 * i)
            for i, zone in enumerate(("us-east4-a", "us-east4-b", "us-central1-a", "europe-west1-c", "asia-southeast1-b"))]


def opt_runtime(md: list[str], out: dict, traces: list[Trace]) -> None:
    """How long ``opt`` takes: waste over one axis of units where d and d + T have one, else exact fronts."""
    md += ["**opt runtime**, N = 16, C0 = 48 h", "",
           "| market | R0 | d | starts | program | seconds | mean opt |", "|---|---:|---:|---:|---|---:|---:|"]
    for label, market_traces, deadline, d, starts in (
            ("GCP, 13 zones, 10-min ticks", traces, 60.0, 0.2, 8), ("GCP, 13 zones, 10-min ticks", traces, 60.0, 0.2001, 8),
            ("GCP, 13 zones, 10-min ticks", traces, 72.0, 0.2, 8), ("GCP, 13 zones, 10-min ticks", traces, 72.0, 0.2001, 8),
            ("synthetic, 5 zones, 32-s ticks", markets_32s(), 72.0, 0.2, 1),
            ("synthetic, 5 zones, 32-s ticks", markets_32s(), 72.0, 0.2001, 1)):
        params = Params(nodes=16, job_h=48.0, deadline_h=deadline, changeover_h=d, starts=starts)
        market = ZoneSet.of(market_traces, default_shapes(market_traces, 16), params)
        t0 = time.perf_counter()
        programs = [opt_program(market, s, params, Moves()) for s in zone_starts(market, params)]
        runs = [p.solve() for p in programs]
        seconds = time.perf_counter() - t0
        mean = sum(r.cost_vs_on_demand for r in runs) / len(runs)
        program = "units" if isinstance(programs[0], _ZoneOpt) else "fronts"
        md.append(f"| {label} | {deadline:g} h | {d} h | {len(runs)} | {program} | {seconds:.1f} | {mean:.6f} |")
        out[f"opt_runtime/{label}/R{deadline:g}/d{d}"] = {"seconds": seconds, "mean": mean, "program": program}
    md.append("")


def main() -> int:
    def extra(ap) -> None:
        ap.add_argument("--development", action="store_true", help="also summarise the development seeds 31-50 (~4 min)")
        ap.add_argument("--baselines", type=Path, default=None,
                        help="an earlier --out of this script: replay only default (and default in each zone) and take "
                             "opt, failover and up from it (same traces, flags and baselines' code); no opt runtime table")

    args = replay_args.parse(__doc__, extra)
    if args.baselines is not None:
        BASELINES.update({k: v["summary"] for k, v in json.loads(args.baselines.read_text()).items() if "summary" in v})
    traces = load_traces([args.traces])
    md: list[str] = []
    out: dict = {}
    t0 = time.perf_counter()
    gcp(md, out, traces)
    aws(md, out, load_traces([SPOT_TRACES_DIR / replay_args.AWS]))
    if not args.skip_synthetic:
        synthetic(md, out)
        if args.development:
            development_seeds(md, out)
    if not BASELINES:
        opt_runtime(md, out, traces)
    md.append(f"({time.perf_counter() - t0:.0f} s in all)")
    print("\n".join(md))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

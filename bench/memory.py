"""Peak memory of kit's heaviest and longest-lived parts, each case in a fresh process, against a baseline
measured in the same run.

    .venv/bin/python bench/memory.py [--out bench-memory.json]         # ~4 min on 2 cores

1. ``kit simulate SET --zones all``: the peak resident set of a process that replays the multi-zone
   ``opt`` (the omniscient bound: dynamic programs over waste, kit/simulate/zones.py) against one that
   loads the same traces, builds the same market and replays ``failover`` only (the baseline: what the
   command holds without ``opt``), and one that replays every policy (``--policy all``). The cases of the
   "opt runtime" table of docs/benchmarks.md: the bundled GCP set (13 zones, 8 starts, N = 16, C0 = 48 h)
   at R0 = 60 h and 72 h with d = 0.2 h (waste on one array axis) and d = 0.2001 h (exact Pareto fronts),
   and five synthetic zones of 32-second ticks (one start, R0 = 72 h).
2. ``kit watch`` over a long job: the real ``Watcher``, ``Actor`` and ``Ledger`` of bench/watcher_replay.py
   (an in-memory cloud following the traces) on the five 32-second zones, one tick per trace tick, until
   the 48-hour job is done (about 6,000 ticks): the resident set once 500 ticks have run (the baseline, the
   same process warmed up), at the end, the growth per 1,000 ticks, and the ledger file's size.

Each case runs as ``bench/memory.py --case NAME`` in a child process; its peak is the kernel's count for
that child (``os.wait4``'s ``ru_maxrss``), so nothing the parent or an earlier case allocated is in it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WARM_TICKS = 500  # the watcher's baseline: its resident set once this many ticks have run
CASES = {"gcp": ((60.0, 0.2), (60.0, 0.2001), (72.0, 0.2), (72.0, 0.2001)), "32s": ((72.0, 0.2), (72.0, 0.2001))}
# each simulate case by name: (market, R0, d, --policy); "failover" is the baseline of "opt" and "all"
SIMULATE = {f"simulate/{market}/R{deadline:g}/d{d}/{policy}": (market, deadline, d, policy)
            for market, settings in CASES.items() for deadline, d in settings for policy in ("failover", "opt", "all")}


def rss_now() -> int:
    """This process's resident set now, bytes (``/proc/self/statm``: pages)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def simulate_case(market_name: str, deadline: float, d: float, policies: str) -> dict:
    """What ``kit simulate SET --zones all --policy POLICIES`` holds: traces, market and the replays."""
    from replay_args import GCP
    from zones import markets_32s

    from kit.cli.simulate import _zone_policies
    from kit.paths import SPOT_TRACES_DIR
    from kit.policy.offers import Moves
    from kit.simulate.single import Params
    from kit.simulate.zones import simulate_zones
    from kit.traces import load_traces

    traces = load_traces([SPOT_TRACES_DIR / GCP]) if market_name == "gcp" else markets_32s()
    params = Params(nodes=16, job_h=48.0, deadline_h=deadline, changeover_h=d, starts=8 if market_name == "gcp" else 1)
    t0 = time.perf_counter()
    summary = simulate_zones(traces, _zone_policies(policies), params, Moves())
    return {"seconds": time.perf_counter() - t0, "zones": len(traces), "starts": params.starts,
            "cost_vs_on_demand": summary["cost_vs_on_demand"]}


def watcher_case() -> dict:
    """The real watch loop over one 48-hour job on the five 32-second zones: resident set after
    :data:`WARM_TICKS` ticks and at the end, and the ledger's size."""
    import logging

    from watcher_replay import replay_watcher
    from zones import markets_32s

    from kit.simulate.single import Params

    logging.getLogger("kit.watch").setLevel(logging.ERROR)  # each capacity error and loss is a warning
    traces = markets_32s()
    params = Params(nodes=16, job_h=48.0, deadline_h=72.0, changeover_h=0.2, starts=1)
    seen: dict[str, float] = {}

    def on_tick(i: int, ledger_path: Path) -> None:
        if i == WARM_TICKS:
            seen["warm_rss"] = rss_now()
        seen["ticks"], seen["end_rss"], seen["ledger_bytes"] = i + 1, rss_now(), ledger_path.stat().st_size

    with tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        run = replay_watcher(traces, 0, params, Path(work), on_tick=on_tick)
        seconds = time.perf_counter() - t0
    growth = (seen["end_rss"] - seen["warm_rss"]) / max(1.0, (seen["ticks"] - WARM_TICKS) / 1000)
    return {"seconds": seconds, "ticks": seen["ticks"], "warm_rss_bytes": seen["warm_rss"],
            "end_rss_bytes": seen["end_rss"], "growth_bytes_per_1000_ticks": growth,
            "ledger_bytes": seen["ledger_bytes"], "cost_vs_on_demand": run["cost_vs_on_demand"],
            "missed": run["missed"]}


def run_child(case: str) -> dict:
    """``case`` in a fresh process: its result and its peak resident set (the kernel's, for that child)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, __file__, "--case", case], stdout=out, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        if proc.returncode != 0:
            raise SystemExit(f"case {case} failed: exit {proc.returncode}")
        out.seek(0)
        result = json.loads(out.read().strip().splitlines()[-1])
    result["peak_rss_bytes"] = usage.ru_maxrss * 1024  # kilobytes on Linux
    return result


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def simulate_table(results: dict) -> list[str]:
    md = ["| market | R0 | d | starts | failover only (baseline) | opt | opt above the baseline | --policy all | opt's seconds |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, (market, deadline, d, what) in SIMULATE.items():
        if what != "opt":
            continue
        base = results[key.replace("/opt", "/failover")]["peak_rss_bytes"]
        opt, every = results[key], results[key.replace("/opt", "/all")]
        label = "GCP, 13 zones, 10-min ticks" if market == "gcp" else "synthetic, 5 zones, 32-s ticks"
        md.append(f"| {label} | {deadline:g} h | {d} h | {opt['starts']} | {mb(base)} | {mb(opt['peak_rss_bytes'])} "
                  f"| {mb(opt['peak_rss_bytes'] - base)} | {mb(every['peak_rss_bytes'])} | {opt['seconds']:.1f} |")
    return md


def watcher_table(w: dict) -> list[str]:
    return ["| ticks | seconds | resident after 500 ticks (baseline) | at the end | growth per 1,000 ticks | peak | ledger file |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            (f"| {w['ticks']:,} | {w['seconds']:.0f} | {mb(w['warm_rss_bytes'])} | {mb(w['end_rss_bytes'])} "
             f"| {w['growth_bytes_per_1000_ticks'] / 2**20:+.2f} MiB | {mb(w['peak_rss_bytes'])} | {mb(w['ledger_bytes'])} |")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # a child's one case
    args = ap.parse_args()
    if args.case is not None:
        result = watcher_case() if args.case == "watcher" else simulate_case(*SIMULATE[args.case])
        print(json.dumps(result))
        return 0
    results = {}
    for case in [*SIMULATE, "watcher"]:
        results[case] = run_child(case)
        print(f"{case}: peak {mb(results[case]['peak_rss_bytes'])}", file=sys.stderr, flush=True)
    md = ["**kit simulate --zones all, peak resident set**", "", *simulate_table(results), "",
          "**The watch loop over one job (5 zones, 32-s ticks), resident set**", "", *watcher_table(results["watcher"])]
    print("\n".join(md))
    if args.out:
        args.out.write_text(json.dumps({"environment": {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                                                        "page_size": resource.getpagesize()}, "results": results},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

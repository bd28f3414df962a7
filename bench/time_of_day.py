"""Does the hour of the day tell an online policy anything about spot capacity that its recent past does not?

    .venv/bin/python bench/time_of_day.py              # GCP H100 set, 16 nodes (~1 min, 1 core)
    .venv/bin/python bench/time_of_day.py --nodes 4
    .venv/bin/python bench/time_of_day.py --first-day 7   # table 2 only once a week of history is behind

Every policy of kit/policy treats each zone's runs and outages as stationary. The bundled GCP traces have
a daily cycle (table 1: the share of ticks with capacity for the gang, by 3-hour block of the day, UTC), so an
outage at 15:00 might be expected to last longer than one at 03:00. Table 1b: the same share by day. Whether a policy could use that depends on
predicting *from what was seen before*, so every figure in tables 2 and 3 is online: at each tick of each
zone, a predictor may use only that zone's ticks before it (up to two weeks: more history than one job
has, as a profile built from kit's earlier ledgers would have).

2. Capacity H hours ahead, as a probability, scored by log loss (lower is better; clipped to 0.02-0.98):
   ``last 24 h``: the share of the last day's ticks with capacity; ``same hour``: the share at the same
   time of day on every earlier day (the last day's share counted once, as a prior); ``last 24 h x
   profile``: the last day's share times the daily profile (the same hour's share over the whole past
   share: the cycle's shape, at today's level); ``state now``: the
   share, in the zone's past, of ticks H hours after a tick in the state it is in now; ``state + hour``:
   that, from past ticks at the same time of day only.
3. The rest of an outage in progress (its age known), predicted as the mean residual of the zone's earlier
   outages that outlasted this age (the data part of ``DefaultPolicy._rest_of_outage`` in
   kit/policy/market.py, without its prior outage and censored-exponential tail), from
   all earlier outages or only from those that began within 1.5 h of the same time of day (all of them
   when none did): the mean absolute error in hours, and the log loss of "it lasts 3 h more".
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kit.traces import load_traces, resolve

HORIZONS_H = (1, 3, 6, 12)
LONG_REST_H = 3.0
WINDOW_H = 1.5


def log_loss(p: float, y: float) -> float:
    p = min(max(p, 0.02), 0.98)
    return -(y * math.log(p) + (1 - y) * math.log(1 - p))


def by_hour(up: np.ndarray, per_day: int, start_hour: float) -> list[float]:
    """Share of ticks with capacity for each 3-hour block of the day (UTC), 00-03 first."""
    hours = (start_hour + np.arange(len(up)) * 24 / per_day) % 24
    return [float(up[(hours >= h) & (hours < h + 3)].mean()) for h in range(0, 24, 3)]


def predictions(up: np.ndarray, i: int, ahead: int, per_day: int) -> dict[str, float]:
    """The five predictors of table 2 for tick ``i + ahead``, from the ticks before ``i`` (and the state at ``i``)."""
    recent = float(up[i - per_day:i].mean())
    same = up[(i + ahead) % per_day:i:per_day]
    state = up[ahead:i][up[:i - ahead] == up[i]]
    state_p = (state.sum() + recent) / (len(state) + 1)
    hour = np.arange(i % per_day, i - ahead, per_day)
    hour = hour[up[hour] == up[i]]
    # the daily profile as a factor on the current level: the same hour's share over the zone's whole past share
    profile = ((same.sum() + 1) / (len(same) + 1)) / ((up[:i].sum() + 1) / (i + 1))
    return {"last 24 h": recent, "same hour": (same.sum() + recent) / (len(same) + 1),
            "last 24 h x profile": min(1.0, recent * profile),
            "state now": state_p, "state + hour": (up[hour + ahead].sum() + state_p) / (len(hour) + 1)}


def capacity_scores(traces, nodes: int, per_day: int, first_day: int = 1) -> dict[int, dict[str, float]]:
    scores: dict[int, dict[str, float]] = {}
    for horizon in HORIZONS_H:
        ahead, total, n = round(horizon * per_day / 24), {}, 0
        for trace in traces:
            up = np.asarray(trace.spot_available(nodes), dtype=float)
            for i in range(first_day * per_day, len(up) - ahead):
                for name, p in predictions(up, i, ahead, per_day).items():
                    total[name] = total.get(name, 0.0) + log_loss(p, up[i + ahead])
                n += 1
        scores[horizon] = {name: value / n for name, value in total.items()}
    return scores


def outages(up: np.ndarray) -> list[tuple[int, int]]:
    """(first tick, length) of each outage that ends inside the trace."""
    a = np.concatenate(([True], up.astype(bool), [True]))
    starts, ends = np.flatnonzero(a[:-1] & ~a[1:]), np.flatnonzero(~a[:-1] & a[1:])
    return [(int(s), int(e - s)) for s, e in zip(starts, ends) if s > 0 and e < len(up)]


def rest_estimate(earlier: list[int], age: int) -> float | None:
    longer = [n - age for n in earlier if n > age]
    return sum(longer) / len(longer) if longer else None


def outage_scores(traces, nodes: int, per_day: int, tick_h: float) -> dict[str, tuple[float, float]]:
    window = WINDOW_H / tick_h
    errors: dict[str, list[float]] = {"all earlier outages": [], "same time of day": []}
    losses: dict[str, list[float]] = {name: [] for name in errors}
    for trace in traces:
        found = outages(np.asarray(trace.spot_available(nodes)))
        for k, (start, length) in enumerate(found):
            seen = [(s, n) for s, n in found[:k] if s + n <= start]  # ended before this one began
            near = [n for s, n in seen if min(abs(s - start) % per_day, per_day - abs(s - start) % per_day) <= window]
            for age in range(length):
                rest_all = rest_estimate([n for _, n in seen], age)
                rest_near = rest_estimate(near, age) if near else rest_all
                if rest_all is None or rest_near is None:
                    continue
                truth = length - age
                for name, guess in (("all earlier outages", rest_all), ("same time of day", rest_near)):
                    errors[name].append(abs(guess - truth) * tick_h)
                    long_p = 1 - math.exp(-LONG_REST_H / max(guess * tick_h, 1e-9))  # exponential rest
                    losses[name].append(log_loss(1 - long_p, float(truth * tick_h > LONG_REST_H)))
    return {name: (float(np.mean(errors[name])), float(np.mean(losses[name]))) for name in errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="gcp-a3-h100-2025-10")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--first-day", type=int, default=1, help="score table 2 from this day on, counted from 0 (at least 1: a day of history)")
    args = parser.parse_args()
    traces = load_traces([resolve(args.set)])
    tick_h = traces[0].tick_h
    per_day = round(24 / tick_h)
    start = datetime.fromisoformat(str(traces[0].metadata.get("start_utc", "1970-01-01T00:00:00Z")))
    start_hour = start.hour + start.minute / 60
    print(f"{args.set}, {len(traces)} zones, N = {args.nodes}, {tick_h * 60:.0f}-min ticks\n")
    print("| zone | " + " | ".join(f"{h:02d}" for h in range(0, 24, 3)) + " |")
    print("|---|" + "---:|" * 8)
    for trace in traces:
        shares = by_hour(np.asarray(trace.spot_available(args.nodes), dtype=float), per_day, start_hour)
        print(f"| {trace.name} | " + " | ".join(f"{s:.2f}" for s in shares) + " |")
    days = len(traces[0]) // per_day
    print(f"\n| zone | share by day, days 1-{days} |\n|---|---|")
    for trace in traces:
        up = np.asarray(trace.spot_available(args.nodes), dtype=float)[:days * per_day]
        print(f"| {trace.name} | " + " ".join(f"{s:.2f}" for s in up.reshape(days, per_day).mean(axis=1)) + " |")
    scores = capacity_scores(traces, args.nodes, per_day, max(1, args.first_day))
    names = list(scores[HORIZONS_H[0]])
    print("\n| capacity ahead | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for horizon, row in scores.items():
        print(f"| {horizon} h | " + " | ".join(f"{row[n]:.4f}" for n in names) + " |")
    print(f"\n| rest of an outage, predicted from | mean absolute error (h) | log loss of > {LONG_REST_H:g} h more |")
    print("|---|---:|---:|")
    for name, (mae, loss) in outage_scores(traces, args.nodes, per_day, tick_h).items():
        print(f"| {name} | {mae:.2f} | {loss:.4f} |")


if __name__ == "__main__":
    main()

"""What an online policy could do on the synthetic multi-zone markets if it knew the market: ``known``.

    .venv/bin/python bench/zone_known.py [--gcp] [--out bench-zone-known.json] [--seeds 11,12,13]   # ~10 min

The synthetic markets of bench/zones.py are five independent on/off Markov chains of capacity whose
transition probabilities are known (``SyntheticZone``). ``known`` is the policy that minimises the
*expected* cost given those probabilities, by backward dynamic programming over (tick, what the job holds
and since when, where its checkpoint is, which zones are up now, progress), and it sees every zone's
capacity now for free (no probes). No online policy knows more without knowing the future, so, on
average over the chains, none does better: it is the online counterpart of ``opt``, which knows the
trace. The one-zone review grid of bench/policies.py plays this program on its one-zone markets. With ``--gcp``, also the
one-region GCP rows of bench/zones.py, with each zone's chain fitted to its whole trace (hindsight
statistics; the real traces need not be Markov chains). What it shows: how much of
``default``'s gap to ``opt`` is learning the market (``default`` - ``known``) and how much is not knowing
the future (``known`` - ``opt``), and whether "below the best zone's ``up``" is within reach of any
online policy on the rows ``default`` misses.

Approximations, each on the side that makes ``known`` a little worse, never better: progress is kept on
the grid of bench/policies.py (whole ticks for the synthetic changeovers, a fifth of a tick for d = 0.2 h),
and the 40-second checkpoint transfer of a move is billed by the replay but not counted against progress
by the program, so ``known`` reads its progress rounded down and plans for a deadline half a tick early.
``known`` is replayed by the same simulator as every policy, so its cost is what it really pays (and the
benchmark fails if it is ever below ``opt``'s). Not a policy kit can run (it reads every zone's capacity and the chains' parameters): analysis only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import replay_args
from zones import MARKETS, synthetic_params, synthetic_set, synthetic_zones

from kit.paths import SPOT_TRACES_DIR
from kit.policy.offers import Moves, Offer
from kit.policy.zones import ZoneObservation, ZonePolicy
from kit.simulate.single import EPS, OPT, Params
from kit.simulate.zones import (
    ZONE_ALL,
    ZoneSet,
    replay,
    simulate_market,
    simulate_opt_zones,
    zone_market,
    zone_starts,
)
from kit.traces import load_traces


def progress_grid(G: float, d: float, C0: float, *, round_up: bool = False) -> tuple[float, list[int], int]:
    """Compute unit u and per-phase progress in units (phase j = ticks held since launch), for the
    grid dynamic programs of the benchmarks (:class:`KnownTable` below, for the multi-zone markets and the
    review grid of bench/policies.py; bench/opt.py's baseline).
    Without a unit of at least 1/240 tick it raises, or with ``round_up`` rounds progress up on
    that finest grid (what the replaced ``opt`` did: optimistic, so no longer exact)."""
    phases = max(1, math.ceil(d / G - 1e-9)) if d > 1e-9 else 0
    progress = [G - min(G, max(0.0, d - j * G)) for j in range(phases + 1)]
    for m in range(1, 241):
        u = G / m
        if all(abs(p / u - round(p / u)) < 1e-6 for p in progress) and abs(C0 / u - round(C0 / u)) < 1e-6:
            return u, [round(p / u) for p in progress], round(C0 / u)
    if not round_up:
        raise ValueError(f"changeover {d} h and tick {G} h have no common unit of at least 1/240 tick")
    u = G / 240
    return u, [math.ceil(p / u - 1e-9) for p in progress], math.floor(C0 / u + 1e-9)


BIG = 1e12  # "cannot finish in time" (not inf: expectations multiply it by probabilities that may be 0)
STAY, WAIT, LAUNCH = 0, 1, 2


class Holdings:
    """The holding states of the program, indexed 0..H-1. ``src`` (where the newest checkpoint is) is 0 for
    "no checkpoint yet" and 1 + zone index otherwise.

    * idle with the checkpoint in ``src``: index ``src``;
    * an offer in its changeover, ``j`` ticks held (j < k), launched from ``src``: the checkpoint is still
      there (a run lost now leaves it where it was);
    * an offer past its changeover (the checkpoint is in its zone).

    ``step``: the progress the next tick held makes, in the grid's units (``per_phase``: one entry per
    changeover tick, then a whole tick's)."""

    def __init__(self, offers: tuple[Offer, ...], zones: tuple[str, ...], per_phase: list[int]) -> None:
        k = self.k = len(per_phase) - 1
        self.offers, self.zones = offers, zones
        self.S = len(zones) + 1
        O = len(offers)
        self.H = self.S + O * k * self.S + O
        self.offer = np.full(self.H, -1)  # the offer held (-1: idle)
        self.ckpt = np.zeros(self.H, dtype=int)  # where the checkpoint is while in this state
        self.next = np.arange(self.H)  # the state after holding one more tick
        self.step = np.zeros(self.H, dtype=int)
        self.ckpt[: self.S] = np.arange(self.S)
        for o, offer in enumerate(offers):
            for j in range(k):
                for src in range(self.S):
                    h = self.setup(o, j, src)
                    self.offer[h], self.ckpt[h], self.step[h] = o, src, per_phase[j]
                    self.next[h] = self.setup(o, j + 1, src) if j + 1 < k else self.producing(o)
            h = self.producing(o)
            self.offer[h], self.ckpt[h], self.step[h] = o, 1 + zones.index(offer.zone), per_phase[-1]

    def setup(self, o: int, j: int, src: int) -> int:
        return self.S + (o * self.k + j) * self.S + src

    def producing(self, o: int) -> int:
        return self.S + len(self.offers) * self.k * self.S + o

    def launched(self, o: int, src: int) -> int:
        """The state of a launch of offer ``o`` from ``src``, before its first tick."""
        return self.setup(o, 0, src) if self.k else self.producing(o)


Chains = Mapping[str, tuple[float, float]]  # zone -> (P(down next tick | up), P(up next tick | down))


def fitted_chains(market: ZoneSet) -> dict[str, tuple[float, float]]:
    """Each zone's on/off chain fitted to its whole trace (the share of up ticks followed by a down one, and
    of down ticks followed by an up one): what a job would know if it knew each zone's statistics, not when."""
    out = {}
    for offer, up in market.avail.items():
        a = np.asarray(up, dtype=bool)
        went_down = float(np.sum(a[:-1] & ~a[1:])) / max(1, int(np.sum(a[:-1])))
        came_up = float(np.sum(~a[:-1] & a[1:])) / max(1, int(np.sum(~a[:-1])))
        out[offer.zone] = (min(1.0, max(1e-4, went_down)), min(1.0, max(1e-4, came_up)))
    return out


class KnownTable:
    """Backward dynamic programming for one market of independent on/off chains and one job: the best action
    of every state (tick, holding, zones up, progress in grid units)."""

    def __init__(self, market: ZoneSet, chains: Chains, params: Params, moves: Moves) -> None:
        G = market.G
        self.unit, per_phase, self.target = progress_grid(G, params.changeover_h, params.job_h)
        self.G, self.zones, self.offers = G, market.zones, market.offers
        self.hold = Holdings(market.offers, market.zones, per_phase)
        self.deadline = params.deadline_h - G / 2  # half a tick short: the transfers the program leaves out
        self.span = int(np.ceil(self.deadline / G - 1e-9))
        Z = len(self.zones)
        self.up = np.array([[bool(s >> z & 1) for z in range(Z)] for s in range(2 ** Z)])  # (states, zones)
        # (holdings, states): the holding is a spot offer whose zone has no capacity (cannot be held or launched)
        self.down = np.zeros((self.hold.H, 2 ** Z), dtype=bool)
        for h, o in enumerate(self.hold.offer):
            if o >= 0 and self.offers[o].spot:
                self.down[h] = ~self.up[:, self.zones.index(self.offers[o].zone)]
        self.mix = [np.array([[1 - chains[z][1], chains[z][1]], [chains[z][0], 1 - chains[z][0]]]) for z in self.zones]
        start = market.ticks // 2  # constant spot prices (the synthetic and the GCP sets)
        self.price = np.array([market.prices[o][start] if o.spot else o.price for o in market.offers])
        where = [None, *self.zones]
        self.egress = np.array([[moves.egress(src, o.zone) for o in market.offers] for src in where])
        self.act = np.zeros((self.span, self.hold.H, 2 ** Z, self.target), dtype=np.int8)
        self.pick = np.zeros((self.span, self.hold.S, 2 ** Z, self.target), dtype=np.int8)
        self._solve()

    def _expect(self, value: np.ndarray) -> np.ndarray:
        """E[value at the next tick's zone states | the states now], zones independent."""
        Z = len(self.zones)
        H, S, C = value.shape
        v = value.reshape(H, *(2,) * Z, C)
        for z in range(Z):
            axis = 1 + (Z - 1 - z)  # zone z is bit z of the state index
            v = np.moveaxis(np.tensordot(self.mix[z], v, axes=([1], [axis])), 0, axis)
        return v.reshape(H, S, C)

    def _held(self, nxt: np.ndarray, now: float) -> np.ndarray:
        """Cost to go of holding one more tick from each holding state (offer states only), every zone state.
        A tick that completes the job is billed up to the moment it does."""
        hs, G, C, u = self.hold, self.G, self.target, self.unit
        out = np.full(nxt.shape, BIG)
        held = np.nonzero(hs.offer >= 0)[0]
        for step in np.unique(hs.step[held]):
            these = held[hs.step[held] == step]
            cost = (self.price[hs.offer[these]] * G)[:, None, None]
            if step == 0:
                out[these] = cost + nxt[hs.next[these]]
                continue
            out[these, :, : C - step] = cost + nxt[hs.next[these], :, step:]
            for c in range(max(0, C - step), C):  # the job completes within this tick
                early = (c + step - C) * u
                if now + G - early <= self.deadline + 1e-9:
                    out[these, :, c] = (self.price[hs.offer[these]] * (G - early))[:, None]
        out[self.down] = BIG
        return np.minimum(out, BIG)

    def _solve(self) -> None:
        hs, C = self.hold, self.target
        value = np.full((hs.H, 2 ** len(self.zones), C), BIG)  # past the deadline: missed
        O, lost = len(self.offers), self.down  # a spot run whose zone is down is lost at the tick's start
        for i in range(self.span - 1, -1, -1):
            nxt = self._expect(value)
            held = self._held(nxt, i * self.G)
            first = np.stack([held[[hs.launched(o, src) for o in range(O)]] + self.egress[src][:, None, None]
                              for src in range(hs.S)])  # (src, offer, states, C): launch each offer now
            launch, self.pick[i] = first.min(axis=1), first.argmin(axis=1)
            wait = nxt[: hs.S]
            options = np.stack([held, wait[hs.ckpt], launch[hs.ckpt]])  # stay, wait, launch
            idle = np.minimum(wait, launch)
            choice = options.argmin(axis=0)
            best = np.take_along_axis(options, choice[None], axis=0)[0]
            best[lost] = idle[hs.ckpt][lost]
            choice[lost] = np.where(wait[hs.ckpt] <= launch[hs.ckpt], WAIT, LAUNCH)[lost]
            self.act[i], value = choice, np.minimum(best, BIG)


class Known(ZonePolicy):
    """Plays a :class:`KnownTable`: reads every zone's capacity now (not the future) from the market."""

    name = "known"

    def __init__(self, table: KnownTable, market: ZoneSet, start: int) -> None:
        super().__init__(market.offers, Moves(), seed=start)
        self.t, self.avail, self.start = table, market.avail, start
        self.ticks_held, self.src = 0, 0
        self.spot = [next(o for o in self.offers if o.spot and o.zone == zone) for zone in table.zones]  # by zone

    def _zone_state(self, i: int) -> int:
        """The program's index of which zones are up at tick ``i`` (zone z is bit z)."""
        return sum(int(bool(self.avail[spot][self.start + i])) << z for z, spot in enumerate(self.spot))

    def decide(self, obs: ZoneObservation, market) -> list[Offer]:
        t, hs = self.t, self.t.hold
        if obs.remaining_h <= EPS:
            return []
        i = min(round(obs.now_h / t.G), t.span - 1)
        ckpt = 0 if obs.checkpoint_zone is None else 1 + t.zones.index(obs.checkpoint_zone)
        if obs.running is None:
            h = ckpt
        elif self.ticks_held < hs.k:
            h = hs.setup(self.offers.index(obs.running), self.ticks_held, self.src)
        else:
            h = hs.producing(self.offers.index(obs.running))
        # progress rounded down: a move's transfer, which the program leaves out, makes it a little late, never early
        s, c = self._zone_state(i), min(int(obs.progress_h / t.unit + 1e-6), t.target - 1)
        action = t.act[i, h, s, c] if obs.running is not None else (
            LAUNCH if t.act[i, ckpt, s, c] == LAUNCH else WAIT)
        if action == STAY:
            self.ticks_held += 1
            return [obs.running]
        if action == WAIT:
            return []
        self.ticks_held, self.src = 1, ckpt
        return [self.offers[t.pick[i, ckpt, s, c]]]


def known_row(market: ZoneSet, chains: Chains, params: Params, moves: Moves) -> dict:
    """``known`` and every policy of bench/zones.py on one market; egress as a share of the baseline."""
    began = time.time()
    table = KnownTable(market, chains, params, moves)
    solved = time.time() - began
    starts = zone_starts(market, params)
    runs = [replay(market, s, params, moves, Known(table, market, s)) for s in starts]
    bounds = [simulate_opt_zones(market, s, params, moves) for s in starts]
    for start, run, bound in zip(starts, runs, bounds):  # opt knows the trace: no policy is below it
        if run.cost < bound.cost - 1e-6 and not bound.missed:
            raise AssertionError(f"known below opt at start {start}: {run.cost} < {bound.cost}")
    # every other policy; opt's row is the mean of the bounds above (the same starts), not solved again
    summary = simulate_market(market, [p for p in ZONE_ALL if p != OPT], params, moves)
    summary["cost_vs_on_demand"][OPT] = float(np.mean([b.cost_vs_on_demand for b in bounds]))
    baseline = market.baseline(params)
    return {"known": float(np.mean([r.cost_vs_on_demand for r in runs])),
            "known_misses": sum(r.missed for r in runs), "seconds": solved,
            "known_egress": float(np.mean([r.egress for r in runs])) / baseline,
            "default_egress": summary["egress"]["default"] / baseline,
            "known_moves": float(np.mean([r.moves for r in runs])), "default_moves": summary["moves"]["default"],
            **{k: summary["cost_vs_on_demand"][k] for k in ("opt", "default", "failover", "up@best-zone")},
            "default_misses": summary["deadline_misses"]["default"]}


def synthetic_row(seed: int, d_ticks: int, deadline: float) -> dict:
    """A reported synthetic setting of bench/zones.py, with the chains it was drawn from."""
    params, moves = synthetic_params(d_ticks, deadline), Moves()
    market = zone_market(synthetic_set(seed), params, moves)
    return known_row(market, {z.zone: z.rates for z in synthetic_zones(seed)}, params, moves)


def gcp_row(prefix: str, deadline: float) -> dict:
    """The one-region GCP rows of bench/zones.py (N = 16, d = 0.2 h), with chains fitted to the whole traces."""
    traces = [t for t in load_traces([SPOT_TRACES_DIR / replay_args.GCP]) if t.name.startswith(prefix)]
    params, moves = Params(nodes=16, job_h=48.0, deadline_h=deadline, changeover_h=0.2, starts=8), Moves()
    market = zone_market(traces, params, moves)
    return known_row(market, fitted_chains(market), params, moves)


HEADER = [("| d, R0, seed | opt | known | default | failover | up@best-zone | known / opt | default - known | "
           "egress: known / default | moves: known / default | known below baselines |"),
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]


def line(label: str, r: dict) -> str:
    below = r["known"] < min(r["failover"], r["up@best-zone"])
    return (f"| {label} | {r['opt']:.4f} | {r['known']:.4f} ({r['known_misses']}) | {r['default']:.4f} "
            f"({r['default_misses']}) | {r['failover']:.4f} | {r['up@best-zone']:.4f} | {r['known'] / r['opt']:.3f} | "
            f"{r['default'] - r['known']:+.4f} | {r['known_egress']:.3f} / {r['default_egress']:.3f} | "
            f"{r['known_moves']:.1f} / {r['default_moves']:.1f} | {'yes' if below else '**no**'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seeds", default="11,12,13")
    ap.add_argument("--d-ticks", default="1,2,4")
    ap.add_argument("--gcp", action="store_true", help="and the one-region GCP rows, with chains fitted to the traces")
    args = ap.parse_args()
    out, md = {}, list(HEADER)
    for label, prefix in MARKETS[1:] if args.gcp else ():
        for deadline in (60.0, 72.0):
            r = out[f"gcp/{label}/R{deadline:g}"] = gcp_row(prefix, deadline)
            md.append(line(f"{label}, N=16, R0={deadline:g} (fitted)", r))
            print(md[-1], f"({r['seconds']:.0f} s)", flush=True)
    for d_ticks in map(int, args.d_ticks.split(",")):
        for deadline in (60.0, 72.0):
            for seed in map(int, args.seeds.split(",")) if args.seeds else ():
                r = out[f"d{d_ticks}/R{deadline:g}/s{seed}"] = synthetic_row(seed, d_ticks, deadline)
                md.append(line(f"d={d_ticks} ticks, R0={deadline:g}, seed {seed}", r))
                print(md[-1], f"({r['seconds']:.0f} s)", flush=True)
    rows = list(out.values())
    below = sum(r["known"] < min(r["failover"], r["up@best-zone"]) for r in rows)
    default_below = sum(r["default"] < min(r["failover"], r["up@best-zone"]) for r in rows)
    md += ["", (f"{len(rows)} rows: `known` below both baselines in {below}, `default` in {default_below}; mean `known` / "
           f"`opt` {np.mean([r['known'] / r['opt'] for r in rows]):.3f}, `default` / `opt` "
           f"{np.mean([r['default'] / r['opt'] for r in rows]):.3f}; deadline misses: `known` "
           f"{sum(r['known_misses'] for r in rows)}, `default` {sum(r['default_misses'] for r in rows)}")]
    print("\n".join(md))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

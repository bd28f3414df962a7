"""kit.simulate: the exact model, invariants (on-demand = 1, opt <= every policy, no avoidable
misses), the omniscient DP against brute force, and the ``kit simulate`` command."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kit.cli import app
from kit.paths import SPOT_TRACES_DIR
from kit.policy import ON_DEMAND, POLICY_NAMES, SPOT, WAIT
from kit.simulate import OPT, Params, simulate, simulate_opt, simulate_policy, single, span_ticks, start_ticks
from kit.traces import Trace, load_traces, markov_availability

LIVE = list(POLICY_NAMES)


def make_trace(data, gap_seconds=1800, **metadata):
    return Trace(path=Path("hand.json"), gap_seconds=gap_seconds, data=tuple(data),
                 metadata={"gap_seconds": gap_seconds, **metadata})


def markov_trace(seed, n=400, p_up=0.5, mean_up=3.0, nodes=4, gap_seconds=1800):
    """On/off capacity with geometric run lengths (mean ``mean_up`` ticks up)."""
    data = markov_availability(seed, n, p_up, mean_up, nodes)
    return make_trace(data, gap_seconds, spot_price_per_hour=1.0, on_demand_price_per_hour=3.0)


class Scripted:
    name = "scripted"

    def __init__(self, actions):
        self.actions = list(actions)
        self.i = 0

    def decide(self, obs):
        action = self.actions[self.i] if self.i < len(self.actions) else ON_DEMAND
        self.i += 1
        return action


def test_model_by_hand():
    # all spot: one launch, d billed at the spot price, then C0 of progress
    p = Params(nodes=4, job_h=3.0, deadline_h=6.0, changeover_h=0.5, starts=1)
    t = make_trace([4] * 20, 3600, spot_price_per_hour=1.0, on_demand_price_per_hour=4.0)
    run = simulate_policy(t, 0, "greedy", p)
    assert run.cost == pytest.approx(4 * 1.0 * 3.5) and run.done_h == pytest.approx(3.5) and not run.missed
    assert run.cost_vs_on_demand == pytest.approx(0.25) and run.launches == 1
    # gang: 3 of 4 nodes is no spot; a lost spot cluster pays a new changeover
    t = make_trace([4, 4, 3, 4, 4, 4, 4, 4], 3600, spot_price_per_hour=1.0, on_demand_price_per_hour=4.0)
    run = simulate_policy(t, 0, "spot", Params(nodes=4, job_h=3.0, deadline_h=7.0, changeover_h=0.5, starts=1))
    # ticks 0-1: 0.5 setup + 1.5 progress; tick 2 lost; 3: 0.5 setup + 0.5; 4: 1.0 done at 5.0
    assert run.launches == 2 and run.done_h == pytest.approx(5.0) and run.cost == pytest.approx(4 * 4.0)
    # per-tick prices are used when the trace has them
    t = Trace(path=Path("p.json"), gap_seconds=3600, data=(4,) * 10, metadata={"gap_seconds": 3600},
              prices=tuple([2.0] * 10))
    run = simulate_policy(t, 0, "greedy", Params(nodes=1, job_h=1.0, deadline_h=5.0, changeover_h=0.0, starts=1,
                                                 on_demand_price=8.0))
    assert run.cost == pytest.approx(2.0) and run.cost_vs_on_demand == pytest.approx(0.25)


def test_starts_and_span_follow_the_issue():
    t = make_trace([1] * 1000, 600)
    p = Params(nodes=1, deadline_h=60.0, starts=8)
    span = span_ticks(p, t.tick_h)
    assert span == math.ceil(60 / (600 / 3600)) + 1 == 361
    assert start_ticks(t, p) == list(np.linspace(0, 1000 - span, 8).astype(int))
    assert start_ticks(make_trace([1] * 360, 600), p) == []  # shorter than span: skipped
    s = simulate([make_trace([1] * 360, 600)], ["greedy"], p)
    assert s["runs"] == 0 and s["skipped_traces"] == ["hand"]


def test_safety_net_fires_exactly_when_it_must_in_the_simulator():
    # no spot ever: C0 = 5, R0 = 10, d = 0.2, G = 0.5. Slack at tick t is 10 - t - 5.2; the net
    # fires at the first tick with slack <= 0.5, t = 4.5, and the job ends at 9.7 <= 10.
    p = Params(nodes=1, job_h=5.0, deadline_h=10.0, changeover_h=0.2, starts=1)
    t = make_trace([0] * 30, 1800, spot_price_per_hour=1.0, on_demand_price_per_hour=4.0)
    for name in ("spot", "greedy", "threshold"):
        run = simulate_policy(t, 0, name, p, record=True)
        first = next(row["t"] for row in run.timeline if row["market"] == ON_DEMAND)
        assert first == pytest.approx(4.5), name
        assert run.done_h == pytest.approx(9.7) and not run.missed


def test_on_demand_costs_exactly_one():
    traces = load_traces([SPOT_TRACES_DIR / "gcp-a3-h100-2025-10"])
    for deadline in (60.0, 72.0):
        s = simulate(traces, ["on-demand"], Params(deadline_h=deadline))
        assert s["runs"] == 104 and s["deadline_misses"]["on-demand"] == 0
        assert abs(s["cost_vs_on_demand"]["on-demand"] - 1.0) < 1e-9
    runs = [simulate_policy(markov_trace(i), 0, "on-demand", Params(nodes=4, job_h=20, deadline_h=30))
            for i in range(5)]
    assert all(abs(r.cost_vs_on_demand - 1.0) < 1e-9 for r in runs)


@pytest.mark.parametrize("d", [0.5, 0.2001, 1.3, 0.001])
def test_opt_matches_brute_force(d, monkeypatch):
    """7 ticks of 1 h, C0 = 3, R0 = 6: every action sequence enumerated with the same simulator. A
    changeover that is no simple fraction of a tick (0.2001 h) or longer than one (1.3 h) is exact
    too (a compute grid rounded it: 7.2002 for 7.2006), and so is one far below a tick (0.001 h: more
    launches than the 7 ticks allow would fit in the slack). Each both ways: over waste arrays and, as
    where those would be large, over the multi-zone program's Pareto fronts of this one zone."""
    p = Params(nodes=2, job_h=3.0, deadline_h=6.0, changeover_h=d, starts=1)
    for data in ([2, 0, 2, 2, 0, 2, 2], [0, 2, 2, 0, 0, 2, 2], [2, 2, 2, 2, 2, 2, 2], [0, 0, 0, 0, 0, 0, 0],
                 [2, 2, 0, 2, 2, 2, 2]):
        t = make_trace(data, 3600, spot_price_per_hour=1.0, on_demand_price_per_hour=3.0)
        best = math.inf
        for actions in itertools.product((SPOT, ON_DEMAND, WAIT), repeat=len(data)):
            run = simulate_policy(t, 0, "scripted", p, policy=Scripted(actions))
            if not run.missed:
                best = min(best, run.cost)
        assert simulate_opt(t, 0, p).cost == pytest.approx(best, rel=1e-12), data
        with monkeypatch.context() as m:
            m.setattr(single, "GRID_STATES_MAX", 0)
            assert simulate_opt(t, 0, p).cost == pytest.approx(best, rel=1e-12), data


def test_opt_states_do_not_grow_as_the_changeover_shrinks():
    """A schedule launches at most once a tick, so the launches axis is at most the window's ticks: d = 1e-4 h
    gave 120,001 launches x 73 idle ticks (60 h at 10-min ticks), 361 ticks now. Where the arrays would still be
    large (32-second ticks), ``opt`` runs over fronts (test_opt_matches_brute_force checks both are exact)."""
    params = Params(nodes=1, job_h=48.0, deadline_h=60.0, changeover_h=1e-4)
    ten_min = span_ticks(params, 1 / 6)
    assert single.grid_states(1 / 6, 1e-4, 12.0, max_launches=ten_min) == (ten_min + 1) * 73
    assert single.grid_states(1 / 6, 1e-4, 12.0, max_launches=ten_min) <= single.GRID_STATES_MAX
    assert single.grid_states(32 / 3600, 1e-4, 12.0, max_launches=span_ticks(params, 32 / 3600)) \
        > single.GRID_STATES_MAX


def test_opt_is_a_lower_bound_and_feasible_deadlines_are_met():
    params = Params(nodes=4, job_h=20.0, deadline_h=30.0, changeover_h=0.2, starts=3)
    traces = [markov_trace(seed, p_up=p_up, mean_up=mean_up)
              for seed, (p_up, mean_up) in enumerate([(0.2, 2), (0.5, 1.5), (0.8, 6), (0.5, 20), (0.05, 3)])]
    gcp = load_traces([SPOT_TRACES_DIR / "gcp-a3-h100-2025-10" / f"{z}.json"
                       for z in ("us-central1-b", "us-east4-a", "asia-southeast1-c")])
    cases = [(t, params) for t in traces] + [(t, Params(deadline_h=60.0, starts=2)) for t in gcp]
    for trace, p in cases:
        for start in start_ticks(trace, p):
            opt = simulate_opt(trace, start, p)
            assert not opt.missed
            for name in LIVE:
                run = simulate_policy(trace, start, name, p)
                assert not run.missed, (trace.name, start, name)  # R0 >= C0 + d: the net always makes it
                assert opt.cost <= run.cost + 1e-6, (trace.name, start, name, opt.cost, run.cost)


def random_market(seed: int) -> tuple[Trace, Params]:
    """One zone, everything drawn: ticks of 195 s to 1 h, a changeover of none to an hour (0.2001 h: no unit in
    common with the tick), slack from a few minutes to hours (but more than a tick, or no policy could start),
    gangs of 1-4 nodes, spot at 6-117 % of on-demand, markets from nearly dead to nearly always up."""
    rng = random.Random(seed)
    gap = rng.choice([195, 300, 600, 1800, 3600])
    job = rng.uniform(2, 15)
    d = rng.choice([0.0, 0.1, 0.2001, 0.5, 1.0, gap / 3600, 3 * gap / 3600])
    slack = max(rng.choice([rng.uniform(0.05, 0.5), rng.uniform(0.5, 8)]), 1.5 * gap / 3600)
    nodes = rng.choice([1, 2, 4])
    params = Params(nodes=nodes, job_h=job, deadline_h=job + d + slack, changeover_h=d, starts=2)
    ticks = max(rng.randint(150, 500), int(params.deadline_h * 3600 / gap) + 5)
    data = markov_availability(seed, ticks, rng.uniform(0.05, 0.95), rng.uniform(1.2, 30), nodes)
    return make_trace(data, gap, spot_price_per_hour=round(rng.uniform(0.3, 3.5), 3),
                      on_demand_price_per_hour=round(rng.uniform(3, 5), 3)), params


@pytest.mark.parametrize("seed", range(200))
def test_on_random_markets_opt_is_below_every_policy_and_none_misses(seed):
    """The two invariants on markets no constant was chosen on (seeds 0-59999 of this generator were replayed
    once, outside the suite, with no failure)."""
    trace, params = random_market(seed)
    for start in start_ticks(trace, params):
        opt = simulate_opt(trace, start, params)
        assert not opt.missed
        for name in LIVE:
            run = simulate_policy(trace, start, name, params)
            assert not run.missed, (name, start)
            assert opt.cost <= run.cost + 1e-6, (name, start, opt.cost, run.cost)


def test_infeasible_deadline_is_a_miss_for_everyone():
    p = Params(nodes=1, job_h=5.0, deadline_h=5.1, changeover_h=0.2, starts=1)
    t = make_trace([1] * 40, 1800, spot_price_per_hour=1.0, on_demand_price_per_hour=4.0)
    s = simulate([t], LIVE + [OPT], p)
    assert all(s["deadline_misses"][name] == 1 for name in LIVE + [OPT])


def test_cli_json_and_plot(tmp_path):
    zone = SPOT_TRACES_DIR / "gcp-a3-h100-2025-10" / "us-central1-a.json"
    png = tmp_path / "sim.png"
    result = CliRunner().invoke(app, ["simulate", str(zone), "--policy", "all", "--starts", "2", "--json",
                                      "--plot", str(png)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["runs"] == 2 and set(doc["cost_vs_on_demand"]) == set(LIVE + [OPT])
    assert doc["deadline_misses"] == {name: 0 for name in LIVE + [OPT]}
    assert doc["cost_vs_on_demand"]["on-demand"] == pytest.approx(1.0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # minimal-metadata trace: the price flags apply
    mini = tmp_path / "mini.json"
    mini.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [2] * 30}))
    result = CliRunner().invoke(app, ["simulate", str(mini), "--policy", "greedy", "--nodes", "2", "--job-hours",
                                      "4", "--deadline-hours", "8", "--changeover-hours", "0", "--starts", "1",
                                      "--spot-price", "1", "--on-demand-price", "5", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["cost_vs_on_demand"]["greedy"] == pytest.approx(0.2)


def test_cli_errors_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": {}, "data": [1]}')
    for args in (["simulate", str(bad)], ["simulate", str(tmp_path / "nope.json")],
                 ["simulate", str(bad), "--policy", "cheapest"], ["simulate", str(bad), "--nodes", "0"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output


def test_simulator_passes_the_trace_prices_to_the_policy():
    seen = []

    class Recorder(Scripted):
        def decide(self, obs):
            seen.append((obs.spot_price, obs.on_demand_price))
            return super().decide(obs)

    t = Trace(path=Path("p.json"), gap_seconds=3600, data=(1,) * 6, metadata={"gap_seconds": 3600,
              "on_demand_price_per_hour": 9.0}, prices=(1.0, 2.0, 3.0, 1.0, 2.0, 3.0))
    simulate_policy(t, 0, "rec", Params(nodes=1, job_h=3.0, deadline_h=4.0, changeover_h=0.0, starts=1),
                    policy=Recorder([SPOT] * 6))
    assert seen[:3] == [(1.0, 9.0), (2.0, 9.0), (3.0, 9.0)]
    seen.clear()  # no prices in the trace: the flags
    simulate_policy(make_trace([1] * 6, 3600), 0, "rec", Params(nodes=1, job_h=2.0, deadline_h=4.0, changeover_h=0.0,
                    starts=1, spot_price=2.0, on_demand_price=7.0), policy=Recorder([SPOT] * 6))
    assert seen[0] == (2.0, 7.0)


def test_default_on_many_short_spot_runs():
    """Spot runs of one 10-minute tick never make progress (d = 12 min): after trying a few, default
    leaves them alone, so it costs at most a few of those ticks more than on-demand and less than
    greedy (which takes every one); with two-tick runs, which do pay, it is Greedy."""
    p60, p72 = (Params(nodes=4, job_h=48.0, deadline_h=r, changeover_h=0.2, starts=1) for r in (60.0, 72.0))
    for pattern in ([4, 0], [4, 0, 0], [4, 0, 4, 0, 0]):
        t = make_trace((pattern * 400)[:700], 600, spot_price_per_hour=1.0, on_demand_price_per_hour=4.0)
        for p in (p60, p72):
            default, greedy = (simulate_policy(t, 0, n, p) for n in ("default", "greedy"))
            assert not default.missed and default.cost_vs_on_demand <= 1.007, (pattern, p.deadline_h)
            assert default.cost_vs_on_demand < greedy.cost_vs_on_demand
    t = make_trace(([4, 4, 0] * 300)[:700], 600, spot_price_per_hour=1.0, on_demand_price_per_hour=4.0)
    for p in (p60, p72):
        default = simulate_policy(t, 0, "default", p)
        assert default.cost_vs_on_demand < 1.0
        assert default.cost_vs_on_demand <= simulate_policy(t, 0, "greedy", p).cost_vs_on_demand + 1e-9


def test_default_does_not_flap_between_on_demand_and_runs_that_cannot_pay_the_round_trip():
    """Spot runs of 1.5 changeovers (18 min, d = 12 min, 3-minute ticks) between outages: a run taken
    from on-demand makes 6 minutes of progress and costs two launches (to spot and back). A run must
    prove itself over that round trip, so default stays on on-demand instead of flapping (before: 16 to 25
    launches and 2.6-2.9 % above on-demand, above ``up`` at R0 = 52 h)."""
    for up, down in ((6, 14), (5, 10), (7, 20)):
        t = make_trace(([4] * up + [0] * down) * 2000, 180, spot_price_per_hour=1.0, on_demand_price_per_hour=3.0)
        for deadline in (52.0, 56.0, 60.0):
            p = Params(nodes=4, job_h=48.0, deadline_h=deadline, changeover_h=0.2, starts=1)
            default, up_ = (simulate_policy(t, 0, n, p) for n in ("default", "up"))
            assert not default.missed and default.launches <= 15, (up, down, deadline, default.launches)
            assert default.cost_vs_on_demand <= min(1.005, up_.cost_vs_on_demand), (up, down, deadline)


def test_default_holds_up_on_markov_markets():
    """Synthetic on/off markets (a review's finding): default is never worse than on-demand by more than
    its learning cost, and beats greedy and up where spot runs are long."""
    for p_up, mean_up in ((0.5, 12), (0.8, 12), (0.2, 40)):
        traces = [markov_trace(s, n=1200, p_up=p_up, mean_up=mean_up, nodes=4, gap_seconds=600) for s in range(2)]
        s = simulate(traces, ["greedy", "up", "default"], Params(nodes=4, job_h=48.0, deadline_h=60.0,
                                                                 changeover_h=0.2, starts=3))
        cost = s["cost_vs_on_demand"]
        assert s["deadline_misses"]["default"] == 0
        assert cost["default"] < min(cost["greedy"], cost["up"]), (p_up, mean_up, cost)


def test_benchmark_target_default_beats_greedy_and_up():
    """The one-zone target on the shared GCP traces: default <= min(greedy, up), no misses, >= opt."""
    traces = load_traces([SPOT_TRACES_DIR / "gcp-a3-h100-2025-10"])
    for deadline in (60.0, 72.0):
        s = simulate(traces, ["greedy", "up", "default"], Params(nodes=16, job_h=48.0, deadline_h=deadline,
                                                                 changeover_h=0.2, starts=8))
        cost = s["cost_vs_on_demand"]
        assert s["runs"] == 104 and s["deadline_misses"] == {"greedy": 0, "up": 0, "default": 0}
        assert cost["default"] < min(cost["greedy"], cost["up"]), (deadline, cost)


def test_opt_at_a_finer_tick_is_never_dearer():
    """The same market at half the tick (every tick twice) gives opt every choice it had and more:
    its bound is never higher, and the changeover need not be a whole number of ticks."""
    data = markov_trace(3, p_up=0.5, mean_up=4).data[:400]
    coarse = make_trace(list(data), 1800, spot_price_per_hour=1.0, on_demand_price_per_hour=3.0)
    fine = make_trace([x for x in data for _ in (0, 1)], 900, spot_price_per_hour=1.0, on_demand_price_per_hour=3.0)
    for d in (0.2, 0.2001, 0.7):
        p = Params(nodes=4, job_h=40.0, deadline_h=60.0, changeover_h=d, starts=1)
        assert simulate_opt(fine, 0, p).cost <= simulate_opt(coarse, 0, p).cost + 1e-9, d


@pytest.mark.parametrize("field, flag", [("deadline_h", "--deadline-hours"), ("job_h", "--job-hours"),
                                         ("changeover_h", "--changeover-hours"),
                                         ("spot_price", "--spot-price/--on-demand-price"),
                                         ("on_demand_price", "--spot-price/--on-demand-price")])
def test_finite_numbers_too_large_to_compute_with_are_refused(field, flag):
    """1e308 is finite, yet overflowed the tick arithmetic (span_ticks, _common_units) or made the costs NaN."""
    from typing import Any

    from kit.errors import InputError

    base: dict[str, Any] = {"nodes": 1, "job_h": 4.0, "deadline_h": 8.0, "changeover_h": 0.2, "starts": 1}
    with pytest.raises(InputError, match="<= 1") as refused:
        Params(**{**base, "deadline_h": 1e308 if field == "job_h" else 8.0, field: 1e308}).check()
    assert refused.value.where == flag
    top = single.MAX_PRICE_PER_HOUR if field.endswith("price") else single.MAX_HOURS
    Params(**{**base, "deadline_h": single.MAX_HOURS, field: top}).check()  # the bound itself is allowed


def test_a_summary_with_a_cost_that_is_not_finite_is_refused_before_any_output():
    """A trace's own prices may be as large as a float allows: what they make is checked before it is printed
    (a table of nan) or written as JSON (``NaN``, which JSON does not have)."""
    from kit.cli.simulate import _require_runs
    from kit.errors import InputError

    def summary(on_demand: float, per_trace: float) -> dict:
        return {"runs": 1, "cost_vs_on_demand": {"spot": 0.5, "on-demand": on_demand}, "spot_hours": {"opt": None},
                "per_trace": {"z": {"spot": per_trace}}, "params": {"nodes": 2}, "skipped_traces": []}

    _require_runs(summary(1.0, 0.5), [Path("z.json")], 8.0)
    for broken, where in ((summary(math.nan, 0.5), "cost_vs_on_demand.on-demand"),
                          (summary(1.0, math.inf), "per_trace.z.spot")):
        with pytest.raises(InputError, match=re.escape(where)):
            _require_runs(broken, [Path("z.json")], 8.0)


def test_a_plot_that_cannot_be_written_after_the_replay_is_a_kit_error(tmp_path):
    """Tried before the replay, the file may still fail when written (a disk full, a directory gone)."""
    from kit.errors import KitError
    from kit.simulate.plot import plot

    trace = markov_trace(0, n=200)
    params = Params(nodes=4, job_h=10.0, deadline_h=20.0, changeover_h=0.2, starts=2)
    summary = simulate([trace], ["greedy", "on-demand"], params)
    with pytest.raises(KitError, match="cannot write the plot") as refused:
        plot([trace], ["greedy", "on-demand"], params, summary, str(tmp_path / "gone" / "p.png"))
    assert (refused.value.where or "").startswith("--plot")

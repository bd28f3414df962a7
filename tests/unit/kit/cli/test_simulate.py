"""``kit simulate`` (kit/cli/simulate.py): how its tables print what the simulator summarised."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kit.cli import app
from kit.cli.simulate import format_misses
from kit.simulate import zones

ZONES = ("us-east4-a", "us-east4-b", "us-east4-c")


def test_misses_print_a_count_whole_and_a_mean_to_two_decimals():
    assert [format_misses(v) for v in (0, 3, 3.0, 2 / 3, 21 / 13)] == ["0", "3", "3", "0.67", "1.62"]


def test_the_mean_zone_row_prints_fractional_misses_to_two_decimals(tmp_path, monkeypatch):
    """Three zones, two starts; the one-zone ``up`` misses both starts in the first zone alone, so
    ``up@mean-zone`` misses 2/3 of a start (kit.simulate.zones' mean over zones), printed 0.67, not
    0.6666666666666666; ``up@best-zone`` (another zone) misses none, a count, printed 0. The model's safety
    net meets every deadline that can be met, the same in every zone, so the first zone's replay is made to
    miss."""
    real = zones.replay

    def replay(market, start, params, moves, policy, **kw):
        run = real(market, start, params, moves, policy, **kw)
        run.missed = run.missed or policy.name == f"up@{ZONES[0]}"
        return run

    monkeypatch.setattr(zones, "replay", replay)
    for zone in ZONES:  # the first zone's spot the dearest: not the best zone
        (tmp_path / f"{zone}.json").write_text(json.dumps({
            "metadata": {"gap_seconds": 600, "zone": zone, "spot_price_per_hour": 2.0 if zone == ZONES[0] else 1.0,
                         "on_demand_price_per_hour": 4.0},
            "data": [2] * 60}))
    result = CliRunner().invoke(app, ["simulate", str(tmp_path), "--zones", "all", "--policy", "up@each",
                                      "--nodes", "2", "--job-hours", "4", "--deadline-hours", "6", "--starts", "2"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines()[2:]}
    assert rows["up@mean-zone"][3] == "0.67", result.output
    assert (rows["up@best-zone"][1], rows["up@best-zone"][4]) == (f"({ZONES[1]})", "0"), result.output

"""`kit watch`'s live line."""

from __future__ import annotations

import io

from rich.console import Console

from kit.watch.commands import status_line
from kit.watch.watcher import TickResult
from tests.support.watch import local_spec


def test_the_live_line_shows_the_clock_market_and_decision_as_text():
    result = TickResult(now=0.0, market="spot", nodes_up=2, nodes_lost=1, step=5, total_steps=10,
                        decision="spot [/x]")
    out = io.StringIO()
    Console(file=out, width=200).print(status_line(result, {"cost": 1.5}, local_spec()))
    text = out.getvalue()
    assert text.startswith("[") and "market spot, 2/2 up, 1 lost, step 5/10" in text, text
    assert "policy says spot [/x]" in text and "cost $1.50" in text, text

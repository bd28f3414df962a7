"""Replay spot-capacity traces against the policies (``kit simulate``), with an omniscient bound.

* :mod:`kit.simulate.single`: one zone, spot vs on-demand (``--zones each``: every zone on its own).
* :mod:`kit.simulate.zones`: a trace set as one multi-zone market: offers, probes, moves.
* :mod:`kit.simulate.plot`: the PNG of one start and the costs.

Both models are documented exactly in docs/policies.md.
"""

from kit.simulate.single import (
    ALL_POLICIES,
    DEFAULT_ON_DEMAND_PRICE,
    DEFAULT_SPOT_PRICE,
    OPT,
    Params,
    Run,
    simulate,
    simulate_opt,
    simulate_policy,
    span_ticks,
    start_ticks,
)

__all__ = ["ALL_POLICIES", "DEFAULT_ON_DEMAND_PRICE", "DEFAULT_SPOT_PRICE", "OPT", "Params", "Run", "simulate",
           "simulate_opt", "simulate_policy", "span_ticks", "start_ticks"]

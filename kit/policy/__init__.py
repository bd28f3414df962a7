"""Where and on what to run, shared by the watcher (``kit watch``) and the simulator (``kit simulate``).

* :mod:`kit.policy.market`: spot vs on-demand in one zone (``Policy``, the deadline safety net).
* :mod:`kit.policy.offers`: the multi-zone model: shapes, offers (zone x shape x market), moves.
* :mod:`kit.policy.zones`: multi-zone policies (``ZonePolicy``): which offer, and when to move.

The model is documented in docs/policies.md, so other implementations can be compared.
"""

from kit.policy.market import (
    DEFAULT_CHANGEOVER_H,
    ON_DEMAND,
    POLICY_NAMES,
    SPOT,
    WAIT,
    DefaultPolicy,
    Observation,
    Policy,
    make_policy,
    safety_net,
)

__all__ = ["DEFAULT_CHANGEOVER_H", "ON_DEMAND", "POLICY_NAMES", "SPOT", "WAIT", "DefaultPolicy", "Observation",
           "Policy", "make_policy", "safety_net"]

"""The compressed clock of the local cloud (kit.clock)."""

from __future__ import annotations

import pytest

from kit.clock import VirtualClock
from kit.errors import InputError


def test_a_rescaled_clock_goes_on_from_where_it_stood():
    clock = VirtualClock(1000.0, 150.0)
    assert clock.at(1010.0) == 1000.0 + 1500.0 and clock.wall_at(2500.0) == 1010.0
    slower = clock.rescaled(1.0, 1010.0)
    assert (slower.origin, slower.at(1010.0), slower.at(1020.0)) == (1000.0, 2500.0, 2510.0)
    assert slower.wall_at(2510.0) == pytest.approx(1020.0)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(InputError):
            VirtualClock(0, bad)

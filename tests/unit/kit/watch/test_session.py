"""The watcher's session: the policy a spec's ``policy`` section builds; the address and the directory it
refuses."""

from __future__ import annotations

import re

import pytest

from kit.policy import ON_DEMAND, SPOT, WAIT, Observation, Policy
from kit.policy.zones import PACE
from kit.spec import parse_spec
from kit.watch.session import make_policy_for
from tests.support.watch import PRICES, local_spec


def test_the_specs_policy_section_builds_the_policy():
    spec = local_spec(policy={"name": "threshold", "threshold": {"k": 2, "window_hours": 1.0, "cooldown_hours": 0.5}})
    policy = make_policy_for(spec)
    assert policy.name == "threshold" and (policy.k, policy.window_h, policy.cooldown_h) == (2, 1.0, 0.5)


def _moving_spec(**fields):
    return parse_spec({"name": "demo", "cloud": "local", "zones": ["a", "b", "c"], "market": "spot",
                       "policy": {"name": "default"}, "prices": PRICES, **fields})


def _first_on_demand_after(policy: Policy, outage_from_h: float, *, deadline_h: float = 72.0, run: int = 2,
                           outage: int = 1) -> float | None:
    """Spot runs of ``run`` ticks after outages of ``outage`` ticks (10-minute ticks), taken whenever the policy
    says so, until ``outage_from_h``; then no spot at all: when does the policy leave waiting for on-demand?"""
    tick, progress, market = 1 / 6, 0.0, None
    for t in range(int(deadline_h / tick)):
        now = t * tick
        spot = now < outage_from_h and t % (run + outage) < run
        answer = policy.decide(Observation(now_h=now, progress_h=progress, job_h=48.0, deadline_h=deadline_h,
                                           changeover_h=0.2, market=market, spot_available=spot, preempted=False,
                                           tick_h=tick, spot_price=1.0, on_demand_price=4.0))
        if now >= outage_from_h and answer == ON_DEMAND:
            return now
        progress += tick if answer == market and answer in (SPOT, ON_DEMAND) else 0.0
        market = answer if answer != WAIT and (spot or answer == ON_DEMAND) else None
    return None


def test_a_default_job_that_may_move_decides_its_market_as_the_multi_zone_default():
    # The simulator's multi-zone `default` decides spot / on-demand / wait with pacing and a one-changeover
    # lookahead (kit.policy.zones.moving_market_policy); the watcher of a job that may move must decide as
    # the policy that was measured. A one-zone job keeps the one-zone `default`.
    moving, pinned = make_policy_for(_moving_spec()), make_policy_for(local_spec(policy={"name": "default"}))
    assert (moving.name, moving.pace, moving.lookahead_d) == ("default", PACE, 1.0)
    assert (pinned.name, pinned.pace, pinned.lookahead_d) == ("default", 0.0, 2.0)
    # 20-minute runs every 30 minutes for 20 h, then a long outage: the one-zone policy, sure of its learned
    # market, waits out most of the slack (on-demand at 30.3 h); the paced one runs on-demand once its slack
    # is below half of Uniform Progress's (22.3 h).
    paced, waited = _first_on_demand_after(moving, 20.0), _first_on_demand_after(pinned, 20.0)
    assert paced is not None and waited is not None and paced < waited - 4.0, (paced, waited)
    # other policies are built as before on a spec that may move
    assert make_policy_for(_moving_spec(policy={"name": "up"})).name == "up"


def test_stopping_early_stops_what_cannot_outlive_kit_then_records_it_and_never_hides_why(tmp_path, caplog):
    from kit.watch.session import Session

    calls = []

    class Backend:
        stops = True

        def interrupted(self, announce):
            calls.append("interrupted")
            announce("the trainers save and stop")
            return self.stops

    class Watcher:
        fail = False

        def record_losses(self):
            calls.append("recorded")
            if self.fail:
                raise RuntimeError("database is locked")

    session = Session(local_spec(), tmp_path)
    session._backend, session.watcher = Backend(), Watcher()
    notes: list[str] = []
    session.stop_early(notes.append)
    assert calls == ["interrupted", "recorded"] and notes == ["the trainers save and stop"]
    session.watcher.fail = True
    session.stop_early(notes.append)  # logged, not raised: the loop's own reason is what the user sees
    assert "could not record the stopped nodes" in caplog.text
    calls.clear()
    session._backend.stops = False  # a cloud's: its nodes run on, so the ledger has nothing to learn now
    session.stop_early(notes.append)
    assert calls == ["interrupted"]


def _listening():
    """A socket listening on a free loopback port (the port in use)."""
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken


def test_an_address_the_endpoint_cannot_bind_is_refused_by_the_early_check():
    from kit.errors import InputError
    from kit.watch.session import check_listen

    assert check_listen("127.0.0.1:0") == ("127.0.0.1", 0) and check_listen(":0") == ("127.0.0.1", 0)
    with _listening() as taken:
        in_use = f"127.0.0.1:{taken.getsockname()[1]}"
        # 256 is no octet (refused without a DNS lookup); 8.8.8.8 is not this machine's (bound, never sent to)
        for listen, why in (("256.0.0.1:0", "cannot listen on 256.0.0.1:0"), ("8.8.8.8:0", "cannot listen on 8.8.8.8:0"),
                            (in_use, "Address already in use"), ("[::1]:0", "IPv4 only"), ("::1:0", "IPv4 only")):
            with pytest.raises(InputError, match=re.escape(why)) as refused:
                check_listen(listen)
            assert refused.value.where == "--listen" and "127.0.0.1:0" in (refused.value.fix or "")


def test_a_port_taken_between_the_check_and_the_bind_is_a_kit_error(tmp_path):
    from kit.errors import InputError, KitError
    from kit.watch.session import Session

    with _listening() as taken, Session(local_spec(), tmp_path) as session:
        port = taken.getsockname()[1]
        with pytest.raises(KitError, match="Address already in use") as refused:
            session.start(listen=f"127.0.0.1:{port}")
    # written by then (the ledger, the lock, the token): a failed operation, not refused input
    assert refused.value.where == "--listen" and not isinstance(refused.value, InputError)


def test_a_deployment_directory_that_cannot_be_made_is_input_error(tmp_path):
    from kit.errors import InputError
    from kit.watch.session import Session

    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cannot create the deployment directory: Not a directory") as refused:
        Session(local_spec(), tmp_path / "file" / "sub").__enter__()
    assert refused.value.where == str(tmp_path / "file" / "sub") and "directory you can write" in (refused.value.fix or "")

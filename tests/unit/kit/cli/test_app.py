"""kit.cli.app: the one error handler; Ctrl-C and SIGTERM end a command the same orderly way."""

from __future__ import annotations

import os
import signal
import time

import pytest
import typer

from kit.cli.app import handled, sigterm_as_interrupt
from kit.errors import InputError, Terminated


@pytest.fixture
def sigterm_default():
    """SIGTERM at its default, as kit starts with it (and back to what it was after the test)."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_is_an_interrupt_while_a_command_runs_and_exits_143(sigterm_default):
    seen = {}

    def command():
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        # (without a handler the signal would end the test run itself)
        assert seen["handler"] not in (signal.SIG_DFL, signal.SIG_IGN, None), "no SIGTERM handler while running"
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # handled in this (the main) thread before the sleep ends
            time.sleep(10)
        except KeyboardInterrupt as interrupt:  # every Ctrl-C path catches it
            seen["caught"] = type(interrupt)
            raise

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(typer.Exit) as ended:
        handled(command)()
    assert ended.value.exit_code == 143 and seen["caught"] is Terminated
    assert signal.getsignal(signal.SIGTERM) == before, "the previous handler comes back"


def test_ctrl_c_exits_130_and_a_kit_error_its_own_code():
    def interrupted():
        raise KeyboardInterrupt

    def bad_input():
        raise InputError("no such file", where="cluster.yaml", fix="give a spec")

    for command, code in ((interrupted, 130), (bad_input, 2)):
        with pytest.raises(typer.Exit) as ended:
            handled(command)()
        assert ended.value.exit_code == code


def test_sigterm_that_whoever_started_kit_ignores_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with sigterm_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: nothing raised
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)

"""kit.clouds.local: the spec's local.trace is one zone's trace file, and says what it is when it is not."""

from __future__ import annotations

import os

import pytest

from kit.errors import InputError
from kit.spec import parse_spec


def _local(trace: str) -> dict:
    return {"name": "loc", "cloud": "local", "local": {"trace": trace}}


@pytest.mark.timeout(10)  # the old check passed a FIFO to the reader, which waited for a writer forever
def test_a_trace_that_is_no_regular_file_says_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "set").mkdir()
    spec = str(tmp_path / "cluster.yaml")
    for trace, what in (("fifo.json", "is a FIFO (named pipe), not a trace file"),
                        ("set", "is a directory; local mode replays one zone's file")):
        with pytest.raises(InputError) as info:
            parse_spec(_local(trace), spec)
        assert what in info.value.render() and "local.trace" in info.value.render(), info.value.render()


def test_a_trace_name_too_long_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="File name too long") as info:
        parse_spec(_local("a" * 300 + ".json"), str(tmp_path / "cluster.yaml"))
    assert info.value.where == f"{tmp_path / 'cluster.yaml'}: local.trace"

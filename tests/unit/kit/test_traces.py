"""kit.traces: the shared format, the minimal metadata form, and clear errors on bad files."""

from __future__ import annotations

import json

import pytest

from kit.errors import InputError
from kit.paths import SPOT_TRACES_DIR
from kit.traces import load_trace, load_traces, trace_files


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_minimal_metadata_and_prices(tmp_path):
    t = load_trace(write(tmp_path, "z.json", {"metadata": {"gap_seconds": 600}, "data": [2, 0, 1]}))
    assert t.tick_h == pytest.approx(1 / 6) and t.data == (2, 0, 1) and t.name == "z"
    assert t.spot_available(2) == [True, False, False]
    assert t.spot_prices(1.5) == [1.5] * 3 and t.on_demand_price(4.0) == 4.0
    t = load_trace(write(tmp_path, "p.json", {"metadata": {"gap_seconds": 60, "spot_price_per_hour": 2.0,
                                                            "on_demand_price_per_hour": 9.0, "zone": "x-1"},
                                              "data": [1, 1], "prices": [0.5, 0.7]}))
    assert t.spot_prices(1.0) == [0.5, 0.7] and t.on_demand_price(4.0) == 9.0 and t.name == "x-1"


def test_shared_traces_load():
    traces = load_traces([SPOT_TRACES_DIR / "gcp-a3-h100-2025-10"])
    assert len(traces) == 13 and all(len(t) > 2000 and t.gap_seconds == 600 for t in traces)


@pytest.mark.parametrize("doc, where", [
    ("{not json", "not valid JSON"),
    ([1, 2], "JSON object"),
    ({"data": [1]}, "metadata"),
    ({"metadata": {}, "data": [1]}, "metadata.gap_seconds"),
    ({"metadata": {"gap_seconds": 0}, "data": [1]}, "metadata.gap_seconds"),
    ({"metadata": {"gap_seconds": "600"}, "data": [1]}, "metadata.gap_seconds"),
    ({"metadata": {"gap_seconds": 600}, "data": []}, "data"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, -1]}, "data[1]"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, 0.5]}, "data[1]"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, None]}, "data[1]"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, 1], "prices": [1.0]}, "prices"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, 1], "prices": [1.0, -2]}, "prices[1]"),
    ({"metadata": {"gap_seconds": 600, "on_demand_price_per_hour": 0}, "data": [1]}, "on_demand_price_per_hour"),
    # the optional fields that name offers and size gangs and prices (a bad one crashed `--zones all`)
    ({"metadata": {"gap_seconds": 600, "gpus_per_instance": "nan"}, "data": [1]}, "metadata.gpus_per_instance"),
    ({"metadata": {"gap_seconds": 600, "gpus_per_instance": [8]}, "data": [1]}, "metadata.gpus_per_instance"),
    ({"metadata": {"gap_seconds": 600, "nodes_requested": 0}, "data": [1]}, "metadata.nodes_requested"),
    ({"metadata": {"gap_seconds": 600, "nodes_requested": "16"}, "data": [1]}, "metadata.nodes_requested"),
    ({"metadata": {"gap_seconds": 600, "instance_type": ["a3"]}, "data": [1]}, "metadata.instance_type"),
    ({"metadata": {"gap_seconds": 600, "zone": ""}, "data": [1]}, "metadata.zone"),
])
def test_bad_files_are_input_errors(tmp_path, doc, where):
    path = write(tmp_path, "bad.json", doc)
    with pytest.raises(InputError) as err:
        load_trace(path)
    assert where in err.value.render() and "bad.json" in err.value.render()
    assert err.value.exit_code == 2


def test_missing_and_empty_inputs(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(InputError, match="not found"):
        trace_files([tmp_path / "nope.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no \\*.json"):
        trace_files([tmp_path / "empty"])
    write(tmp_path, "b.json", {"metadata": {"gap_seconds": 600}, "data": [1]})
    write(tmp_path, "a.json", {"metadata": {"gap_seconds": 600}, "data": [1]})
    assert [p.name for p in trace_files([tmp_path])] == ["a.json", "b.json"]


def test_bundled_traces_match_their_manifest():
    """The sample data kit ships is byte-for-byte what MANIFEST.tsv lists (sizes and SHA-256), the
    SkyNomad attribution included; every set listed by `kit traces` loads."""
    import hashlib

    from kit.traces import bundled_sets, summarize_set

    listed = {}
    for line in (SPOT_TRACES_DIR / "MANIFEST.tsv").read_text().splitlines():
        name, size, digest = line.split("\t")
        listed[name.removeprefix("./")] = (int(size), digest)
    present = {p.relative_to(SPOT_TRACES_DIR).as_posix() for p in SPOT_TRACES_DIR.rglob("*")
               if p.is_file() and p.name != "MANIFEST.tsv"}
    assert present == set(listed)
    for name, (size, digest) in listed.items():
        data = (SPOT_TRACES_DIR / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()[:16]) == (size, digest), name
    assert {"skynomad-gcp-h100/LICENSE", "skynomad-gcp-h100/NOTICE"} <= set(listed)
    summary = summarize_set(next(s for s in bundled_sets() if s.name == "gcp-a3-h100-2025-10"))
    assert len(summary.zones) == 13 and summary.gap_seconds == 600 and summary.start_utc == "2025-10-04T00:10Z"
    assert summary.spot_per_hour[0] < summary.on_demand_per_hour[0]


def test_a_trace_is_named_by_path_or_bundled_name(tmp_path, monkeypatch):
    from kit.traces import resolve

    bundled = resolve("gcp-a3-h100-2025-10/us-central1-c.json")
    assert bundled == SPOT_TRACES_DIR / "gcp-a3-h100-2025-10" / "us-central1-c.json"
    assert resolve("gcp-a3-h100-2025-10").is_dir()
    write(tmp_path, "mine.json", {"metadata": {"gap_seconds": 600}, "data": [1]})
    monkeypatch.chdir(tmp_path)
    assert resolve("mine.json") == tmp_path / "mine.json"  # a file here wins over a bundled name
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert resolve("mine.json", relative_to=tmp_path) == tmp_path / "mine.json"  # beside the spec
    with pytest.raises(InputError, match="not found") as error:
        resolve("nope.json", where="local.trace")
    assert error.value.where == "local.trace" and "gcp-a3-h100-2025-10" in error.value.fix


@pytest.mark.timeout(10)  # the old reader waited for a FIFO's writer forever
def test_a_fifo_or_a_directory_is_no_trace_file(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    for name, kind in (("fifo.json", "a FIFO (named pipe)"), ("dir.json", "a directory")):
        with pytest.raises(InputError) as info:
            load_trace(tmp_path / name)
        assert info.value.what == f"trace file is {kind}, not a regular file"
        assert info.value.where == str(tmp_path / name)


def test_a_trace_over_the_limit_is_refused(tmp_path):
    from kit.traces import MAX_TRACE_BYTES

    path = tmp_path / "big.json"
    with path.open("wb") as f:  # sparse: no disk, and only a byte over
        f.truncate(MAX_TRACE_BYTES + 1)
    with pytest.raises(InputError, match=f"larger than {MAX_TRACE_BYTES} bytes"):
        load_trace(path)


@pytest.mark.parametrize("body, what", [
    ("[" * 100_000, "nested too deeply"),
    ("[" + "9" * 5000 + "]", "4300 digits"),
])
def test_json_python_cannot_hold_is_an_input_error(tmp_path, body, what):
    path = write(tmp_path, "t.json", '{"metadata": {"gap_seconds": 600}, "data": ' + body + "}")
    with pytest.raises(InputError, match=what) as info:
        load_trace(path)
    assert info.value.where == str(path) and "set_int_max_str_digits" not in info.value.what


def test_a_name_too_long_is_an_input_error(tmp_path):
    from kit.traces import resolve

    name = "a" * 300 + ".json"
    with pytest.raises(InputError, match="File name too long") as info:
        resolve(name, relative_to=tmp_path, where="local.trace")
    assert info.value.where == "local.trace" and name in info.value.what
    with pytest.raises(InputError, match="File name too long"):
        trace_files([tmp_path / name])

"""Hostile and careless input to the commands: each is refused with what, where and how to fix it
(exit 2), never a traceback, and before anything is written."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kit.cli import app
from kit.paths import DEPLOY_ROOT_ENV, EXAMPLES_DIR


def _write(tmp: Path, name: str, data: bytes) -> str:
    (tmp / name).write_bytes(data)
    return str(tmp / name)


def _case(tmp: Path, case: str) -> tuple[list[str], str]:
    """The command line for ``case`` (files made in ``tmp``) and a phrase its error must contain."""
    spec = str(EXAMPLES_DIR / "aws-g5-spot.yaml")
    # 9 levels of 9 aliases each: 9^9 strings once expanded (shared references in memory)
    bomb = b"name: demo\ncloud: local\na0: &a0 [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        b"a%d: &a%d [%s]\n" % (i, i, b", ".join([b"*a%d" % (i - 1)] * 9)) for i in range(1, 9)) + b"nodes: *a8\n"
    many_aliases = b"name: demo\ncloud: local\nx: &x 1\nlabels: [" + b", ".join([b"*x"] * 200) + b"]\n"
    cases = {
        "spec not UTF-8": (["validate", _write(tmp, "a.yaml", b"name: a\xff\ncloud: local\n")], "not UTF-8"),
        "spec nested 20,000 deep": (["validate", _write(tmp, "b.yaml", b"a: " + b"[" * 20000 + b"]" * 20000)],
                                    "nested deeper"),
        "spec with a key twice": (["validate", _write(tmp, "c.yaml", b"name: a\nname: b\ncloud: local\n")],
                                  "appears twice"),
        "a YAML alias bomb in a typed field": (["validate", _write(tmp, "d.yaml", bomb)], "valid integer"),
        "200 aliases": (["validate", _write(tmp, "e.yaml", many_aliases)], "more than 100 aliases"),
        "a spec over 1 MiB": (["validate", _write(tmp, "f.yaml", b"name: demo\n" + b"# padding\n" * 200_000)],
                              "larger than"),
        # a cloud spec: a local one is refused before its inventory is read (kit train bootstraps it)
        "inventory not UTF-8": (["bootstrap", spec, "--hosts", _write(tmp, "i.yaml", b"all: \xfe\n")], "not UTF-8"),
        "inventory whose all is a list": (["bootstrap", spec, "--hosts", _write(tmp, "j.yaml", b"all: [a, b]\n")],
                                          "must be a mapping"),
        "--out under a file": (["render", spec, "--out", str(tmp / "file" / "deploy")], "cannot create"),
        # rich would read "[...]" in a message as markup: drop "[red]", and raise on a closing "[/b]"
        "a spec path that looks like markup": (["validate", str(tmp / "[/b] [red]x.yaml")], "[/b] [red]x.yaml"),
    }
    (tmp / "file").write_text("a file, not a directory\n")
    cases.update(_simulate_and_train_cases(tmp))
    cases.update(_bounds_listen_and_cloud_cases(tmp))
    return cases[case]


def _simulate_and_train_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """The cases of ``kit simulate`` and ``kit train`` (:func:`_case`)."""
    trace = b'{"metadata": {"gap_seconds": 600}, "data": [1, %s, 3]}'
    return {
        "NaN in a trace": (["simulate", _write(tmp, "t.json", trace % b"NaN")], "data[1]"),
        "Infinity in a trace": (["simulate", _write(tmp, "u.json", trace % b"Infinity")], "data[1]"),
        "--deadline-hours nan": (["simulate", "gcp-a3-h100-2025-10", "--deadline-hours", "nan"], "--deadline-hours"),
        "--job-hours inf": (["simulate", "gcp-a3-h100-2025-10", "--job-hours", "inf"], "--job-hours"),
        "--starts 1e9": (["simulate", "gcp-a3-h100-2025-10", "--starts", "1000000000"], "--starts"),
        "a deadline shorter than the job": (["simulate", "gcp-a3-h100-2025-10", "--deadline-hours", "10"],
                                            "--deadline-hours"),
        "the same, many zones": (["simulate", "gcp-a3-h100-2025-10", "--zones", "all", "--job-hours", "400"],
                                 "--deadline-hours"),
        # the AWS set measured one instance per tick: 16 nodes (the default) would never find spot
        "a gang larger than the traces measured": (["simulate", "aws-p3-v100-2023-02"], "--nodes"),
        "the same, a shape of many zones": (["simulate", "gcp-a3-h100-2025-10", "--zones", "all", "--shape",
                                             "a3-highgpu-1g:32:1:spot+on-demand"], "32xa3-highgpu-1g"),
        "a spot shape no trace measured": (["simulate", "gcp-a3-h100-2025-10", "--zones", "all", "--shape",
                                            "a3-highgpu-1G:16:1:spot+on-demand"], "no trace measured"),
        "no shape sold on-demand": (["simulate", "gcp-a3-h100-2025-10", "--zones", "all", "--shape",
                                     "a3-highgpu-1g:16:1:spot"], "on-demand"),
        # a trace sampled daily against a 12-hour slack: the safety net would run every policy on-demand
        "ticks longer than the slack": (["simulate", _write(tmp, "v.json", b'{"metadata": {"gap_seconds": 86400}, '
                                                                         b'"data": [1, 1, 1, 1]}'), "--nodes", "1"],
                                        "not shorter than the job's slack"),
        "ticks longer than the slack, many zones": (["simulate", _write(tmp, "w.json", b'{"metadata": {"gap_seconds": 86400}, '
                                                                    b'"data": [1, 1, 1, 1]}'), "--nodes", "1",
                                   "--zones", "all"], "not shorter than the job's slack"),
        "a zone named twice": (["simulate", "gcp-a3-h100-2025-10", "--zones", "us-east4-a,us-east4-b,us-east4-a"],
                               "us-east4-a is named more than once"),
        # a one-zone replay never moves the checkpoint: the flag was ignored without a word
        "a move's flag without --zones": (["simulate", "gcp-a3-h100-2025-10", "--checkpoint-gb", "-1"],
                                          "--checkpoint-gb"),
        "--egress-per-gb without --zones": (["simulate", "gcp-a3-h100-2025-10", "--egress-per-gb", "0.02"],
                                            "--egress-per-gb"),
        "--time-scale nan": (["train", "--time-scale", "nan"], "--time-scale"),
        "an unwritable --plot": (["simulate", "gcp-a3-h100-2025-10", "--plot", str(tmp / "file" / "p.png")],
                                 "--plot"),
        "kit train with a missing trace": (["train", _write(tmp, "g.yaml", b"name: g\ncloud: local\nlocal:\n"
                                                                       b"  trace: no-such-trace.json\n")], "trace"),
        "kit train on a trace measured for fewer nodes": (["train", _write(tmp, "k.yaml", b"name: k\ncloud: local\nnodes: 2\n"
                                                                         b"local:\n  trace: aws-p3-v100-2023-02/us-east-1a.json\n")],
                                                          "local.trace"),
        "kit train with time_scale 0": (["train", _write(tmp, "h.yaml", b"name: h\ncloud: local\nlocal:\n"
                                                                     b"  time_scale: 0\n")], "time_scale"),
        "kit train --plot into a missing directory": (["train", "--plot", str(tmp / "no" / "such" / "p.png")],
                                                      "--plot"),
        # matplotlib picks the format by the suffix: a .txt failed after the whole run (a traceback, exit 1)
        "kit train --plot not a PNG": (["train", "--plot", str(tmp / "p.txt")], "*.png"),
        # parsed when the endpoint starts: after the deployment's ledger, lock and token were written
        "kit train --listen not HOST:PORT": (["train", "--listen", "127.0.0.1"], "--listen"),
    }


def _bounds_listen_and_cloud_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Numbers that overflow the simulator, addresses the agents' endpoint cannot bind, output files the kernel
    refuses (root passes access(2) in /proc, where no file can be made), commands for clouds with Terraform."""
    local = str(EXAMPLES_DIR / "local.yaml")
    # no prices in the trace: the price flags apply
    mini = _write(tmp, "mini.json", b'{"metadata": {"gap_seconds": 3600}, "data": [2, 2, 2, 0, 0' + b", 2" * 25 + b"]}")
    replay = ["simulate", mini, "--nodes", "2", "--job-hours", "4", "--deadline-hours", "8", "--starts", "1"]
    return {
        "--deadline-hours 1e308": (["simulate", "gcp-a3-h100-2025-10", "--deadline-hours", "1e308"], "--deadline-hours"),
        "--changeover-hours 1e308": (["simulate", "gcp-a3-h100-2025-10", "--changeover-hours", "1e308"],
                                     "--changeover-hours"),
        "--on-demand-price 1e308": ([*replay, "--on-demand-price", "1e308", "--json"], "--on-demand-price"),
        "--spot-price 1e308": ([*replay, "--spot-price", "1e308"], "--spot-price"),
        "--plot where no file can be made": (["simulate", "gcp-a3-h100-2025-10", "--policy", "default", "--starts", "1",
                                              "--plot", "/proc/kit-plot.png"], "--plot"),
        "the same, many zones --plot": (["simulate", "gcp-a3-h100-2025-10", "--zones", "all", "--starts", "1",
                                         "--plot", "/proc/kit-plot.png"], "--plot"),
        "kit train --plot where no file can be made": (["train", "--plot", "/proc/kit-plot.png"], "--plot"),
        "kit train --json-report where no file can be made": (["train", "--json-report", "/proc/kit-report.json"],
                                                              "--json-report"),
        # 256 is no octet: refused without a DNS lookup; 8.8.8.8 is not this machine's (bound, never sent to)
        "kit train --listen no address": (["train", "--listen", "256.0.0.1:0"], "cannot listen on 256.0.0.1:0"),
        "kit train --listen not this machine's": (["train", "--listen", "8.8.8.8:0"], "cannot listen on 8.8.8.8:0"),
        "kit train --listen IPv6": (["train", "--listen", "[::1]:0"], "IPv4 only"),
        "kit watch --listen IPv6": (["watch", local, "--once", "--listen", "::1:0"], "IPv4 only"),
        "kit watch --listen not this machine's": (["watch", local, "--once", "--listen", "8.8.8.8:0"], "cannot listen"),
        "kit bootstrap a local spec": (["bootstrap", local], "`kit train SPEC`"),
        "kit apply a local spec": (["apply", local], "`kit train SPEC`"),
        "kit destroy a local spec": (["destroy", local], "`kit train SPEC`"),
        "kit train --cloud mars": (["train", "--cloud", "mars"], "unknown cloud 'mars'"),
    }


CASES = ["spec not UTF-8", "spec nested 20,000 deep", "spec with a key twice", "a YAML alias bomb in a typed field",
         "200 aliases", "a spec over 1 MiB", "inventory not UTF-8",
         "inventory whose all is a list", "--out under a file", "NaN in a trace", "Infinity in a trace",
         "--deadline-hours nan", "--job-hours inf", "--starts 1e9", "a deadline shorter than the job",
         "the same, many zones", "a gang larger than the traces measured", "the same, a shape of many zones", "a spot shape no trace measured",
         "no shape sold on-demand", "ticks longer than the slack", "ticks longer than the slack, many zones", "a zone named twice", "a move's flag without --zones", "--egress-per-gb without --zones", "--time-scale nan", "a spec path that looks like markup", "kit train with a missing trace", "kit train on a trace measured for fewer nodes", "kit train with time_scale 0", "an unwritable --plot",
         "kit train --plot into a missing directory", "kit train --plot not a PNG", "kit train --listen not HOST:PORT",
         "--deadline-hours 1e308", "--changeover-hours 1e308", "--on-demand-price 1e308", "--spot-price 1e308",
         "--plot where no file can be made", "the same, many zones --plot", "kit train --plot where no file can be made",
         "kit train --json-report where no file can be made", "kit train --listen no address",
         "kit train --listen not this machine's", "kit train --listen IPv6", "kit watch --listen IPv6",
         "kit watch --listen not this machine's", "kit bootstrap a local spec", "kit apply a local spec",
         "kit destroy a local spec", "kit train --cloud mars"]


@pytest.mark.parametrize("case", CASES)
def test_refused_with_what_where_and_fix(tmp_path, example_home, monkeypatch, case):
    monkeypatch.chdir(tmp_path)  # kit train would deploy under ./deploy: nothing may appear there
    args, phrase = _case(tmp_path, case)
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    assert time.monotonic() - started < 10, "refusing bad input must be quick"
    assert result.exit_code == 2, (case, result.output, result.exception)
    assert "Traceback" not in result.output and phrase in result.output, result.output
    assert "error:" in result.output and "fix:" in result.output, result.output
    assert not (tmp_path / "deploy").exists()


def _listening() -> socket.socket:
    """A socket listening on a free loopback port (the port in use)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken


@pytest.mark.parametrize("command", ["train", "watch"])
def test_a_listen_port_in_use_is_refused_before_anything_is_written(tmp_path, example_home, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    with _listening() as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, [command, str(EXAMPLES_DIR / "local.yaml"), "--listen", f"127.0.0.1:{port}",
                                          *(["--once"] if command == "watch" else [])])
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"--listen: cannot listen on 127.0.0.1:{port}: Address already in use" in result.output, result.output
    assert "fix:" in result.output and not (tmp_path / "deploy").exists()


@pytest.mark.parametrize("command", ["train", "watch"])
def test_a_deployment_directory_that_cannot_be_made_is_refused(tmp_path, example_home, monkeypatch, command):
    (tmp_path / "file").write_text("a file, not a directory\n")
    monkeypatch.setenv(DEPLOY_ROOT_ENV, str(tmp_path / "file" / "sub"))  # as kit --deploy-dir does
    result = CliRunner().invoke(app, [command, str(EXAMPLES_DIR / "local.yaml"),
                                      *(["--once"] if command == "watch" else [])])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "cannot create the deployment directory: Not a directory" in result.output, result.output
    assert "choose a directory you can write" in result.output
    assert (tmp_path / "file").read_text() == "a file, not a directory\n"

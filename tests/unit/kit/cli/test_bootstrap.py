"""`kit bootstrap`: progress lines printed as they are; input refused before the playbook runs."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kit.cli import bootstrap


def test_ansible_names_are_printed_as_they_are_not_as_markup(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(bootstrap, "console", Console(file=out, width=200))
    printer = bootstrap._progress_printer(verbose=1)
    # an inventory name and a task name are the user's; rich read "[/x]" as a closing tag and raised
    printer({"event": "playbook_on_task_start", "event_data": {"task": "install [/x] driver"}})
    printer({"event": "runner_on_failed", "event_data": {"host": "node-[red]0", "task": "install [/x] driver"}})
    text = out.getvalue()
    assert "TASK install [/x] driver" in text and "failed node-[red]0: install [/x] driver" in text, text


def test_extra_vars_of_what_kit_sets_per_host_exit_2_before_anything_runs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from kit import bootstrap as bs
    from kit.cli import app
    from kit.paths import EXAMPLES_DIR

    monkeypatch.setattr(bs, "bootstrap_nodes", lambda *a, **k: pytest.fail("the playbook ran"))
    spec = tmp_path / "c.yaml"
    spec.write_text((EXAMPLES_DIR / "aws-g5-spot.yaml").read_text())
    res = CliRunner().invoke(app, ["bootstrap", str(spec), "-e", "trainer_node_rank=0"])
    assert res.exit_code == 2 and "trainer_node_rank" in res.output, res.output

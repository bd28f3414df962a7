"""`kit bootstrap`'s progress lines: ansible's host names, task names and messages are printed as they are."""

from __future__ import annotations

import io

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

"""``kit status`` and ``kit watch`` on the command line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kit.cli import app
from kit.paths import DEPLOY_ROOT_ENV
from kit.watch.ledger import Ledger
from kit.watch.session import LEDGER_FILE


def test_kit_status_without_a_spec_shows_the_built_in_example_as_kit_train_does(tmp_path, monkeypatch):
    """A new user runs `kit train`, then `kit status`: it answered "Missing argument 'spec'"."""
    monkeypatch.setenv(DEPLOY_ROOT_ENV, str(tmp_path))
    missing = CliRunner().invoke(app, ["status"])
    assert missing.exit_code == 1 and "no ledger for cluster 'local-example'" in missing.output, missing.output
    Ledger(tmp_path / "local-example" / LEDGER_FILE).job_started(100.0)
    shown = CliRunner().invoke(app, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    assert report["cluster"] == "local-example" and report["cloud"] == "local" and report["job_started"] == 100.0


def test_interval_reaches_kit_train_as_kit_watch_and_a_bad_one_is_refused_before_anything_starts(tmp_path,
                                                                                                  monkeypatch):
    """`kit watch --interval` existed; `kit train` had no way to set the watcher's poll interval."""
    import pytest

    import kit.train

    monkeypatch.setenv(DEPLOY_ROOT_ENV, str(tmp_path))
    for command in ("train", "watch"):
        for bad in ("0", "-1", "nan", "inf", "1e-9"):
            args = [command, "--interval", bad] + (["examples/local.yaml"] if command == "watch" else [])
            refused = CliRunner().invoke(app, args)
            assert refused.exit_code == 2, (args, refused.output)
            assert "--interval" in refused.output and "must be a number of seconds >= 0.1" in refused.output, \
                refused.output
    assert list(tmp_path.iterdir()) == []  # no deployment directory, ledger or lock
    seen = {}
    monkeypatch.setattr(kit.train, "run_train", lambda spec, **kw: seen.update(kw))
    assert CliRunner().invoke(app, ["train", "--interval", "3"]).exit_code == 0
    assert seen["interval_s"] == pytest.approx(3.0)

from typer.testing import CliRunner

from kit import __version__
from kit.cli import app
from kit.errors import InputError, KitError


def test_version_command_prints_version():
    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.output.strip() == __version__


def test_input_error_renders_where_and_fix():
    err = InputError("nodes must be >= 1, got 0", where="cluster.yaml: nodes", fix="set nodes: 1 or more")
    assert err.exit_code == 2
    assert err.render() == "cluster.yaml: nodes: nodes must be >= 1, got 0\nfix: set nodes: 1 or more"
    assert KitError("x").exit_code == 1

"""The architecture's rules, and proof that the checks enforcing them can fail.

``make lint`` runs import-linter with the contracts in pyproject.toml; these tests plant a
violation in a copy of the packages and watch the contracts go red, so a contract that silently
matches nothing (a renamed module, a typo) cannot pass for a kept rule. Function size: at most
60 lines each in kit/ and training/ (a longer procedure becomes an object with named steps).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

ROOT = REPO
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
MAX_FUNCTION_LINES = 60

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (make install)")


def _copy(tmp_path: Path) -> Path:
    for name in ("kit", "training"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("data", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's packages before the installed ones
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_contracts_hold_on_the_checkout(tmp_path):
    result = _lint_imports(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "planted", "contract"), [
    ("training/agent.py", "import kit.errors", "training runs on the nodes"),
    ("kit/policy/market.py", "import kit.watch.ledger", "kit's layers"),
    ("kit/render.py", "import kit.clouds.gcp", "only a cloud's own modules"),
    ("kit/watch/watcher.py", "import boto3", "cloud SDKs only"),
])
def test_a_planted_violation_breaks_its_contract(tmp_path, module, planted, contract):
    root = _copy(tmp_path)
    path = root / module
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + f"\n{planted}  # noqa: F401\n" + rest)
    result = _lint_imports(root)
    assert result.returncode != 0, result.stdout
    _, _, broken = result.stdout.partition("Broken contracts")  # the report's section on broken ones
    assert contract in broken, result.stdout
    assert "Contracts: 3 kept, 1 broken." in result.stdout, result.stdout  # that one, and only that one


def _long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} {node.name} "
            f"({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > limit]


def test_functions_are_at_most_60_lines():
    long = [f for package in ("kit", "training") for p in sorted((ROOT / package).rglob("*.py"))
            for f in _long_functions(p)]
    assert not long, "split these into named steps:\n" + "\n".join(long)


def test_the_length_check_sees_a_long_function(tmp_path):
    source = tmp_path / "long.py"
    source.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert _long_functions(source) == [f"{source}:1 f ({MAX_FUNCTION_LINES + 1} lines)"]

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    env = os.environ.get("KIT_SHARED_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared"

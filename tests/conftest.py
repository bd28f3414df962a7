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


def pytest_report_header(config):
    """Say up front where the shared data (spot traces, provider schemas) is expected: the tests of
    the simulator, the schema checker and the local `kit train` need it, and a checkout without
    ../shared otherwise shows up as a dozen 'trace file not found' failures."""
    from kit.paths import shared_dir

    where = shared_dir()
    if (where / "data" / "spot-traces").is_dir():
        return f"kit shared data: {where}"
    return (f"kit shared data: NOT FOUND at {where} - tests that replay traces or check provider schemas "
            "will fail; clone beside ../shared or set KIT_SHARED_DIR")

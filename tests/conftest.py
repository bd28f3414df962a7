import shutil
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# The public key the examples' ~/.ssh/id_ed25519.pub stands for in tests and golden files: kit puts
# the key's content into the rendered tfvars, so rendering needs one (not a real key).
TEST_PUBLIC_KEY = REPO_ROOT / "tests" / "golden" / "id_ed25519.pub"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


def make_home(base: Path) -> Path:
    """A home directory holding the test key as ~/.ssh/id_ed25519.pub."""
    (base / ".ssh").mkdir(parents=True, exist_ok=True)
    shutil.copy(TEST_PUBLIC_KEY, base / ".ssh" / "id_ed25519.pub")
    return base


@pytest.fixture
def example_home(tmp_path, monkeypatch) -> Path:
    """HOME with the examples' key, for tests that render, plan or train the examples."""
    home = make_home(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture(scope="module")
def example_key_home(tmp_path_factory):
    """The same for a whole test module (module-scoped fixtures render the examples once)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(make_home(tmp_path_factory.mktemp("home"))))
        yield

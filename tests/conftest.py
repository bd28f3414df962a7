from pathlib import Path

import pytest

from tests.support import REPO as REPO_ROOT
from tests.support import make_home


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


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


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process during the test, as in a terminal. A suite started in the
    background by a non-interactive shell (``nohup``, ``&``: CI runners do) ignores SIGINT, and a test that
    sends itself a Ctrl-C would see nothing. The disposition before the test comes back after it."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)

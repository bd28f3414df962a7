"""Regenerate tests/golden/<example>/ from examples/*.yaml (``make golden``); review the diff like code.

Only the generated root modules (disks/, cluster/) are kept: modules/ is a verbatim copy of
terraform/modules/, which is reviewed where it lives.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent
EXAMPLES = ("aws-g5-spot", "gcp-a3-spot")


def render_example(name: str, out: Path) -> None:
    """Render an example with the test key (tests/golden/id_ed25519.pub) as ~/.ssh/id_ed25519.pub."""
    import os

    from kit.render import render
    from kit.spec import load_spec

    with tempfile.TemporaryDirectory() as home:
        (Path(home) / ".ssh").mkdir()
        shutil.copy(GOLDEN / "id_ed25519.pub", Path(home) / ".ssh" / "id_ed25519.pub")
        saved = os.environ.get("HOME")
        os.environ["HOME"] = home
        try:
            render(load_spec(REPO / "examples" / f"{name}.yaml"), out)
        finally:
            if saved is None:
                del os.environ["HOME"]
            else:
                os.environ["HOME"] = saved


def main() -> int:
    sys.path.insert(0, str(REPO))
    for name in EXAMPLES:
        with tempfile.TemporaryDirectory() as tmp:
            render_example(name, Path(tmp))
            target = GOLDEN / name
            if target.exists():
                shutil.rmtree(target)
            from kit.render import roots
            from kit.spec import load_spec

            for root in roots(load_spec(REPO / "examples" / f"{name}.yaml")):
                shutil.copytree(Path(tmp) / root, target / root)
        print(f"wrote {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where kit finds the files it ships, and where it writes deployments.

kit reads only from its own installation:

* ``templates/``, ``terraform/modules/``, ``ansible/`` and ``examples/`` are top-level folders of
  the repository. A wheel carries them under ``kit/_resources/`` (pyproject.toml maps them with
  hatchling's ``force-include``; there are no copies in the repository). An editable install or a
  source checkout has them beside ``kit/``.
* The sample data (spot-capacity traces, Terraform provider schemas) lives inside the package,
  ``kit/data/``, in both cases.

Deployments (``deploy/<name>/``: rendered Terraform, the ledger, local nodes' disks, exports) go
under the current directory, or under ``kit --deploy-dir DIR`` / ``$KIT_DEPLOY_ROOT``. Every path
kit hands to a node process or to Terraform is absolute, so neither depends on its working
directory.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_WHEEL_RESOURCES = PACKAGE_DIR / "_resources"
RESOURCES_DIR = _WHEEL_RESOURCES if _WHEEL_RESOURCES.is_dir() else PACKAGE_DIR.parent
TEMPLATES_DIR = RESOURCES_DIR / "templates"
TERRAFORM_MODULES_DIR = RESOURCES_DIR / "terraform" / "modules"
ANSIBLE_DIR = RESOURCES_DIR / "ansible"
EXAMPLES_DIR = RESOURCES_DIR / "examples"
DEFAULT_SPEC = EXAMPLES_DIR / "local.yaml"  # the built-in example: `kit train` and `kit status` without a spec

# The node-side package (trainer, agent); bootstrap ships its sources to cloud nodes.
TRAINING_PACKAGE_DIR = Path(importlib.util.find_spec("training").origin).resolve().parent  # type: ignore[union-attr, arg-type]

DATA_DIR = PACKAGE_DIR / "data"
SPOT_TRACES_DIR = DATA_DIR / "spot-traces"
PROVIDER_SCHEMAS_DIR = DATA_DIR / "provider-schemas"

DEPLOY_ROOT_ENV = "KIT_DEPLOY_ROOT"
DEFAULT_DEPLOY_ROOT = "deploy"


def deploy_root() -> Path:
    """``$KIT_DEPLOY_ROOT`` (set by ``kit --deploy-dir``), else ``./deploy``; always absolute."""
    return Path(os.environ.get(DEPLOY_ROOT_ENV) or DEFAULT_DEPLOY_ROOT).expanduser().absolute()


def check_output_file(path: Path, flag: str) -> None:
    """Refuse an output file that cannot be written, before any work (not after a whole run)."""
    from kit.errors import InputError

    parent = Path(path).absolute().parent
    try:  # is_dir is False for a missing path, and raises on a name too long or a parent that may not be searched
        is_dir, parent_is_dir = path.is_dir(), parent.is_dir()
    except OSError as error:
        raise InputError(f"cannot use {path}: {error.strerror}", where=flag, fix="check the path") from None
    if is_dir:
        raise InputError(f"{path} is a directory", where=flag, fix="name a file")
    if not parent_is_dir:
        raise InputError(f"{parent} is not a directory", where=flag, fix="create it, or name a file in an existing one")
    if not os.access(parent, os.W_OK):
        raise InputError(f"cannot write in {parent}", where=flag, fix="name a file in a directory you can write")
    _try_writing(path, flag)


def _try_writing(path: Path, flag: str) -> None:
    """Create ``path`` and remove it again (a file already there is opened for appending and left as it was).
    Permission bits say too little: root passes access(2) in /sys and /proc, where the kernel still refuses
    to create a file (sysfs(5), proc(5))."""
    from kit.errors import InputError

    existed = False
    try:
        existed = path.exists()
        with open(path, "ab" if existed else "xb"):
            pass
    except OSError as error:
        raise InputError(f"cannot write {path}: {error.strerror or error}", where=flag,
                         fix="name a file in a directory you can write") from None
    if not existed:
        path.unlink(missing_ok=True)


def check_plot_file(path: Path, flag: str = "--plot") -> None:
    """A figure is written as PNG (matplotlib's format from the suffix): refuse another name, and a file
    that cannot be written, before any work; `kit train` found out after the whole run otherwise."""
    from kit.errors import InputError

    if Path(path).suffix.lower() != ".png":
        raise InputError("the plot is written as PNG", where=f"{flag} {path}", fix="name the file *.png")
    check_output_file(Path(path), flag)

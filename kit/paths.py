"""Where kit finds its own files and the shared data beside a checkout."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
TERRAFORM_MODULES_DIR = REPO_ROOT / "terraform" / "modules"
ANSIBLE_DIR = REPO_ROOT / "ansible"
EXAMPLES_DIR = REPO_ROOT / "examples"


def shared_dir() -> Path:
    """``$KIT_SHARED_DIR`` if set, else ``../shared`` beside the checkout (where CI puts it)."""
    env = os.environ.get("KIT_SHARED_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared"


def spot_traces_dir() -> Path:
    return shared_dir() / "data" / "spot-traces"


def provider_schemas_dir() -> Path:
    return shared_dir() / "data" / "provider-schemas"

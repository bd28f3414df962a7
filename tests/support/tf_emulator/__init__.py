"""Point Terraform core at the provider emulator (``server.py``) the way users point it at a
mirror: a CLI configuration (``TF_CLI_CONFIG_FILE``) whose ``provider_installation`` block takes
``hashicorp/aws`` and ``hashicorp/google`` from a ``filesystem_mirror`` holding the emulator's
launchers. (``dev_overrides`` would skip ``terraform init``'s install, but init then fails on a
root that has state, so kit's own ``kit plan``, which always inits, could not use it.)"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER = Path(__file__).with_name("server.py")
VERSIONS = {"aws": "6.47.0", "google": "7.9.0"}  # the releases of kit/data/provider-schemas


def write_cli_config(root: Path) -> Path:
    """The providers as a filesystem mirror under ``root`` (unpacked layout, at the releases whose
    schemas are vendored) and a CLI configuration that installs hashicorp/* only from it; returns
    the configuration file. ``terraform init`` then installs and locks them as it would real ones."""
    platform = f"{sys.platform}_{'amd64' if os.uname().machine in ('x86_64', 'amd64') else 'arm64'}"
    for cloud, version in VERSIONS.items():
        target = root / "mirror" / "registry.terraform.io" / "hashicorp" / cloud / version / platform
        target.mkdir(parents=True, exist_ok=True)
        launcher = target / f"terraform-provider-{cloud}_v{version}"
        launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {SERVER} {cloud} \"$@\"\n")
        launcher.chmod(0o755)
    config = root / "cli.tfrc"
    config.write_text("provider_installation {\n"
                      f"  filesystem_mirror {{\n    path    = \"{root / 'mirror'}\"\n"
                      '    include = ["registry.terraform.io/hashicorp/aws", "registry.terraform.io/hashicorp/google"]\n  }\n'
                      '  direct {\n    exclude = ["registry.terraform.io/hashicorp/aws", "registry.terraform.io/hashicorp/google"]\n  }\n'
                      "}\n")
    return config


@contextmanager
def emulated_providers(root: Path) -> Iterator[Path]:
    """``TF_CLI_CONFIG_FILE`` set to the emulator's configuration for the duration."""
    config = write_cli_config(root)
    old = os.environ.get("TF_CLI_CONFIG_FILE")
    os.environ["TF_CLI_CONFIG_FILE"] = str(config)
    try:
        yield config
    finally:
        if old is None:
            os.environ.pop("TF_CLI_CONFIG_FILE", None)
        else:
            os.environ["TF_CLI_CONFIG_FILE"] = old

"""Point Terraform core at the provider emulator (``server.py``) the way users point it at a
mirror: a CLI configuration (``TF_CLI_CONFIG_FILE``) whose ``provider_installation`` block has
``dev_overrides`` for ``hashicorp/aws`` and ``hashicorp/google``, each a directory holding a
``terraform-provider-<name>`` executable."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER = Path(__file__).with_name("server.py")
CLOUDS = ("aws", "google")


def write_cli_config(root: Path) -> Path:
    """Launchers and the CLI configuration under ``root``; returns the configuration file."""
    lines = ["provider_installation {", "  dev_overrides {"]
    for cloud in CLOUDS:
        bin_dir = root / cloud
        bin_dir.mkdir(parents=True, exist_ok=True)
        launcher = bin_dir / f"terraform-provider-{cloud}"
        launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {SERVER} {cloud} \"$@\"\n")
        launcher.chmod(0o755)
        lines.append(f'    "hashicorp/{cloud}" = "{bin_dir}"')
    lines += ["  }", "  direct {}", "}", ""]
    config = root / "cli.tfrc"
    config.write_text("\n".join(lines))
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

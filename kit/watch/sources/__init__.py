"""Event sources: one poller per cloud behind ``base.EventSource``.

``source_for(spec, ...)`` asks the spec's cloud (kit.clouds) for its poller; the cloud SDKs are
imported only by the poller that needs them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.spec import SpecBase


def source_for(spec: SpecBase, deploy_dir: Path):
    return spec.cloud_facts.event_source(spec, deploy_dir)

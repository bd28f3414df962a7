"""Event sources: one poller per cloud behind ``base.EventSource``.

``source_for(spec, ...)`` picks the poller for ``spec.cloud``; the cloud SDKs are imported only
by the poller that needs them.
"""

from __future__ import annotations

from pathlib import Path


def source_for(spec, deploy_dir: Path):
    cloud = spec.cloud
    if cloud == "aws":
        from kit.watch.sources.aws import AwsSource

        return AwsSource(cluster=spec.name, region=spec.region)
    if cloud == "gcp":
        from kit.watch.sources.gcp import GcpSource

        return GcpSource(cluster=spec.name, project=spec.project, zone=spec.zone)
    if cloud == "local":
        from kit.watch.sources.local import LocalSource

        return LocalSource(cluster=spec.name, state_dir=LocalSource.state_dir_for(deploy_dir))
    from kit.errors import InputError

    raise InputError(f"no event source for cloud {cloud!r}", where="spec.cloud", fix="use aws, gcp or local")

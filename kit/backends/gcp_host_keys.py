"""GCP: a node's SSH host keys, as the Compute Engine API publishes them.

With the instance metadata ``enable-guest-attributes = "TRUE"`` (kit's instances module sets it), the
guest agent of Google's images writes each host key it generates at first boot to the guest attribute
``hostkeys/<type>``, the key's base64 as its value (google-guest-agent's instance setup;
https://cloud.google.com/compute/docs/metadata/manage-guest-attributes). ``instances.getGuestAttributes``
with ``queryPath=hostkeys/`` reads them through the authenticated API
(https://cloud.google.com/compute/docs/reference/rest/v1/instances/getGuestAttributes), which is what
``gcloud compute ssh --strict-host-key-checking=yes`` pins.
"""

from __future__ import annotations

import logging

from kit.errors import KitError
from kit.remote import public_key_line

log = logging.getLogger("kit.backends.gcp_host_keys")

QUERY_PATH = "hostkeys/"
NAMESPACE = "hostkeys"


def published_host_keys(project: str, zone: str, instance: str, *, credentials=None,
                        api_endpoint: str | None = None) -> list[str]:
    """The instance's host keys; [] while its guest agent has written none (yet)."""
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import compute_v1

    where = f"gcp {project}/{zone}/{instance}"
    options = {"api_endpoint": api_endpoint} if api_endpoint else None
    try:
        client = compute_v1.InstancesClient(credentials=credentials, client_options=options)
        reply = client.get_guest_attributes(request=compute_v1.GetGuestAttributesInstanceRequest(
            project=project, zone=zone, instance=instance, query_path=QUERY_PATH))
    except gexc.NotFound:
        return []  # nothing written under hostkeys/ yet: the guest agent writes it once the VM has booted
    except DefaultCredentialsError as error:
        raise KitError("no Google credentials to read the nodes' SSH host keys", where=where,
                       fix="run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS") from error
    except (gexc.Forbidden, gexc.Unauthorized) as error:
        raise KitError(f"Compute Engine refused reading the guest attributes of {instance}: {error.message}",
                       where=where, fix="grant compute.instances.getGuestAttributes (e.g. roles/compute.viewer)") from error
    except gexc.GoogleAPIError as error:
        log.warning("guest attributes of %s: %s (asked again)", instance, error)
        return []
    keys = (public_key_line(item.key, item.value) for item in reply.query_value.items if item.namespace == NAMESPACE)
    return [key for key in keys if key]

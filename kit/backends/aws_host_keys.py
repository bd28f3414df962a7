"""AWS: an EC2 node's SSH host keys, as the EC2 API publishes them.

cloud-init's ``keys_to_console`` module prints the host keys the instance generated at first boot to
its serial console, between ``-----BEGIN SSH HOST KEY KEYS-----`` and ``-----END SSH HOST KEY KEYS-----``
(https://cloudinit.readthedocs.io/en/latest/reference/modules.html#keys-to-console), and
``GetConsoleOutput`` returns that console through the authenticated EC2 API
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GetConsoleOutput.html; ``Latest``: the
newest output, which Nitro instances give, instead of the buffer EC2 posts minutes after boot). The
console wraps long lines and can interleave other output, so the block is read token by token and each
key is accepted only when it parses whole (kit.remote.public_key_line).
"""

from __future__ import annotations

import logging

from kit.errors import KitError
from kit.remote import HOST_KEY_TYPES, public_key_line

log = logging.getLogger("kit.backends.aws_host_keys")

BEGIN, END = "-----BEGIN SSH HOST KEY KEYS-----", "-----END SSH HOST KEY KEYS-----"
_REFUSED = ("UnauthorizedOperation", "AuthFailure", "UnrecognizedClientException")
_WRAPPED_LINES = 16  # an RSA-4096 key of 716 characters over 80-column console lines is 9 pieces


def console_host_keys(text: str) -> list[str]:
    """The keys of the console's newest complete block ([] while there is none: not booted yet)."""
    start = text.rfind(BEGIN)  # the newest: an instance prints its keys again at each boot
    end = text.find(END, start) if start >= 0 else -1
    if end < 0:
        return []
    tokens = text[start + len(BEGIN):end].split()
    keys = []
    for i, token in enumerate(tokens):
        if token in HOST_KEY_TYPES:
            key = _joined(token, tokens[i + 1:i + 1 + _WRAPPED_LINES])
            if key:
                keys.append(key)
    return keys


def _joined(key_type: str, following: list[str]) -> str | None:
    """The key whose base64 the following tokens spell, joined across the console's line wraps: the
    shortest run of them that parses as a whole key of ``key_type``."""
    blob = ""
    for token in following:
        if token in HOST_KEY_TYPES:
            return None
        blob += token
        line = public_key_line(key_type, blob)
        if line:
            return line
    return None


def published_host_keys(region: str, instance_id: str, *, endpoint_url: str | None = None) -> list[str]:
    """The instance's host keys from its console output; [] while it printed none (yet)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.session.Session().client("ec2", region_name=region, endpoint_url=endpoint_url)
    try:
        try:
            reply = client.get_console_output(InstanceId=instance_id, Latest=True)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "UnsupportedOperation":
                raise
            reply = client.get_console_output(InstanceId=instance_id)  # not a Nitro instance: no Latest
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in _REFUSED:
            raise KitError(f"EC2 refused reading the console output of {instance_id}: {code}",
                           where=f"aws {region}/{instance_id}",
                           fix="grant ec2:GetConsoleOutput (kit reads the nodes' SSH host keys from it)") from error
        log.warning("console output of %s: %s (asked again)", instance_id, error)
        return []
    except BotoCoreError as error:
        log.warning("console output of %s: %s (asked again)", instance_id, error)
        return []
    # The API's Output is base64; botocore decodes it (its handler decode_console_output)
    return console_host_keys(reply.get("Output") or "")

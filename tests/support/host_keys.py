"""SSH host public keys for tests, in their wire format (RFC 4253 section 6.6: length-prefixed fields,
the first the key type's name), and the places clouds publish them: cloud-init's console block (EC2
GetConsoleOutput) and Google's guest attributes (``hostkeys/<type>``)."""
from __future__ import annotations

import base64
import hashlib
import struct
import subprocess
from pathlib import Path


def _field(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def ed25519_key(seed: str) -> str:
    """``"ssh-ed25519 <base64>"``, a well-formed key (32 bytes derived from ``seed``; no private half)."""
    blob = _field(b"ssh-ed25519") + _field(hashlib.sha256(seed.encode()).digest())
    return "ssh-ed25519 " + base64.b64encode(blob).decode()


def rsa_key(seed: str, bits: int = 3072) -> str:
    """``"ssh-rsa <base64>"`` with e = 65537 and an n of ``bits`` bits derived from ``seed``."""
    n = b"\x00" + (hashlib.sha512(seed.encode()).digest() * (bits // 512 + 1))[:bits // 8]
    blob = _field(b"ssh-rsa") + _field(b"\x01\x00\x01") + _field(n)
    return "ssh-rsa " + base64.b64encode(blob).decode()


def host_public_keys(root: Path) -> list[str]:
    """The ``<type> <base64>`` of each ``etc/ssh/ssh_host_*_key.pub`` under ``root``."""
    return sorted(" ".join(p.read_text().split()[:2]) for p in (Path(root) / "etc/ssh").glob("ssh_host_*_key.pub"))


def new_host_keys(root: Path) -> list[str]:
    """Replace the host keys under ``root`` with new ones, as an instance's first boot does (cloud-init,
    Google's guest agent): every host of one image would share the image's keys otherwise."""
    for old in (Path(root) / "etc/ssh").glob("ssh_host_*"):
        old.unlink()
    for kind in ("ed25519", "ecdsa"):
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "root@node",
                        "-f", str(Path(root) / f"etc/ssh/ssh_host_{kind}_key")], check=True)
    return host_public_keys(root)


def cloud_init_console(keys: list[str], *, width: int = 80, name: str = "node") -> str:
    """A console output as cloud-init prints the host keys (its keys_to_console module), with the
    fingerprints block before it, syslog prefixes, CRLF line ends, and the console's wrap at ``width``."""
    lines = ["[   12.345678] cloud-init[612]: Cloud-init v. 24.4 running 'modules:final'",
             "<14>Nov 28 23:10:01 ec2: #############################################################",
             "<14>Nov 28 23:10:01 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----",
             f"<14>Nov 28 23:10:01 ec2: 256 SHA256:AbCdEf root@{name} (ED25519)",
             "<14>Nov 28 23:10:01 ec2: -----END SSH HOST KEY FINGERPRINTS-----",
             "-----BEGIN SSH HOST KEY KEYS-----",
             *(f"{key} root@{name}" for key in keys),
             "-----END SSH HOST KEY KEYS-----",
             "[   13.000001] cloud-init[612]: Cloud-init v. 24.4 finished. Datasource DataSourceEc2Local."]
    wrapped = [line[i:i + width] for line in lines for i in range(0, max(len(line), 1), width)]
    return "\r\n".join(wrapped) + "\r\n"

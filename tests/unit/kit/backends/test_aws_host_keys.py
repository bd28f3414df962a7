"""kit.backends.aws_host_keys: an EC2 node's SSH host keys from cloud-init's block of its console output.

GetConsoleOutput runs against moto in server mode. moto answers every instance with one fixed kernel
log and no keys, so tests/support/moto.py's ``console_outputs`` gives an instance the console cloud-init
prints (tests/support/host_keys.py: fingerprints, then the keys block, syslog prefixes, CRLF, wrapped at
80 columns as a serial console is).
"""
from __future__ import annotations

import pytest

from kit.backends.aws_host_keys import console_host_keys, published_host_keys
from tests.support.host_keys import cloud_init_console, ed25519_key, rsa_key

REGION = "us-east-1"


def test_the_keys_block_is_read_across_the_consoles_line_wraps():
    keys = [ed25519_key("a"), rsa_key("a", bits=4096)]
    for width in (80, 64, 1000):
        assert console_host_keys(cloud_init_console(keys, width=width)) == keys


def test_only_a_complete_block_counts_and_the_newest_one_wins():
    old, new = [ed25519_key("first boot")], [ed25519_key("second boot")]
    booting = cloud_init_console(new)
    assert console_host_keys(booting[:booting.index("-----END SSH HOST KEY KEYS")]) == [], "not printed whole yet"
    assert console_host_keys("Linux version 6.8.0-1015-aws\r\n") == []
    assert console_host_keys(cloud_init_console(old) + cloud_init_console(new)) == new


def test_a_damaged_or_foreign_key_in_the_block_is_left_out():
    good = ed25519_key("good")
    text = cloud_init_console([good]).replace("-----END SSH HOST KEY KEYS-----",
                                              "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBrok root@x\r\n"
                                              "ssh-dss AAAAB3NzaC1kc3MAAACBAP root@x\r\n-----END SSH HOST KEY KEYS-----")
    assert console_host_keys(text) == [good]


@pytest.fixture
def ec2(monkeypatch):
    from tests.support.moto import moto_server

    with moto_server(monkeypatch, REGION) as url:
        import boto3

        client = boto3.client("ec2", region_name=REGION, endpoint_url=url)
        image = client.describe_images()["Images"][0]["ImageId"]
        iid = client.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        yield url, iid


def test_the_api_gives_the_keys_cloud_init_printed_and_nothing_before(ec2):
    from tests.support.moto import console_outputs

    url, iid = ec2
    keys = [ed25519_key(iid), rsa_key(iid)]
    with console_outputs({}) as outputs:
        assert published_host_keys(REGION, iid, endpoint_url=url) == [], "booting: a kernel log, no keys yet"
        outputs[iid] = cloud_init_console(keys)
        assert published_host_keys(REGION, iid, endpoint_url=url) == keys
        assert published_host_keys(REGION, "i-0123456789abcdef0", endpoint_url=url) == [], \
            "an unknown instance (EC2's InvalidInstanceID.NotFound) is asked again, not fatal"

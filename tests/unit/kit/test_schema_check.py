"""Rendered Terraform against the real provider schemas (offline), and the checker can fail."""

from __future__ import annotations

import pytest

from kit.paths import EXAMPLES_DIR
from kit.render import render
from kit.schema_check import check_file, check_tree
from kit.spec import load_spec, parse_spec

pytestmark = pytest.mark.usefixtures("example_key_home")  # the examples' ~/.ssh/id_ed25519.pub


@pytest.mark.parametrize("name", ["aws-g5-spot", "gcp-a3-spot"])
@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_rendered_examples_match_provider_schemas(tmp_path, name, market):
    from tests.support.files import switchable_spec

    render(switchable_spec(name) if market == "on-demand" else load_spec(EXAMPLES_DIR / f"{name}.yaml"),
           tmp_path, market=market)
    count, problems = check_tree(tmp_path)
    assert count >= 15 and problems == []


def test_gcp_existing_network_and_n1_variants(tmp_path):
    import yaml

    from tests.support.files import one_place

    data = one_place(yaml.safe_load((EXAMPLES_DIR / "gcp-a3-spot.yaml").read_text()))
    data["network"] = {"name": "default"}
    data["instance_type"], data["placement"] = "n1-standard-8", "none"
    render(parse_spec(data), tmp_path / "gcp")
    assert 'resource "google_compute_network"' not in (tmp_path / "gcp" / "cluster" / "main.tf").read_text()
    assert "nvidia-tesla-t4" in (tmp_path / "gcp" / "cluster" / "terraform.tfvars").read_text()
    assert check_tree(tmp_path / "gcp")[1] == []


BAD = {
    "unknown attribute": ('resource "aws_ebs_volume" "v" {\n  availability_zone = "a"\n  colour = "red"\n}\n',
                          "unknown attribute or block 'colour'"),
    "unknown block": ('resource "aws_instance" "i" {\n  sidecar {\n    x = 1\n  }\n}\n', "'sidecar'"),
    "computed-only set": ('resource "aws_instance" "i" {\n  public_ip = "1.2.3.4"\n}\n', "computed-only"),
    "missing required": ('resource "google_compute_disk" "d" {\n  zone = "z"\n}\n', "required attribute 'name'"),
    "missing required block": ('resource "google_compute_instance" "i" {\n  name = "n"\n  machine_type = "m"\n}\n',
                               "required block 'boot_disk'"),
    "nested unknown": ('resource "google_compute_instance" "i" {\n  scheduling {\n    spotty = true\n  }\n}\n',
                       "scheduling: unknown attribute or block 'spotty'"),
    "block repeated": ('resource "aws_instance" "i" {\n  metadata_options {\n  }\n  metadata_options {\n  }\n}\n',
                       "at most 1"),
    "dynamic unknown": (('resource "aws_instance" "i" {\n  dynamic "nope" {\n    for_each = []\n'
                        '    content {\n    }\n  }\n}\n'), "unknown dynamic block 'nope'"),
    "no schema": ('resource "aws_lambda_function" "f" {\n}\n', "no provider schema"),
    "remote state": ('data "terraform_remote_state" "d" {\n  backend = "local"\n}\n', "'config'"),
    "block as attribute": ('resource "aws_instance" "i" {\n  metadata_options = { http_tokens = "required" }\n}\n',
                           "'metadata_options' is a block, written as an attribute"),
    "attribute as block": ('resource "aws_instance" "i" {\n  tags {\n    a = "b"\n  }\n}\n',
                           "'tags' is an attribute, written as a block"),
    "word for bool": (('resource "aws_ebs_volume" "v" {\n  availability_zone = "a"\n'
                       '  encrypted = "yes"\n}\n'), "'encrypted' must be true or false"),
    "word for number": ('resource "aws_ebs_volume" "v" {\n  availability_zone = "a"\n  size = "big"\n}\n',
                        "'size' must be a number"),
    "scalar for list": ('resource "aws_instance" "i" {\n  vpc_security_group_ids = "sg-1"\n}\n',
                        "'vpc_security_group_ids' must be a set"),
}


def test_checker_accepts_terraform_conversions_and_expressions(tmp_path):
    path = tmp_path / "ok.tf"
    path.write_text('resource "aws_ebs_volume" "v" {\n  availability_zone = var.zone\n  size = "200"\n'
                    '  encrypted = "true"\n  tags = { a = "b" }\n  iops = var.iops\n}\n')
    assert check_file(path) == []


@pytest.mark.parametrize("case", sorted(BAD))
def test_checker_fails_on_bad_input(tmp_path, case):
    text, expected = BAD[case]
    path = tmp_path / "bad.tf"
    path.write_text(text)
    problems = check_file(path)
    assert any(expected in p for p in problems), problems


def test_checker_reports_unparsable(tmp_path):
    path = tmp_path / "broken.tf"
    path.write_text('resource "a" {\n')
    assert "does not parse" in check_file(path)[0]

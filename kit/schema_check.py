"""Offline check of Terraform files against the real provider schemas (kit/data/provider-schemas/).

Every ``resource`` and ``data`` block is parsed with python-hcl2 and compared with
``terraform providers schema -json`` output for its type: unknown attributes or blocks, setting a
computed-only attribute, a missing required attribute or block, or a block repeated beyond
``max_items`` are problems, and so are a block written as an attribute (``metadata_options = {...}``),
an attribute written as a block (``tags { ... }``) and a literal of the wrong type (``instance_type =
5``, ``encrypted = "yes"``; Terraform's own conversions such as ``"5"`` for a number are allowed).
``terraform_remote_state`` is Terraform's built-in data source (no
provider schema file); it is checked by hand for its two required arguments, and the built-in
``terraform_data`` resource against its documented arguments.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import hcl2

from kit.paths import PROVIDER_SCHEMAS_DIR

META_ARGS = {"count", "for_each", "depends_on", "provider", "lifecycle", "connection", "provisioner",
             "__is_block__", "__comments__", "__inline_comments__", "__start_line__", "__end_line__"}
PROVIDERS = {"aws": "aws", "google": "google"}
# Terraform's built-in provider (terraform.io/builtin/terraform) has no schema file here: its one
# managed resource, as documented ("The terraform_data Managed Resource Type", Terraform docs).
BUILTIN_RESOURCES = {
    "terraform_data": {"attributes": {
        "input": {"type": "dynamic", "optional": True},
        "triggers_replace": {"type": "dynamic", "optional": True},
        "output": {"type": "dynamic", "computed": True},
        "id": {"type": "string", "computed": True},
    }},
}


def _unquote(label: str) -> str:
    return label[1:-1] if len(label) >= 2 and label[0] == label[-1] == '"' else label


@cache
def schema_for(kind: str, rtype: str, root: str | None = None) -> dict | None:
    provider = PROVIDERS.get(rtype.split("_", 1)[0])
    if provider is None:
        return None
    base = Path(root) if root else PROVIDER_SCHEMAS_DIR
    path = base / provider / ("resource" if kind == "resource" else "data") / f"{rtype}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())["block"]


def _is_block(value: Any) -> bool:
    """python-hcl2 marks ``name { ... }`` blocks with ``__is_block__``; ``name = {...}`` is a plain map."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) and v.get("__is_block__")
                                                         for v in value)


def _literal_type_problem(value: Any, type_: Any) -> str | None:
    """A literal that Terraform cannot convert to the attribute's type (expressions are not judged)."""
    if isinstance(value, str) and "${" in value:
        return None  # an expression: its type is known only to Terraform
    text = value[1:-1] if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"' else None
    kind = type_ if isinstance(type_, str) else (type_[0] if isinstance(type_, list) and type_ else None)
    if kind == "string" and isinstance(value, (list, dict)):
        return "a string"
    if kind == "number":
        if isinstance(value, (bool, list, dict)):
            return "a number"
        if text is not None:
            try:
                float(text)
            except ValueError:
                return "a number"
    if kind == "bool":
        if isinstance(value, (int, float, list, dict)) and not isinstance(value, bool):
            return "true or false"
        if text is not None and text not in ("true", "false"):
            return "true or false"
    if kind in ("list", "set", "map", "object") and (isinstance(value, (bool, int, float)) or text is not None):
        return f"a {kind}"
    return None


def _check_block(body: dict[str, Any], block: dict, where: str, problems: list[str]) -> None:
    """``body`` (one block as python-hcl2 reads it) against its provider schema ``block``."""
    attrs = block.get("attributes", {})
    blocks = block.get("block_types", {})
    present: Counter[str] = Counter()  # nested blocks given, by name
    for key, value in body.items():
        if key in META_ARGS:
            continue
        if key == "dynamic":
            _check_dynamic(value, blocks, where, problems, present)
        elif key in attrs:
            _check_attribute(key, value, attrs[key], where, problems)
        elif key in blocks:
            _check_nested(key, value, blocks[key], where, problems, present)
        else:
            problems.append(f"{where}: unknown attribute or block {key!r}")
    problems += [f"{where}: required attribute {name!r} is missing"
                 for name, a in attrs.items() if a.get("required") and name not in body]
    problems += [f"{where}: required block {name!r} is missing"
                 for name, spec in blocks.items() if (spec.get("min_items") or 0) > 0 and not present[name]]


def _check_dynamic(value: list, blocks: dict, where: str, problems: list[str], present: Counter[str]) -> None:
    for dyn in value:
        for label, spec in dyn.items():
            name = _unquote(label)
            if name not in blocks:
                problems.append(f"{where}: unknown dynamic block {name!r}")
                continue
            present[name] += 1
            for content in spec.get("content", []):
                _check_block(content, blocks[name]["block"], f"{where}.{name}", problems)


def _check_attribute(key: str, value: Any, a: dict, where: str, problems: list[str]) -> None:
    if _is_block(value):
        problems.append(f"{where}: {key!r} is an attribute, written as a block (use `{key} = ...`)")
        return
    wanted = _literal_type_problem(value, a.get("type"))
    if wanted:
        problems.append(f"{where}: {key!r} must be {wanted} (got {value!r})")
    if a.get("computed") and not a.get("optional") and not a.get("required"):
        problems.append(f"{where}: {key!r} is computed-only and cannot be set")
    if a.get("deprecated"):
        problems.append(f"{where}: {key!r} is deprecated in the provider")


def _check_nested(key: str, value: Any, spec: dict, where: str, problems: list[str], present: Counter[str]) -> None:
    if not _is_block(value):
        problems.append(f"{where}: {key!r} is a block, written as an attribute (use `{key} {{ ... }}`)")
        return
    items = [i for i in value if isinstance(i, dict)]
    present[key] += len(items)
    max_items = spec.get("max_items") or (1 if spec.get("nesting_mode") == "single" else 0)
    if max_items and len(items) > max_items:
        problems.append(f"{where}: block {key!r} given {len(items)} times (at most {max_items})")
    for item in items:
        _check_block(item, spec["block"], f"{where}.{key}", problems)


def check_file(path: str | Path, schemas_root: str | Path | None = None) -> list[str]:
    path = Path(path)
    try:
        with path.open() as fh:
            doc = hcl2.load(fh)
    except Exception as error:  # noqa: BLE001 - any parse failure is a problem to report
        return [f"{path}: does not parse as HCL: {error}"]
    problems: list[str] = []
    root = str(schemas_root) if schemas_root else None
    for kind in ("resource", "data"):
        for entry in doc.get(kind, []):
            for rtype_q, named in entry.items():
                rtype = _unquote(rtype_q)
                for name_q, body in named.items():
                    where = f"{path}: {kind}.{rtype}.{_unquote(name_q)}"
                    if kind == "data" and rtype == "terraform_remote_state":
                        for required in ("backend", "config"):
                            if required not in body:
                                problems.append(f"{where}: required attribute {required!r} is missing")
                        continue
                    block = BUILTIN_RESOURCES.get(rtype) if kind == "resource" else None
                    block = block or schema_for(kind, rtype, root)
                    if block is None:
                        problems.append(f"{where}: no provider schema for {rtype} (add it to provider-schemas/)")
                        continue
                    _check_block(body, block, where, problems)
    return problems


def check_tree(directory: str | Path, schemas_root: str | Path | None = None) -> tuple[int, list[str]]:
    """(number of .tf files checked, problems) for every .tf file under directory."""
    files = sorted(p for p in Path(directory).rglob("*.tf") if ".terraform" not in p.parts)
    problems: list[str] = []
    for path in files:
        problems += check_file(path, schemas_root)
    return len(files), problems

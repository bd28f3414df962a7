"""What a plan will do, for the people who review it: every resource address with its action, the
attributes that force a replacement, and what the cluster costs per hour now and after.

Built from ``terraform show -json PLAN`` (the documented JSON plan representation: ``resource_changes[]``
with ``address``, ``type``, ``change.actions``, ``change.replace_paths`` and ``action_reason``).
``kit plan`` prints it as text or as Markdown for a pull-request comment.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

SYMBOLS = {("create",): "+", ("delete",): "-", ("update",): "~", ("delete", "create"): "-/+",
           ("create", "delete"): "+/-"}
VERBS = {"+": "create", "-": "destroy", "~": "update", "-/+": "replace", "+/-": "replace"}
# Terraform's action_reason values (JSON plan representation) in the words a reviewer needs.
REASONS = {
    "replace_because_cannot_update": "an attribute that cannot change in place",
    "replace_because_tainted": "the resource is tainted",
    "replace_by_request": "-replace was requested",
    "replace_by_triggers": "lifecycle.replace_triggered_by",
}
INSTANCE_TYPES = ("aws_instance", "google_compute_instance")
DISK_TYPES = ("aws_ebs_volume", "google_compute_disk")  # the data disks (kit.terraform's guard)


def _path(steps) -> str:
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


@dataclass(frozen=True)
class Change:
    root: str
    address: str
    type: str
    actions: tuple[str, ...]
    replace_paths: tuple[str, ...] = ()
    reason: str | None = None

    @property
    def symbol(self) -> str:
        return SYMBOLS.get(self.actions, "?")

    @property
    def verb(self) -> str:
        return VERBS.get(self.symbol, "/".join(self.actions))

    @property
    def why(self) -> str:
        """For a replacement: the attributes (or the rule) that force it."""
        if self.verb != "replace":
            return ""
        if self.replace_paths:
            return "forced by " + ", ".join(self.replace_paths)
        return "forced by " + REASONS.get(self.reason or "", self.reason or "the provider")

    @classmethod
    def from_plan(cls, root: str, item: dict) -> Change:
        change = item.get("change") or {}
        return cls(root=root, address=item.get("address", "?"), type=item.get("type", "?"),
                   actions=tuple(change.get("actions") or ()),
                   replace_paths=tuple(_path(p) for p in change.get("replace_paths") or ()),
                   reason=item.get("action_reason"))


def changes_of(root: str, plan_json: dict) -> list[Change]:
    """Every managed resource the plan creates, updates, replaces or destroys (no-ops and data
    source reads left out), in address order."""
    out = [Change.from_plan(root, item) for item in plan_json.get("resource_changes") or []
           if item.get("mode", "managed") == "managed"]
    return sorted((c for c in out if c.actions not in (("no-op",), ("read",), ())), key=lambda c: c.address)


@dataclass(frozen=True)
class HourlyCost:
    """Instances per market now and after the plan, at the spec's (or the catalog's) prices."""

    spot_per_hour: float
    on_demand_per_hour: float
    before: dict[str, int]
    after: dict[str, int]

    def _dollars(self, nodes: dict[str, int]) -> float:
        return nodes.get("spot", 0) * self.spot_per_hour + nodes.get("on-demand", 0) * self.on_demand_per_hour

    @staticmethod
    def _nodes(nodes: dict[str, int]) -> str:
        return ", ".join(f"{n} {market}" for market, n in sorted(nodes.items()) if n) or "no instances"

    def text(self) -> str:
        return (f"cost per hour (spot ${self.spot_per_hour:,.2f}, on-demand ${self.on_demand_per_hour:,.2f} per node): "
                f"now ${self._dollars(self.before):,.2f}/h ({self._nodes(self.before)}), "
                f"after ${self._dollars(self.after):,.2f}/h ({self._nodes(self.after)})")


def hourly_cost(prices: tuple[float | None, float | None], nodes: int, market: str,
                deployed: list[dict]) -> HourlyCost:
    """``prices``: spot and on-demand $/h per node; ``deployed``: the cluster's ``nodes`` output
    before the plan (each with the market it really runs on); after it, ``nodes`` run on ``market``."""
    before = Counter(str(node.get("market") or "on-demand") for node in deployed)
    spot, on_demand = prices
    return HourlyCost(spot_per_hour=float(spot or 0), on_demand_per_hour=float(on_demand or 0),
                      before=dict(before), after={market: nodes})


@dataclass
class PlanSummary:
    changes: list[Change] = field(default_factory=list)
    # roots planned before the disks they attach exist (first deployment, more nodes): shown here with
    # the disk ids pending; `kit apply` plans them again once the disks exist and applies only a plan
    # with exactly these changes
    previews: list[str] = field(default_factory=list)
    cost: HourlyCost | None = None
    warnings: list[str] = field(default_factory=list)  # what else the reviewer must know (e.g. wide SSH rules)

    @property
    def totals(self) -> dict[str, int]:
        """As Terraform counts them: a replacement is one to add and one to destroy."""
        total: Counter[str] = Counter()
        for c in self.changes:
            total["add"] += "create" in c.actions
            total["change"] += "update" in c.actions
            total["destroy"] += "delete" in c.actions
        return {k: total.get(k, 0) for k in ("add", "change", "destroy")}

    @property
    def replaced(self) -> list[Change]:
        return [c for c in self.changes if c.verb == "replace"]

    def move_line(self, before: str | None, after: str, *, bucket: bool) -> str | None:
        """What a move to zone ``after`` does, in one line ("moving from us-central1-a to us-east4-b: 4
        nodes replaced, 4 disks created, checkpoint restored from bucket"); None when the zone stays."""
        if before is None or before == after:
            return None
        nodes = sum(1 for c in self.changes if c.type in INSTANCE_TYPES and "create" in c.actions)
        disks = sum(1 for c in self.changes if c.type in DISK_TYPES and "create" in c.actions)
        source = "checkpoint restored from bucket" if bucket else "no checkpoint bucket: the job restarts from step 0"
        return f"moving from {before} to {after}: {nodes} nodes replaced, {disks} disks created, {source}"

    def _headline(self) -> str:
        t = self.totals
        return f"Plan: {t['add']} to add, {t['change']} to change, {t['destroy']} to destroy."

    def _notes(self) -> list[str]:
        notes = [f"{root}: planned before the disks it attaches exist (their ids show as pending); `kit apply` "
                 "plans it again once they do and applies it only if it makes exactly these changes"
                 for root in self.previews]
        instances = [c for c in self.replaced if c.type in INSTANCE_TYPES]
        if instances:
            notes.append(f"{len(instances)} instance(s) replaced: the trainers save on shutdown and resume on the "
                         "new instances from the data disks, which are kept")
        return notes + ([self.cost.text()] if self.cost else []) + [f"warning: {w}" for w in self.warnings]

    def text(self) -> str:
        lines = [f"{c.symbol:>3} {c.root:8} {c.address}" + (f"  ({c.why})" if c.why else "") for c in self.changes]
        return "\n".join([*lines, self._headline(), *self._notes()])

    def markdown(self) -> str:
        lines = ["| action | root | resource | why |", "| --- | --- | --- | --- |"]
        lines += [f"| {c.verb} | {c.root} | `{c.address}` | {c.why} |" for c in self.changes]
        return "\n".join([*lines, "", f"**{self._headline()}**", *[f"\n_{n}_" for n in self._notes()]])

"""The plan summary's line for a move (kit.plan_summary.PlanSummary.move_line)."""
from __future__ import annotations

from kit.plan_summary import Change, PlanSummary


def test_a_move_says_where_from_and_to_what_is_replaced_and_created_and_where_the_checkpoint_comes_from():
    changes = [Change("cluster", f"module.instances.google_compute_instance.node[{i}]", "google_compute_instance",
                      ("delete", "create")) for i in range(4)]
    changes += [Change("disks-us-east4-b-4xa3-highgpu-1g", f"module.disks.google_compute_disk.this[{i}]",
                       "google_compute_disk", ("create",)) for i in range(4)]
    summary = PlanSummary(changes=changes)
    assert summary.move_line("us-central1-a", "us-east4-b", bucket=True) == (
        "moving from us-central1-a to us-east4-b: 4 nodes replaced, 4 disks created, checkpoint restored from bucket")
    assert "restarts from step 0" in summary.move_line("us-central1-a", "us-east4-b", bucket=False)
    assert summary.move_line("us-east4-b", "us-east4-b", bucket=True) is None  # no move: a switch or a recovery
    assert summary.move_line(None, "us-east4-b", bucket=True) is None  # the first launch

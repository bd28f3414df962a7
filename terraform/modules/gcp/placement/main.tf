# Compact placement: the VMs close together on a low-latency network (A2/A3/G2).
# No vm_count: with it, GCP requires exactly that many VMs, created together, so one preempted VM
# could not be recreated alone and changing `nodes` would fail. Google "does not recommend that you
# use this field unless ... you want your policy to work only if it contains this exact number of
# VMs" (Compute API, ResourcePolicyGroupPlacementPolicy.vm_count); the Cluster Toolkit's vm-instance
# README recommends leaving it unset too.
# One policy per zone: a compact policy "places compute instances close to each other in a zone"
# (https://cloud.google.com/compute/docs/instances/placement-policies-overview), so VMs of two zones
# under one policy are not what it promises. The zone is in the name (63 characters at most: 31 of the
# cluster, 7, and 25 of the longest zone name): a move replaces the policy, after the VMs that use it
# (a policy in use cannot be deleted) and before their successors. Policies cost nothing.
resource "google_compute_resource_policy" "this" {
  count   = var.enabled ? 1 : 0
  name    = "${var.cluster_name}-place-${var.zone}"
  project = var.project
  region  = var.region

  group_placement_policy {
    collocation = "COLLOCATED"
  }
}

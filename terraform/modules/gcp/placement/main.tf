# Compact placement: the VMs close together on a low-latency network (A2/A3/G2).
# No vm_count: with it, GCP requires exactly that many VMs, created together, so one preempted VM
# could not be recreated alone and changing `nodes` would fail. Google "does not recommend that you
# use this field unless ... you want your policy to work only if it contains this exact number of
# VMs" (Compute API, ResourcePolicyGroupPlacementPolicy.vm_count); the Cluster Toolkit's vm-instance
# README recommends leaving it unset too.
resource "google_compute_resource_policy" "this" {
  count   = var.enabled ? 1 : 0
  name    = "${var.cluster_name}-placement"
  project = var.project
  region  = var.region

  group_placement_policy {
    collocation = "COLLOCATED"
  }
}

# Compact placement: all VMs close together (A2/A3). vm_count must equal the number of VMs using it.
resource "google_compute_resource_policy" "this" {
  count   = var.enabled ? 1 : 0
  name    = "${var.cluster_name}-placement"
  project = var.project
  region  = var.region

  group_placement_policy {
    collocation = "COLLOCATED"
    vm_count    = var.nodes
  }
}

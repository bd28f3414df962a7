# One data disk per node, encrypted at rest (Google-managed key, or CMEK when given). Applied from
# its own root module (own state) so a market switch or instance replacement never plans to touch it.
# prevent_destroy is the second guard; `kit destroy --with-disks` lifts it with an override file.
resource "google_compute_disk" "this" {
  count   = var.nodes
  name    = "${var.cluster_name}${var.name_suffix}-disk-${count.index}"
  project = var.project
  zone    = var.zone
  size    = var.size_gb
  type    = var.disk_type
  labels  = merge(var.labels, { "kit-node" = tostring(count.index), "kit-role" = "data-disk" })

  dynamic "disk_encryption_key" {
    for_each = var.kms_key_self_link == null ? [] : [1]
    content {
      kms_key_self_link = var.kms_key_self_link
    }
  }

  lifecycle {
    prevent_destroy = true
  }
}

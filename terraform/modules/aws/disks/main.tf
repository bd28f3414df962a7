# One encrypted data volume per node. This module is applied from its own root module (own state),
# so nothing the instances root does (market switch, instance replacement) can plan to touch it.
# prevent_destroy is the second guard; `kit destroy --with-disks` lifts it with an override file.
resource "aws_ebs_volume" "this" {
  count             = var.nodes
  availability_zone = var.availability_zone
  size              = var.size_gb
  type              = var.volume_type
  encrypted         = true
  kms_key_id        = var.kms_key_id
  tags = merge(var.tags, {
    Name       = "${var.cluster_name}${var.name_suffix}-disk-${count.index}"
    "kit:node" = tostring(count.index)
    "kit:role" = "data-disk"
  })

  lifecycle {
    prevent_destroy = true
  }
}

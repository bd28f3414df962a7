# One cluster placement group: all nodes on the same low-latency network spine (NCCL / EFA).
resource "aws_placement_group" "this" {
  count    = var.enabled ? 1 : 0
  name     = "${var.cluster_name}-pg"
  strategy = "cluster"
  tags     = var.tags
}

# One cluster placement group per Availability Zone: all nodes on the same low-latency network spine
# (NCCL / EFA). "A cluster placement group is a logical grouping of instances within a single
# Availability Zone" (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html):
# while it holds instances of one zone, a launch into it from another fails
# (InvalidPlacementGroup.InUse). The zone is in the name, so a move replaces the group, and the
# instances that reference it are destroyed before it and created after its successor.
resource "aws_placement_group" "this" {
  count    = var.enabled ? 1 : 0
  name     = "${var.cluster_name}-pg-${var.availability_zone}"
  strategy = "cluster"
  tags     = var.tags
}

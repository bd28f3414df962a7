output "nodes" {
  description = "One object per node in rank order: name, instance_id, private_ip, public_ip, disk_id, zone, market (as EC2 reports it: instance_lifecycle)."
  value = [for i, node in aws_instance.node : {
    name        = node.tags["Name"]
    instance_id = node.id
    private_ip  = node.private_ip
    public_ip   = node.public_ip
    disk_id     = var.disk_ids[i]
    zone        = var.availability_zone
    # What the instance really runs on, not what was asked: EC2's InstanceLifecycle is "spot" for
    # spot instances and empty for on-demand ones.
    market = node.instance_lifecycle == "spot" ? "spot" : "on-demand"
  }]
}

output "security_group_id" {
  description = "The cluster security group."
  value       = aws_security_group.this.id
}

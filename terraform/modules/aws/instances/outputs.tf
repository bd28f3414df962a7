output "nodes" {
  description = "One object per node in rank order: name, instance_id, private_ip, public_ip, disk_id, zone, market."
  value = [for i, node in aws_instance.node : {
    name        = node.tags["Name"]
    instance_id = node.id
    private_ip  = node.private_ip
    public_ip   = node.public_ip
    disk_id     = var.disk_ids[i]
    zone        = var.availability_zone
    market      = var.market
  }]
}

output "security_group_id" {
  description = "The cluster security group."
  value       = aws_security_group.this.id
}

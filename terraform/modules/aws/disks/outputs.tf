output "disk_ids" {
  description = "Volume ids in node-rank order."
  value       = aws_ebs_volume.this[*].id
}

output "zone" {
  description = "Zone the volumes live in."
  value       = var.availability_zone
}

output "name" {
  description = "Placement group name, or null when placement is off."
  value       = var.enabled ? aws_placement_group.this[0].name : null
}

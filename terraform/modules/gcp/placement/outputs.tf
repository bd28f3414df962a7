output "self_link" {
  description = "Resource policy self link, or null when placement is off."
  value       = var.enabled ? google_compute_resource_policy.this[0].self_link : null
}

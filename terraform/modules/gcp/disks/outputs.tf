output "disk_ids" {
  description = "Disk self links in node-rank order."
  value       = google_compute_disk.this[*].self_link
}

output "zone" {
  description = "Zone the disks live in."
  value       = var.zone
}

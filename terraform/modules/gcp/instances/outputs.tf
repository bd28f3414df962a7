output "nodes" {
  description = "One object per node in rank order: name, instance_id, private_ip, public_ip, disk_id, zone, market (as the Compute API reports it: provisioning_model)."
  value = [for i, node in google_compute_instance.node : {
    name        = node.name
    instance_id = node.instance_id
    private_ip  = node.network_interface[0].network_ip
    public_ip   = try(node.network_interface[0].access_config[0].nat_ip, null)
    disk_id     = var.disk_ids[i]
    zone        = var.zone
    # What the VM really runs on, as the Compute API reports it (scheduling.provisioningModel).
    market = node.scheduling[0].provisioning_model == "SPOT" ? "spot" : "on-demand"
  }]
}

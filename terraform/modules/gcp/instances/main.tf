locals {
  spot  = var.market == "spot"
  nodes = [for i in range(var.nodes) : "${var.cluster_name}-node-${i}"]
}

# Every market change, and a new placement policy, replaces every VM (replace_triggered_by below):
# a VM moves between SPOT and STANDARD, or into a new compact policy, only by being created again.
resource "terraform_data" "market" {
  input = var.market
}

resource "terraform_data" "placement" {
  input = var.resource_policy
}

# Members talk to each other on every port (NCCL, torchrun rendezvous); SSH only from allowed_cidrs.
resource "google_compute_firewall" "internal" {
  name        = "${var.cluster_name}-internal"
  project     = var.project
  network     = var.network
  description = "kit cluster ${var.cluster_name}: all traffic between members"
  direction   = "INGRESS"
  source_tags = ["kit-${var.cluster_name}"]
  target_tags = ["kit-${var.cluster_name}"]

  allow {
    protocol = "all"
  }
}

resource "google_compute_firewall" "ssh" {
  name          = "${var.cluster_name}-ssh"
  project       = var.project
  network       = var.network
  description   = "kit cluster ${var.cluster_name}: SSH from the allowed CIDRs"
  direction     = "INGRESS"
  source_ranges = var.allowed_cidrs
  target_tags   = ["kit-${var.cluster_name}"]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# The nodes' identity when the job has a checkpoint bucket: a service account of their own (not the
# project's default compute account), with roles/storage.objectUser on the bucket (read, write,
# delete and list objects; no bucket administration).
resource "google_service_account" "node" {
  count        = var.checkpoint_bucket == null ? 0 : 1
  project      = var.project
  account_id   = "${substr(var.cluster_name, 0, 25)}-node"
  display_name = "kit ${var.cluster_name} nodes"
  description  = "kit nodes of cluster ${var.cluster_name}: write checkpoints to gs://${coalesce(var.checkpoint_bucket, "-")}"
}

resource "google_storage_bucket_iam_member" "checkpoints" {
  count  = var.checkpoint_bucket == null ? 0 : 1
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.node[0].email}"
}

resource "google_compute_instance" "node" {
  count                     = var.nodes
  name                      = local.nodes[count.index]
  project                   = var.project
  zone                      = var.zone
  machine_type              = var.machine_type
  tags                      = ["kit-${var.cluster_name}"]
  resource_policies         = var.resource_policy == null ? null : [var.resource_policy]
  allow_stopping_for_update = true
  # A preempted Spot VM is STOPPED (TERMINATED status), keeping its id and disks. The provider
  # reads the real status back into desired_status, so the next apply (kit watch's re-apply)
  # starts it again instead of reporting "no changes".
  desired_status = "RUNNING"
  labels         = merge(var.labels, { "kit-node" = tostring(count.index), "kit-market" = var.market })

  boot_disk {
    auto_delete = true
    initialize_params {
      image = var.image
      size  = var.boot_disk_size_gb
      type  = "pd-balanced"
    }
  }

  # The data disk lives in the disks root module; the instance only attaches it.
  attached_disk {
    source      = var.disk_ids[count.index]
    device_name = "kit-data"
    mode        = "READ_WRITE"
  }

  # nic_type GVNIC where the machine type needs it for its bandwidth (A3: "A3 machine types
  # require gVNIC", GCP docs "Using Google Virtual NIC"); null keeps the provider's default.
  # The external address is for SSH from allowed_cidrs (the firewall rule) and for egress.
  network_interface {
    network    = var.network
    subnetwork = var.subnetwork
    nic_type   = var.nic_type
    access_config {}
  }

  dynamic "guest_accelerator" {
    for_each = var.guest_accelerator == null ? [] : [var.guest_accelerator]
    content {
      type  = guest_accelerator.value.type
      count = guest_accelerator.value.count
    }
  }

  # GPUs cannot live-migrate: TERMINATE on host maintenance. Spot VMs stop (disk kept) when
  # preempted; instance_termination_action is set only for SPOT (GCP rejects it for STANDARD).
  # automatic_restart must be false for Spot and with a compact placement policy (as in the
  # Cluster Toolkit's vm-instance module); kit's watcher restarts stopped nodes instead.
  # The checkpoint bucket: the nodes' own service account (below), with the cloud-platform scope and
  # access granted by IAM roles alone, as GCP recommends ("Service accounts" best practices).
  dynamic "service_account" {
    for_each = var.checkpoint_bucket == null ? [] : [1]
    content {
      email  = google_service_account.node[0].email
      scopes = ["https://www.googleapis.com/auth/cloud-platform"]
    }
  }

  scheduling {
    provisioning_model          = local.spot ? "SPOT" : "STANDARD"
    preemptible                 = local.spot
    automatic_restart           = !local.spot && var.resource_policy == null
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = local.spot ? "STOP" : null
  }

  # OS Login (os_login = true): the users' own Google identities and the keys registered with them;
  # no metadata key (OS Login ignores them). Works under the organisation policy
  # compute.requireOsLogin. Without it: the cluster's one key for ssh_user. Project-wide keys are
  # blocked either way.
  # Guest attributes on: the guest agent publishes the VM's SSH host keys there (hostkeys/), and kit
  # connects only to those keys (https://cloud.google.com/compute/docs/metadata/manage-guest-attributes).
  metadata = {
    enable-oslogin          = var.os_login ? "TRUE" : "FALSE"
    ssh-keys                = var.os_login ? "" : "${var.ssh_user}:${trimspace(var.ssh_public_key)}"
    block-project-ssh-keys  = "true"
    serial-port-enable      = "false"
    enable-guest-attributes = "TRUE"
    shutdown-script         = file("${path.module}/shutdown.sh")
  }

  shielded_instance_config {
    enable_integrity_monitoring = true
    enable_vtpm                 = true
  }

  lifecycle {
    replace_triggered_by = [terraform_data.market, terraform_data.placement]
  }
}
